"""Shard cache: a local copy of each remote shard, made while it is first read.

``cached_tarfile_to_samples(cache_dir=...)`` works like ``tarfile_to_samples``
(same inputs, same samples, ``__url__`` included) but keeps a copy of every
shard it reads in ``cache_dir`` and reads that copy on later passes. Unlike
webdataset, which downloads a whole shard before its first sample, the first
pass streams: every chunk the tar reader takes from the source is also
written to a temporary file, so training starts at once.

What the cache promises (NOTE [cache entry] has the protocol):

- a cache file is a bit-identical, complete copy of its source: it appears,
  by an atomic rename, only after the source was read to its end without an
  error and the copy passed the tar reader's own checks;
- several processes reading the same URL fetch it once (a lock per entry);
- a full disk, or any other error writing the cache, never stops training:
  reading goes on from the source, uncached, with a warning;
- ``cache_size`` caps the bytes of cache files, least recently used first out,
  never one another process is reading;
- a cached file that is not a tar (or gzip) archive is replaced, with a warning.

Local paths and ``file:`` URLs are never cached, as they are already local
(``always=True`` caches them too, for slow network filesystems); nor is ``-``.

Differences from webdataset, on purpose: ``cache_dir=None`` disables caching
everywhere (webdataset's ``cached_url_opener`` took None as "the default
directory": omit the argument for that); cache files are named from a hash of
the whole URL (see :func:`url_to_name`), so two shards with the same basename
never collide; samples read through the cache get no ``__local_path__`` naming
the cache file, so every pass yields the same samples.

NOTE [cache entry]: an entry ``<name>`` in the cache directory is only ever a
complete, checked copy of its source. Its companion ``<name>.lock`` carries an
flock: shared, held by each reader of the entry as long as its stream is
open; exclusive, held by the one process that fetches, replaces or evicts it.
(tee) A fetch writes each chunk the consumer reads from the source to the
hidden temp ``.<name>.<pid>.<random>.tmp`` in the same directory. (rename) At
the source's end of file the temp is fsynced, checked by running the tar
reader over it (page-cache fast for a tar; a gzip shard is decompressed once
more, on its first pass only), room is made under ``cache_size``, and it is renamed over
``<name>``; only then is the exclusive lock released. (temp) A source error,
a write error, a close before end of file or a failed check removes the temp
instead. (lock) Locks are only ever tried without blocking and polled until
``lock_timeout``; after locking, the lock file is checked to still be the one
at its path (the same inode), so the holder of an exclusive lock may unlink
it, as eviction does. flock locks belong to open files, so a process that
opens an entry it is itself fetching would wait for itself: it reads that
second copy uncached instead. A temp whose entry lock can be taken
exclusively has no writer left (its process died): the next sweep removes it.
"""

import fcntl
import hashlib
import io
import os
import re
import secrets
import sys
import time
import urllib.parse
import warnings

from . import _env
from .errors import ShardError
from .filters import pipelinefilter
from .gopen import gopen, local_path
from .handlers import reraise_exception
from .tariterators import group_by_keys, tar_file_expander, tar_file_iterator
from .tarformat import BLOCK, GZIP_MAGIC

__all__ = [
    "FileCache",
    "LRUCleanup",
    "StreamingOpen",
    "cached_tarfile_samples",
    "cached_tarfile_to_samples",
    "cached_url_opener",
    "check_tar_format",
    "default_cache_dir",
    "default_cache_size",
    "download",
    "get_filetype",
    "islocal",
    "lru_cleanup",
    "pipe_cleaner",
    "url_to_cache_name",
    "url_to_name",
    "verbose_cache",
]

_LOCK_SUFFIX = ".lock"
_TEMP = re.compile(r"\.(.+)\.\d+\.[0-9a-f]{8}\.tmp\Z", re.S)  # NOTE [cache entry] (tee)
_POLL_FIRST, _POLL_MAX = 0.01, 0.25  # seconds between lock attempts, doubling
_DEFAULT_LOCK_TIMEOUT = 60.0


class _Default:
    """The default of ``cache_dir``: ``default_cache_dir``, as opposed to None (no cache)."""

    def __repr__(self):
        return "<default_cache_dir>"


_DEFAULT = _Default()


# Module-level defaults. webdataset computes them from WDS_CACHE, WDS_CACHE_SIZE and
# WDS_VERBOSE_CACHE at import; wdsmp reads the environment in _env.py only, per call,
# so they are functions, and the module attributes are computed when asked. (Those
# variables are not read yet: these return webdataset's values for them unset.)


def _default_cache_dir():
    return _env.cache_dir() or "./_cache"


def _default_cache_size():
    return _env.cache_size()  # None: no cap (webdataset: 1e18 bytes)


def _verbose_cache():
    return int(_env.verbose_cache())


def __getattr__(name):
    """``default_cache_dir``, ``default_cache_size``, ``verbose_cache``: current values."""
    defaults = {"default_cache_dir": _default_cache_dir, "default_cache_size": _default_cache_size,
                "verbose_cache": _verbose_cache}
    if name in defaults:
        return defaults[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _say(message):
    print(message, file=sys.stderr, flush=True)


def _warn(message):
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# Names.


def islocal(url):
    """Whether ``url`` is already local: a path, a ``file:`` URL, or ``-`` (stdin)."""
    return url == "-" or local_path(url) is not None


def pipe_cleaner(spec):
    """The storage URL inside a ``pipe:`` command (its first http(s)/hdfs/gs/ais/s3 word),
    else the command; any other spec unchanged."""
    if not spec.startswith("pipe:"):
        return spec
    command = spec[len("pipe:"):]
    for word in command.split(" "):
        if re.match(r"(https?|hdfs|gs|ais|s3):", word):
            return word
    return command


def _readable_name(url):
    """The shard's file name in ``url``, made safe for a file name; "" when there is none."""
    words = pipe_cleaner(url).split() if url.startswith("pipe:") else [url]
    for word in reversed(words):
        name = os.path.basename(urllib.parse.urlsplit(word.strip("'\"")).path)
        name = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")[-80:]
        if "." in name:
            return name
    return ""


def url_to_name(url):
    """The default cache file name: 32 hex digits of the URL's SHA-256, then its shard name.

    The hash covers the whole URL (query and pipe command included), so two
    shards with the same basename never share a cache file; the shard name
    (``a-000001.tar`` from ``pipe:curl -s http://host/a-000001.tar``) only
    makes the cache directory readable.
    """
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    name = _readable_name(url)
    return f"{digest}-{name}" if name else digest


def url_to_cache_name(url, ndir=0):
    """webdataset's naming: the last ``ndir + 1`` components of the URL's path.

    Two URLs whose paths end alike share a name; pass it as ``url_to_name`` to
    reuse a cache directory filled by webdataset. URLs of other schemes
    (``pipe:`` ...) are quoted whole, keeping the last 128 characters.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais"):
        components = parts.path.lstrip("/").split("/")
        return "/".join(components[-1 - ndir:])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


# File checks.


def get_filetype(fname):
    """A short description of a file's format from its first block, in the words of
    file(1): "POSIX tar archive", "tar archive", "gzip compressed data", "empty" or "data"."""
    with open(fname, "rb") as f:
        head = f.read(BLOCK)
    if not head:
        return "empty"
    if head[:2] == GZIP_MAGIC:
        return "gzip compressed data"
    if len(head) == BLOCK and (not any(head) or _header_checksum_ok(head)):
        return "POSIX tar archive" if head[257:262] == b"ustar" else "tar archive"
    return "data"


def _header_checksum_ok(header):
    """The stored checksum of a tar header block matches its bytes (signed or unsigned sum)."""
    field = header[148:156].split(b"\0", 1)[0].strip(b" ")
    try:
        stored = int(field, 8)
    except ValueError:
        return False
    rest = header[:148] + header[156:]
    unsigned = sum(rest) + 8 * 32
    signed = unsigned - 256 * sum(1 for byte in rest if byte > 127)
    return stored in (unsigned, signed)


def check_tar_format(fname):
    """Whether a file starts like a tar archive or gzip data (its first block only)."""
    filetype = get_filetype(fname)
    return "tar archive" in filetype or "gzip compressed" in filetype


def _tar_problem(path, url):
    """Why the file at ``path`` would fail the tar reader, or None: the check before an
    entry is added (NOTE [cache entry] (rename)), by the reader's own code."""
    try:
        with open(path, "rb") as f:
            for _ in tar_file_iterator(f, url=url):
                pass
    except (ValueError, OSError) as exn:
        return exn
    return None


# Locks and the directory sweep.


_EXCLUSIVE = set()  # (pid, lock path) of each entry lock this process holds exclusively


class _EntryLock:
    """The flock on ``<entry>.lock``; see NOTE [cache entry] (lock).

    flock locks belong to open files, so one process conflicts with itself
    through two of them: :meth:`held_here` lets it see that instead of waiting.
    """

    def __init__(self, path):
        self.path = path
        self.fd = None
        self._exclusive = False

    def acquire(self, exclusive):
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
        self.fd = fd
        self._exclusive = exclusive
        if exclusive:
            _EXCLUSIVE.add((os.getpid(), self.path))
        return True

    def held_here(self):
        """Whether this process holds the lock exclusively, through another _EntryLock."""
        return (os.getpid(), self.path) in _EXCLUSIVE

    def release(self, remove=False):
        """Unlock; ``remove`` (only with the exclusive lock) unlinks the lock file first."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if self._exclusive:
            _EXCLUSIVE.discard((os.getpid(), self.path))
        try:
            if remove:
                _remove(self.path)
        finally:
            os.close(fd)


def _evict(path, verbose):
    """Remove an entry unless someone holds its lock; True if removed."""
    lock = _EntryLock(path + _LOCK_SUFFIX)
    try:
        if not lock.acquire(exclusive=True):
            return False
    except OSError:
        return False
    try:
        _remove(path)
        if verbose:
            _say(f"[cache evicting {path}]")
    finally:
        lock.release(remove=True)
    return True


def _remove_orphan(temp, entry):
    """Remove a temp whose writer is gone (its entry lock is free); NOTE [cache entry]."""
    lock = _EntryLock(entry + _LOCK_SUFFIX)
    try:
        if not lock.acquire(exclusive=True):
            return
    except OSError:
        return
    try:
        _remove(temp)
    finally:
        lock.release(remove=not os.path.exists(entry))


def _sweep(cache_dir, cache_size, incoming=0, keyfn=os.path.getmtime, verbose=False):
    """Remove orphaned temps, then evict entries, least recently used first (smallest
    ``keyfn``), until ``incoming`` more bytes fit under ``cache_size`` (None: no cap).
    Entries in use are kept. True if the bytes fit."""
    entries = []
    for dirpath, _, filenames in os.walk(cache_dir):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            temp = _TEMP.match(filename)
            if temp is not None:
                _remove_orphan(path, os.path.join(dirpath, temp.group(1)))
            elif not filename.startswith(".") and not filename.endswith(_LOCK_SUFFIX):
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


def lru_cleanup(cache_dir, cache_size, keyfn=os.path.getmtime, verbose=False):
    """Evict cache files, least recently used first, until their total is at most
    ``cache_size`` bytes; files other processes are reading are kept, and orphaned
    temps are removed. The cache touches a file's mtime whenever it is opened, so
    the default ``keyfn`` orders by last use (webdataset: ``os.path.getctime``)."""
    if os.path.isdir(cache_dir):
        _sweep(cache_dir, cache_size, keyfn=keyfn, verbose=verbose)


class LRUCleanup:
    """:func:`lru_cleanup` at most once every ``interval`` seconds (webdataset's class)."""

    def __init__(self, cache_dir=None, cache_size=int(1e12), keyfn=os.path.getmtime,
                 verbose=False, interval=30):
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.keyfn = keyfn
        self.verbose = verbose
        self.interval = interval
        self.last_run = None  # time.monotonic() of the last run

    def set_cache_dir(self, cache_dir):
        self.cache_dir = cache_dir

    def cleanup(self):
        """Run :func:`lru_cleanup` unless it ran less than ``interval`` seconds ago."""
        if self.cache_dir is None:
            return
        if (self.interval is not None and self.last_run is not None
                and time.monotonic() - self.last_run < self.interval):
            return
        lru_cleanup(self.cache_dir, self.cache_size, keyfn=self.keyfn, verbose=self.verbose)
        self.last_run = time.monotonic()


def download(url, dest, chunk_size=1 << 20, verbose=False):
    """Copy ``url`` to the file ``dest``: through a temp beside it, fsynced, renamed at the
    end, so ``dest`` is whole or absent."""
    temp = os.path.join(os.path.dirname(dest) or ".",
                        f".{os.path.basename(dest)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    if verbose:
        _say(f"[downloading {url} to {dest}]")
    try:
        with gopen(url) as stream, open(temp, "wb") as f:
            while True:
                data = stream.read(chunk_size)
                if not data:
                    break
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, dest)
    finally:
        _remove(temp)


# Streams.


class _CachedFile(io.FileIO):
    """A cache file open for reading; closing it releases the entry's shared lock."""

    def __init__(self, path, lock):
        super().__init__(path, "rb")
        self._lock = lock

    def close(self):
        try:
            super().close()
        finally:
            lock, self._lock = getattr(self, "_lock", None), None
            if lock is not None:
                lock.release()


class _Tee(io.RawIOBase):
    """The source's bytes, each chunk also written to the entry's temp;
    NOTE [cache entry] (tee). The consumer must read to end of file for the
    entry to be added (wdsmp's tar reader does)."""

    def __init__(self, source, cache, url, path, temp, fd, lock):
        super().__init__()
        self._source = source
        self._cache = cache
        self._url = url
        self._path = path
        self._temp = temp
        self._fd = fd
        self._lock = lock

    def readable(self):
        return True

    def readinto(self, buffer):
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

    def _write(self, view):
        if self._fd is None:
            return
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exn:
            self._drop(f"cannot write the cache file {self._temp} ({exn}); "
                       f"reading {self._url} on without caching it")

    def _finish(self):
        """End of the source: hand the temp to the cache (NOTE [cache entry] (rename))."""
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
        self._cache._commit(self._url, self._path, temp, lock)

    def _drop(self, warning=None):
        """Give up caching: remove the temp, release the lock (NOTE [cache entry] (temp))."""
        if warning is not None:
            _warn(warning)
        fd, self._fd = self._fd, None
        temp, lock = self._temp, self._lock
        self._temp = self._lock = None
        try:
            if fd is not None:
                os.close(fd)
        finally:
            if temp is not None:
                _remove(temp)
            if lock is not None:
                lock.release(remove=not os.path.exists(self._path))

    def close(self):
        if self.closed:
            return
        try:
            self._drop()  # before end of file; nothing left to drop after a commit
        finally:
            try:
                self._source.close()
            finally:
                super().close()


# The cache.


def _resolve_size(cache_size):
    """Bytes, None for no cap, or 0 for no caching; see FileCache."""
    if cache_size is None:
        return None
    if isinstance(cache_size, bool) or not isinstance(cache_size, (int, float)):
        raise TypeError(f"cache_size must be a number of bytes or None, not {cache_size!r}")
    if cache_size < 0:
        return _default_cache_size()
    if cache_size == float("inf"):
        return None
    return int(cache_size)


class FileCache:
    """Opens shard URLs through the cache in ``cache_dir``; see the module docstring.

    Called on an iterator of URLs (strings or ``{"url": ...}`` dicts) it is a
    pipeline stage, yielding them with an open ``stream`` as ``url_opener`` does.

    ``cache_dir``: the directory, created when needed; by default
    ``default_cache_dir``; None disables caching. ``cache_size``: the cap on
    the cache files' total bytes: -1 (or any negative) is
    ``default_cache_size``, None or infinity no cap, 0 disables caching; a
    shard larger than the cap is not cached (with a warning). ``url_to_name``
    (or ``cache_name``, the name webdataset's documentation uses): the cache
    file's name for a URL, a relative path (default :func:`url_to_name`).
    ``validator(path)``: whether a cache file is fit to read; one that is not is
    removed and fetched again, with a warning (default :func:`check_tar_format`;
    None trusts every file). ``lock_timeout``: seconds to wait while another
    process fetches the same URL, after which the shard is read from its source
    without caching, with a warning. ``always``: cache local files too.
    ``verbose``: say what the cache does, on stderr. ``handler``: what an error
    opening a URL does to the stage.
    """

    def __init__(self, cache_dir=_DEFAULT, *, url_to_name=url_to_name, verbose=False,
                 validator=check_tar_format, handler=reraise_exception, cache_size=-1,
                 lock_timeout=_DEFAULT_LOCK_TIMEOUT, always=False, cache_name=None):
        if cache_dir is _DEFAULT:
            cache_dir = _default_cache_dir()
        if not isinstance(lock_timeout, (int, float)) or lock_timeout < 0:
            raise ValueError(f"lock_timeout must be a non-negative number of seconds, "
                             f"not {lock_timeout!r}")
        self.cache_size = _resolve_size(cache_size)
        self.cache_dir = None if cache_dir is None or self.cache_size == 0 else os.fspath(cache_dir)
        self.url_to_name = cache_name if cache_name is not None else url_to_name
        if not callable(self.url_to_name):
            raise TypeError(f"url_to_name must be a function of the URL, not {self.url_to_name!r}")
        self.verbose = verbose or bool(_verbose_cache())
        self.validator = validator
        self.handler = handler
        self.lock_timeout = float(lock_timeout)
        self.always = always

    def _say(self, message):
        if self.verbose:
            _say(message)

    def entry_path(self, url):
        """The path of ``url``'s cache file (which may not exist)."""
        name = self.url_to_name(url)
        parts = name.split("/") if isinstance(name, str) else None
        if (not parts or "\0" in name or any(not p or p in (".", "..") or p.startswith(".")
                                             for p in parts) or name.endswith(_LOCK_SUFFIX)):
            raise ValueError(f"cache name {name!r} for {url!r} is not a relative path of "
                             f"non-hidden components, or ends in {_LOCK_SUFFIX!r}")
        return os.path.join(self.cache_dir, *parts)

    def open(self, url):
        """A binary stream of ``url``: its cache file, or the source, teed into the cache
        while read (NOTE [cache entry]), or the source alone when caching is off or fails."""
        if self.cache_dir is None or (islocal(url) and not (self.always and url != "-")):
            return gopen(url)
        path = self.entry_path(url)
        lock = _EntryLock(path + _LOCK_SUFFIX)
        if lock.held_here():
            self._say(f"[{url} is being cached by this process: reading this copy uncached]")
            return gopen(url)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            cached = self._claim(url, path, lock)
        except OSError as exn:
            lock.release()
            _warn(f"shard cache {self.cache_dir} unusable ({exn}); reading {url} without caching")
            return gopen(url)
        except BaseException:
            lock.release()
            raise
        if cached is not None:
            return cached
        if lock.fd is not None:
            return self._fetch(url, path, lock)
        _warn(f"waited {self.lock_timeout:g}s for another process caching {url} at {path}; "
              f"reading it without caching")
        return gopen(url)

    def _claim(self, url, path, lock):
        """The entry open for reading (shared lock held); or None with the exclusive lock
        held, to fetch it; or None without a lock after ``lock_timeout``."""
        deadline = time.monotonic() + self.lock_timeout
        delay = _POLL_FIRST
        while True:
            if lock.acquire(exclusive=False):
                stream = self._open_entry(path, lock)
                if stream is not None:
                    return stream
            if lock.acquire(exclusive=True):
                if not os.path.exists(path):
                    return None
                if self.validator is None or self.validator(path):
                    lock.release()  # fetched by another process just now: read it shared
                    continue
                _warn(f"cache file {path} for {url} is not a tar archive "
                      f"({get_filetype(path)}); fetching it again")
                _remove(path)
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(2 * delay, _POLL_MAX)

    def _open_entry(self, path, lock):
        """The entry for reading, holding the shared lock; None (lock released) if it is
        missing or fails the validator."""
        try:
            if not os.path.exists(path) or (self.validator is not None and not self.validator(path)):
                lock.release()
                return None
            stream = _CachedFile(path, lock)
        except BaseException:
            lock.release()
            raise
        try:
            os.utime(path)  # last use, for LRU eviction
        except OSError:
            pass  # a read-only cache still serves
        self._say(f"[opening cached {path}]")
        return stream

    def _fetch(self, url, path, lock):
        """The source teed into a new temp; holding the exclusive lock."""
        try:
            source = gopen(url)
        except BaseException:
            lock.release(remove=True)
            raise
        directory, name = os.path.split(path)
        temp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exn:
            lock.release(remove=True)
            _warn(f"cannot create a cache file in {directory} ({exn}); reading {url} without caching")
            return source
        self._say(f"[caching {url} at {temp}]")
        return _Tee(source, self, url, path, temp, fd, lock)

    def _commit(self, url, path, temp, lock):
        """Check the complete temp, make room, rename it to the entry; always releases the
        lock and leaves no temp. NOTE [cache entry] (rename)."""
        try:
            problem = _tar_problem(temp, url)
            if problem is not None:
                self._say(f"[not caching {url}: {problem}]")  # the reader raises it too
                return
            size = os.path.getsize(temp)
            if self.cache_size is not None and size > self.cache_size:
                _warn(f"{url} ({size} bytes) is larger than cache_size ({self.cache_size} bytes); "
                      f"not caching it")
                return
            if not _sweep(self.cache_dir, self.cache_size, size, verbose=self.verbose):
                self._say(f"[not caching {url}: cache full of files in use]")
                return
            os.replace(temp, path)
            _fsync_directory(os.path.dirname(path))
            self._say(f"[done caching {path}]")
        except OSError as exn:
            _warn(f"cannot add {url} to the cache at {path} ({exn}); not caching it")
        finally:
            _remove(temp)
            lock.release(remove=not os.path.exists(path))

    def get_file(self, url):
        """The path of ``url``'s cache file, fetching it whole first if needed (local
        URLs: their own path unless ``always``)."""
        if self.cache_dir is None:
            raise ValueError("get_file needs a cache directory (cache_dir is None)")
        path = local_path(url)
        if path is not None and not self.always:
            return path
        stream = self.open(url)
        try:
            if not isinstance(stream, _CachedFile):
                while stream.read(1 << 20):
                    pass
        finally:
            stream.close()
        path = self.entry_path(url)
        if not os.path.exists(path):
            raise ShardError(f"could not add it to the cache at {path} (see the warnings)", url=url)
        return path

    def __call__(self, urls):
        for item in urls:
            sample = {"url": item} if isinstance(item, str) else item
            url = sample["url"]
            try:
                stream = self.open(url)
            except Exception as exn:
                if self.handler(exn):
                    continue
                break
            sample = dict(sample, stream=stream)
            path = local_path(url)
            if path is not None:
                sample.setdefault("local_path", path)  # the source's path, as url_opener
            yield sample


def _fsync_directory(directory):
    """Make a rename in ``directory`` durable where the filesystem can (best effort: the
    rename itself has happened either way)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory
    finally:
        os.close(fd)


class StreamingOpen:
    """The stage that opens URLs without a cache (webdataset's class; ``url_opener``)."""

    def __init__(self, verbose=False, handler=reraise_exception):
        self.verbose = verbose
        self.handler = handler

    def __call__(self, urls):
        return FileCache(None, handler=self.handler, verbose=self.verbose)(urls)


def cached_url_opener(data, handler=reraise_exception, cache_size=-1, cache_dir=_DEFAULT,
                      url_to_name=url_to_name, validator=check_tar_format, verbose=False,
                      always=False, *, cache_name=None, lock_timeout=_DEFAULT_LOCK_TIMEOUT):
    """``url_opener`` through the shard cache; the arguments are :class:`FileCache`'s."""
    cache = FileCache(cache_dir, url_to_name=url_to_name, cache_name=cache_name, verbose=verbose,
                      validator=validator, handler=handler, cache_size=cache_size,
                      lock_timeout=lock_timeout, always=always)
    yield from cache(data)


def cached_tarfile_samples(src, handler=reraise_exception, cache_size=-1, cache_dir=_DEFAULT,
                           verbose=False, url_to_name=url_to_name, always=False,
                           select_files=None, rename_files=None, *, cache_name=None,
                           validator=check_tar_format, lock_timeout=_DEFAULT_LOCK_TIMEOUT):
    """``tarfile_samples`` through the shard cache: the same samples, fetched once.
    ``GOPEN_VERBOSE=1`` turns ``verbose`` on, as in webdataset."""
    verbose = verbose or _env.gopen_verbose()
    streams = cached_url_opener(src, handler=handler, cache_size=cache_size, cache_dir=cache_dir,
                                url_to_name=url_to_name, validator=validator, verbose=verbose,
                                always=always, cache_name=cache_name, lock_timeout=lock_timeout)
    members = tar_file_expander(streams, handler=handler, select_files=select_files,
                                rename_files=rename_files, boundaries=True)
    return group_by_keys(members, handler=handler)


cached_tarfile_to_samples = pipelinefilter(cached_tarfile_samples)
