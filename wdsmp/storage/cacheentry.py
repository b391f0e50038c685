"""Cache entries on disk: the machinery under :class:`wdsmp.cache.FileCache`.

An entry is one file in a cache directory, a complete copy of one shard. This
module holds everything that touches entries and their companion files (lock
files, temps): the flock per entry, claiming an entry to read or to fetch
(polled, never longer than a timeout), the tee that writes a temp while the
consumer reads the source, the check and atomic rename that add an entry, and
the sweep that removes dead temps and evicts the least recently used entries.

It is kept apart from :mod:`wdsmp.cache`, the public, webdataset-compatible
API (naming, file checks, settings, the pipeline stages, falling back to the
source when the cache cannot be used), so that the protocol below is read,
and changed, in one place.

NOTE [cache entry]: an entry ``<name>`` in the cache directory is only ever a
complete, checked copy of its source. Its companion ``<name>.lock`` carries an
flock: shared, held by each reader of the entry as long as its stream is
open; exclusive, held by the one process that fetches, replaces or evicts it.
(tee) A fetch writes each chunk the consumer reads from the source to the
hidden temp ``.<name>.<pid>.<random>.tmp`` in the same directory. (rename) At
the source's end of file the temp is fsynced, checked by the caller's
``validate`` (wdsmp.cache runs the tar reader over it), room is made under ``cache_size``, and it is
renamed over ``<name>``; only then is the exclusive lock released. (temp) A
source error, a write error, a close before end of file or a failed check
removes the temp instead. (lock) Locks are only ever tried without blocking
and polled until a timeout; after locking, the lock file is checked to still
be the one at its path (the same inode), so the holder of an exclusive lock
may unlink it: it does so when it leaves no entry behind, so that no lock file
outlives its entry. flock locks belong to open files, so a process that opens
an entry it is itself fetching would wait for itself: it reads that second
copy uncached instead. A temp whose entry lock can be taken exclusively has
no writer left (its process died): the next sweep removes it. (mark) Before the
rename, the fetcher writes the entry's size into its lock file; the mark says
the cache wrote the file. The sweep counts and evicts marked entries only, so
that other files in the directory (a user's, webdataset's cache files) are
never removed, and a reader can tell an entry whose size changed since (cut
short by a full disk or a copy that stopped halfway): ``FileCache`` then
fetches it again, with a warning.
"""

import fcntl
import functools
import io
import os
import re
import secrets
import sys
import time
import warnings
from typing import IO, TYPE_CHECKING, Callable, List, Optional, Tuple, Union, cast

from .._internal.atomic import put_in_place, remove_if_present
from .._internal.redact import redacted
from ..gopen import gopen

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_Dir = Union[str, "os.PathLike[str]"]
_Unfit = Callable[[str], Optional[str]]  # why the entry at a path may not be read, or None
_Validate = Callable[[str, str], Optional[Exception]]  # why a complete temp (path, url) may not become the entry

__all__ = [
    "LOCK_SUFFIX",
    "CachedFile",
    "EntryLock",
    "cached_size",
    "claim",
    "fetch",
    "known_too_big",
    "say",
    "size_problem",
    "sweep",
    "temp_beside",
    "warn",
]

LOCK_SUFFIX = ".lock"
_TEMP = re.compile(r"\.(.+)\.\d+\.[0-9a-f]{8}\.tmp\Z", re.S)  # the names temp_beside makes
_POLL_FIRST, _POLL_MAX = 0.01, 0.25  # seconds between lock attempts, doubling
_MARK = re.compile(rb"wdsmp cache entry of (\d+) bytes\n\Z")  # a lock file's content (mark)


def say(message: str) -> None:
    """A verbose message of the cache, on stderr (URLs' passwords masked)."""
    print(redacted(message), file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """A RuntimeWarning: the cache could not be used, and reading goes on without it (URLs'
    passwords masked)."""
    warnings.warn(redacted(message), RuntimeWarning, stacklevel=3)


def temp_beside(path: str) -> str:
    """A new name for a hidden temp in ``path``'s directory: ``.<name>.<pid>.<random>.tmp``
    (NOTE [cache entry] (tee)), which the sweep recognizes."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


# Locks.


_EXCLUSIVE_HERE: set = set()  # (pid, lock path) of each entry lock this process holds exclusively
_TOO_BIG: dict = {}  # URL -> its size in bytes, where a fetch found it larger than the cache's cap


def known_too_big(url: str, cache_size: Optional[float]) -> Optional[int]:
    """The size of ``url`` where an earlier fetch in this process found it larger than
    ``cache_size`` bytes, else None: fetching it for the cache again would only be refused."""
    size = _TOO_BIG.get(url)
    return size if size is not None and cache_size is not None and size > cache_size else None


class EntryLock:
    """The flock on ``<entry>.lock``; see NOTE [cache entry] (lock).

    flock locks belong to open files, so one process conflicts with itself
    through two of them: :meth:`held_here` lets it see that instead of waiting.
    """

    def __init__(self, entry: str) -> None:
        self.entry = entry
        self.path = entry + LOCK_SUFFIX
        self._fd: Optional[int] = None
        self._exclusive = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, exclusive: bool) -> bool:
        """Try once, without blocking; True when held. OSError when the file cannot be made."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            try:
                here = os.stat(self.path)
            except FileNotFoundError:
                here = None
            mine = os.fstat(fd)
            if here is None or (here.st_ino, here.st_dev) != (mine.st_ino, mine.st_dev):
                os.close(fd)  # unlinked by its last holder: try again on the new file
                return False
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._exclusive = exclusive
        if exclusive:
            _EXCLUSIVE_HERE.add((os.getpid(), self.path))
        return True

    def mark(self, size: int) -> None:
        """Record in the lock file that the cache wrote the entry, ``size`` bytes long
        (NOTE [cache entry] (mark)); the lock must be held exclusively."""
        if not self._exclusive or self._fd is None:
            raise RuntimeError(f"marking {self.entry} needs its exclusive lock")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, b"wdsmp cache entry of %d bytes\n" % size, 0)

    def held_here(self) -> bool:
        """Whether this process holds the lock exclusively, through another EntryLock."""
        return (os.getpid(), self.path) in _EXCLUSIVE_HERE

    def release(self) -> None:
        """Unlock, if held. The exclusive holder first unlinks the lock file when the entry
        is absent, so that no lock file outlives its entry."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._exclusive:
                _EXCLUSIVE_HERE.discard((os.getpid(), self.path))
                if not os.path.exists(self.entry):
                    remove_if_present(self.path)
        finally:
            os.close(fd)


def cached_size(entry: str) -> Optional[int]:
    """The size ``entry`` had when the cache added it; None when the cache did not write it
    (no marked lock file beside it: NOTE [cache entry] (mark))."""
    try:
        with open(entry + LOCK_SUFFIX, "rb") as f:
            match = _MARK.match(f.read(64))
    except OSError:
        return None
    return int(match.group(1)) if match else None


def size_problem(entry: str) -> Optional[str]:
    """Why ``entry`` is not the file the cache added (its size changed since), or None;
    files the cache did not write are not judged."""
    recorded = cached_size(entry)
    try:
        size = os.path.getsize(entry)
    except OSError:
        return None
    if recorded is None or size == recorded:
        return None
    return f"is {size:,} bytes, not the {recorded:,} it had when cached (cut short or changed since)"


def _lock_if_free(entry: str) -> Optional[EntryLock]:
    """The entry's lock, held exclusively; None when someone holds it or it cannot be made."""
    lock = EntryLock(entry)
    try:
        return lock if lock.acquire(exclusive=True) else None
    except OSError:
        return None


# Reading and fetching an entry.


def claim(url: str, path: str, lock: EntryLock, *, unfit: _Unfit, timeout: float,
          verbose: bool = False) -> Optional["CachedFile"]:
    """Take the lock of ``url``'s entry ``path`` (NOTE [cache entry] (lock)), to read it or
    to fetch it.

    Returns the entry open for reading, holding the shared lock until the stream is
    closed; or None with the exclusive lock held, to fetch the entry, which is absent
    (an entry that ``unfit(path)`` gives a reason against is removed, with a warning);
    or None without the lock once ``timeout`` seconds have passed with another process
    holding it. An exception releases the lock.
    """
    deadline = time.monotonic() + timeout
    delay = _POLL_FIRST
    try:
        while True:
            if lock.acquire(exclusive=False):
                stream = _open_entry(path, lock, unfit, verbose)
                if stream is not None:
                    return stream
            if lock.acquire(exclusive=True):
                if not os.path.exists(path):
                    return None
                problem = unfit(path)
                if problem is not None:
                    warn(f"cache file {path} for {url} {problem}; fetching it again")
                    remove_if_present(path)
                    return None
                lock.release()  # added by another process just now: read it shared
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(2 * delay, _POLL_MAX)
    except BaseException:
        lock.release()
        raise


def _open_entry(path: str, lock: EntryLock, unfit: _Unfit, verbose: bool) -> Optional["CachedFile"]:
    """The entry open for reading, holding the shared lock; None (lock released) if it is
    missing or unfit. An exception leaves the lock to the caller."""
    if not os.path.exists(path) or unfit(path) is not None:
        lock.release()
        return None
    stream = CachedFile(path, lock)
    try:
        os.utime(path)  # last use, for LRU eviction
    except OSError:
        pass  # a read-only cache still serves
    if verbose:
        say(f"[opening cached {path}]")
    return stream


class CachedFile(io.FileIO):
    """A cache file open for reading; closing it releases the entry's shared lock."""

    def __init__(self, path: str, lock: EntryLock) -> None:
        super().__init__(path, "rb")
        self._lock: Optional[EntryLock] = lock

    def close(self) -> None:
        try:
            super().close()
        finally:
            lock, self._lock = getattr(self, "_lock", None), None
            if lock is not None:
                lock.release()


def fetch(url: str, path: str, lock: EntryLock, *, cache_dir: _Dir, cache_size: Optional[float], validate: _Validate,
          verbose: bool = False, opener: Callable[[str], IO[bytes]] = gopen) -> IO[bytes]:
    """``url``'s source, teed into a new temp that becomes the entry ``path`` at its end of
    file (NOTE [cache entry] (tee)); called holding the exclusive lock, which the stream
    then owns. When no temp can be made: the source alone, the lock released, with a
    warning. ``cache_dir`` and ``cache_size``: the directory and the cap to make room in.
    ``validate(path, url)``: why the complete temp may not become the entry, or None.
    ``opener(url)`` opens the source."""
    try:
        source = opener(url)
    except BaseException:
        lock.release()
        raise
    temp = temp_beside(path)
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exn:
        lock.release()
        warn(f"cannot create a cache file in {os.path.dirname(path)} ({exn}); "
             f"reading {url} without caching")
        return source
    if verbose:
        say(f"[caching {url} at {temp}]")
    add = functools.partial(_add_entry, url, path, cache_dir=cache_dir, cache_size=cache_size,
                            validate=validate, verbose=verbose)
    return cast(IO[bytes], _Tee(source, url, temp, fd, lock, add))


class _Tee(io.RawIOBase):
    """The source's bytes, each chunk also written to the entry's temp;
    NOTE [cache entry] (tee). The consumer must read to end of file for the
    entry to be added (wdsmp's tar reader does); ``add(temp, lock)`` adds it."""

    def __init__(self, source: IO[bytes], url: str, temp: str, fd: int, lock: EntryLock,
                 add: Callable[[str, EntryLock], None]) -> None:
        super().__init__()
        self._source = source
        self._url = url
        self._temp: Optional[str] = temp
        self._fd: Optional[int] = fd
        self._lock: Optional[EntryLock] = lock
        self._add = add

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: "WriteableBuffer") -> Optional[int]:
        view = memoryview(buffer).cast("B")
        try:
            readinto = getattr(self._source, "readinto", None)
            if readinto is not None:
                n = readinto(view)
            else:
                chunk = self._source.read(len(view))
                n = len(chunk)
                view[:n] = chunk
        except BaseException:
            self._drop()  # a source error: nothing is cached
            raise
        if n:
            self._write(view[:n])
        elif n == 0 and len(view):
            self._finish()
        return n

    def _write(self, view: memoryview) -> None:
        if self._fd is None:
            return
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exn:
            self._drop(f"cannot write the cache file {self._temp} ({exn}); "
                       f"reading {self._url} on without caching it")

    def _finish(self) -> None:
        """End of the source: the temp is handed over to become the entry;
        NOTE [cache entry] (rename)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as exn:
            self._drop(f"cannot write the cache file {self._temp} ({exn}); not caching {self._url}")
            return
        finally:
            os.close(fd)
        temp, lock = self._temp, self._lock
        self._temp = self._lock = None
        assert temp is not None and lock is not None  # cleared only with _fd, by _drop
        self._add(temp, lock)

    def _drop(self, warning: Optional[str] = None) -> None:
        """Give up caching: remove the temp, release the lock (NOTE [cache entry] (temp))."""
        if warning is not None:
            warn(warning)
        fd, self._fd = self._fd, None
        temp, lock = self._temp, self._lock
        self._temp = self._lock = None
        try:
            if fd is not None:
                os.close(fd)
        finally:
            if temp is not None:
                remove_if_present(temp)
            if lock is not None:
                lock.release()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drop()  # before end of file; nothing left to drop after the entry is added
        finally:
            try:
                self._source.close()
            finally:
                super().close()


def _add_entry(url: str, path: str, temp: str, lock: EntryLock, *, cache_dir: _Dir, cache_size: Optional[float],
               validate: _Validate, verbose: bool) -> None:
    """Check the complete temp, make room, rename it to the entry; always releases the
    lock and leaves no temp. NOTE [cache entry] (rename)."""
    try:
        problem = validate(temp, url)
        if problem is not None:
            if verbose:
                say(f"[not caching {url}: {problem}]")  # the reader raises it too
            return
        size = os.path.getsize(temp)
        if cache_size is not None and size > cache_size:
            _TOO_BIG[url] = size
            warn(f"{url} ({size} bytes) is larger than cache_size ({cache_size} bytes); "
                 f"not caching it")
            return
        if not sweep(cache_dir, cache_size, size, verbose=verbose):
            warn(f"not caching {url}: the cache at {cache_dir} is full of files in use")
            return
        lock.mark(size)
        put_in_place(temp, path)
        if verbose:
            say(f"[done caching {path}]")
    except OSError as exn:
        warn(f"cannot add {url} to the cache at {path} ({exn}); not caching it")
    finally:
        remove_if_present(temp)
        lock.release()


# The sweep: dead temps and eviction.


def sweep(cache_dir: _Dir, cache_size: Optional[float], incoming: int = 0,
          keyfn: Callable[[str], float] = os.path.getmtime, verbose: bool = False) -> bool:
    """Remove orphaned temps, then evict entries, least recently used first (smallest
    ``keyfn``), until ``incoming`` more bytes fit under ``cache_size`` (None: no cap).
    Entries in use are kept; files the cache did not write are neither counted nor
    removed (NOTE [cache entry] (mark)). True if the bytes fit."""
    entries: List[Tuple[float, int, str]] = []
    for dirpath, _, filenames in os.walk(cache_dir):
        names = set(filenames)
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            temp = _TEMP.match(filename)
            if temp is not None:
                _remove_orphan(path, os.path.join(dirpath, temp.group(1)))
            elif filename + LOCK_SUFFIX in names and cached_size(path) is not None:
                try:
                    entries.append((keyfn(path), os.path.getsize(path), path))
                except FileNotFoundError:
                    pass  # evicted meanwhile by another process
    if cache_size is None:
        return True
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total + incoming <= cache_size:
            break
        if _evict(path, verbose):
            total -= size
    return total + incoming <= cache_size


def _evict(path: str, verbose: bool) -> bool:
    """Remove an entry unless someone holds its lock (or it is no longer the cache's); True if
    removed."""
    lock = _lock_if_free(path)
    if lock is None:
        return False
    try:
        if cached_size(path) is None:  # replaced meanwhile by a file the cache did not write
            return False
        remove_if_present(path)
        if verbose:
            say(f"[cache evicting {path}]")
    finally:
        lock.release()
    return True


def _remove_orphan(temp: str, entry: str) -> None:
    """Remove a temp whose writer is gone (its entry lock is free); NOTE [cache entry]."""
    lock = _lock_if_free(entry)
    if lock is None:
        return
    try:
        remove_if_present(temp)
    finally:
        lock.release()
