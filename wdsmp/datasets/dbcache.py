"""DBCache: the first ``size`` samples of any iterable, kept in an SQLite database.

``DBCache(dataset, "cache.db", 1000)`` (or ``dataset.compose(wds.DBCache,
"cache.db", 1000)``) reads samples from ``dataset`` and stores each new one
until ``size`` are stored; the pass then ends. From then on, and after a
restart (a new DBCache on the same file), every pass serves the stored samples
from the database without touching ``dataset``. If ``dataset`` runs out first,
what was stored is the whole cache: the database records that the source was
exhausted, and it too is served from then on. Delete the file to rebuild.

A pass that stops early (the consumer breaks out) keeps what it stored; the
next pass reads the source again from its start, storing the samples not yet
stored and passing the others through.

Samples are stored under the value of their ``key`` field (``__key__``), with
the shard they came from (``__url__``) when they have one, as shards written
apart often reuse keys; or under a hash of their stored bytes when they have no
key (tuples, decoded samples without keys): a sample already stored is not
stored twice. The file records its format's version, and a file of another
version (or none) is refused, naming both, never served as if current. They are stored
in a format whose reading runs no code (:mod:`wdsmp.formats.samplecodec`: what samples
are made of, bytes, numbers, text, containers, arrays, tensors, images); a
sample holding other objects is pickled, as webdataset's DBCache pickles every
sample, and files written so are read back. Under
``WDS_SECURE=1`` nothing is pickled or unpickled: such a sample, or a file
holding pickles, is a ValueError, so a cache file from elsewhere cannot run
code.

Several processes can share one file: the database uses SQLite's WAL journal
(readers never block the writer) and a busy timeout, every insert is its own
transaction, and an insert only happens while fewer than ``size`` samples are
stored, so the cap holds across processes. Each process opens its own
connection when it first iterates (a DBCache pickles without it, for spawned
DataLoader workers). Serving from the database inside DataLoader workers, each
worker gets every ``num_workers``-th sample, so an epoch has each stored
sample once, not once per worker.
"""

import hashlib
import os
import sqlite3
import sys
from typing import Any, Dict, Iterable, Iterator, Optional, Union

from torch.utils.data import IterableDataset, get_worker_info

from ..formats.samplecodec import SampleCodec
from .._internal.validation import is_int
from .._internal.versions import check_version

__all__ = ["DBCache"]

_SCHEMA = (
    # ids are 1, 2, 3, ...: rows are never deleted and an ignored insert takes no id,
    # so max(id) is the number of rows, found in O(log n).
    "CREATE TABLE IF NOT EXISTS samples (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,"
    " data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
_COUNT = "SELECT coalesce(max(id), 0) FROM samples"
_INSERT = ("INSERT OR IGNORE INTO samples (key, data) SELECT ?, ? "
           "WHERE (SELECT coalesce(max(id), 0) FROM samples) < ?")
_EXHAUSTED = "exhausted"
# The file's format and version, in the meta table: version 1 keys samples by their key within their shard.
_FORMAT, _VERSION = "wdsmp.DBCache", 1


class DBCache(IterableDataset):
    """Samples of ``dataset`` cached in the SQLite file ``fname``, up to ``size``.

    ``fname=None`` passes ``dataset`` through untouched (an easy switch).
    ``verbose`` prints what the cache does on stderr. ``key`` names the field
    that identifies a sample. ``shuffle`` serves stored samples in a random
    order each pass (else in the order they were stored). ``timeout`` is how
    long, in seconds, an insert waits for another process's write to finish.
    """

    def __init__(self, dataset: Iterable[Any], fname: Optional[Union[str, "os.PathLike[str]"]], size: int,
                 verbose: bool = True, key: str = "__key__", shuffle: bool = False, timeout: float = 60.0) -> None:
        super().__init__()
        if fname is not None and not is_int(size, 1):
            raise ValueError(f"size must be a positive number of samples, not {size!r}")
        self.dataset = dataset
        self.fname = None if fname is None else os.fspath(fname)
        self.size = size
        self.verbose = verbose
        self.key = key
        self.shuffle = shuffle
        self.timeout = timeout
        self._db: Optional[sqlite3.Connection] = None
        self._pid: Optional[int] = None
        self._codec = SampleCodec(f"DBCache {self.fname!r}")
        if self.fname is not None:
            self._say(f"[DBCache opened {self.fname} size {size} total {self._count(self._connect())}]")

    def _say(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr, flush=True)

    def _connect(self) -> sqlite3.Connection:
        """This process's connection (a forked or spawned copy opens its own)."""
        if self._db is None or self._pid != os.getpid():
            assert self.fname is not None  # DBCache(fname=None) never connects
            try:
                db = sqlite3.connect(self.fname, timeout=self.timeout, isolation_level=None,
                                     check_same_thread=False)
            except sqlite3.Error as exn:
                raise type(exn)(f"DBCache {self.fname!r}: {exn}") from exn
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a crash loses the last inserts
                for statement in _SCHEMA:
                    db.execute(statement)
                self._check_version(db)
            except sqlite3.Error as exn:
                db.close()
                raise type(exn)(f"DBCache {self.fname!r}: {exn}") from exn
            except ValueError:
                db.close()
                raise
            self._db, self._pid = db, os.getpid()
        return self._db

    def _check_version(self, db: sqlite3.Connection) -> None:
        """Stamp a new file with the format's version; ValueError for a file of another version,
        or one that holds samples and no version (not written by this format)."""
        query = "SELECT name, value FROM meta WHERE name IN ('format', 'version')"
        found = dict(db.execute(query).fetchall())
        if not found:
            db.execute("BEGIN IMMEDIATE")  # one process at a time looks again and stamps
            try:
                found = dict(db.execute(query).fetchall())
                if not found and not self._count(db):
                    db.executemany("INSERT INTO meta (name, value) VALUES (?, ?)",
                                   [("format", _FORMAT), ("version", str(_VERSION))])
                    found = {"format": _FORMAT, "version": str(_VERSION)}
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        version = found.get("version")
        number = int(str(version)) if str(version).isdigit() else version
        check_version({"format": found.get("format"), "version": number},
                      _FORMAT, (_VERSION,), f"DBCache {self.fname!r} (delete the file to rebuild it)")

    @staticmethod
    def _count(db: sqlite3.Connection) -> int:
        return db.execute(_COUNT).fetchone()[0]

    def _complete(self, db: sqlite3.Connection, total: int) -> bool:
        if total >= self.size:
            return True
        row = db.execute("SELECT value FROM meta WHERE name = ?", (_EXHAUSTED,)).fetchone()
        return row is not None

    def _sample_key(self, sample: Any, data: bytes) -> str:
        """The sample's identity: its key within its shard (``__url__``, when it has one),
        else a hash of its stored bytes."""
        value = sample.get(self.key) if isinstance(sample, dict) else None
        if value is None:
            return "sha256:" + hashlib.sha256(data).hexdigest()
        value = value if isinstance(value, str) else repr(value)
        url = sample.get("__url__")
        return value if url is None else repr((str(url), value))

    def __iter__(self) -> Iterator[Any]:
        if self.fname is None:
            yield from self.dataset
            return
        db = self._connect()
        total = self._count(db)
        if self._complete(db, total):
            yield from self._stored(db, total)
            return
        self._say(f"[DBCache total {total} size {self.size} more caching]")
        for sample in self.dataset:
            data = self._codec.dumps(sample)
            stored = db.execute(_INSERT, (self._sample_key(sample, data), data, self.size)).rowcount
            total = self._count(db)  # other processes may be filling it too
            if stored or total < self.size:
                yield sample
            if total >= self.size:
                break
        else:
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_EXHAUSTED, str(total)))
        self._say(f"[DBCache finished caching total {total} (size {self.size})]")

    def _stored(self, db: sqlite3.Connection, total: int) -> Iterator[Any]:
        """The stored samples; a DataLoader worker's share of them."""
        self._say(f"[DBCache starting dbiter total {total} size {self.size}]")
        query, args = "SELECT data FROM samples WHERE id <= ?", [self.size]
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            query += " AND id % ? = ?"
            args += [worker.num_workers, worker.id]
        query += " ORDER BY random()" if self.shuffle else " ORDER BY id"
        for (data,) in db.execute(query, args):
            yield self._codec.loads(data)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_db"] = state["_pid"] = None  # a connection belongs to the process that opened it
        return state
