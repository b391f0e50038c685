"""Shard cache: a local copy of each remote shard, made while it is first read.

``cached_tarfile_to_samples(cache_dir=...)`` works like ``tarfile_to_samples``
(same inputs, same samples, ``__url__`` included) but keeps a copy of every
shard it reads in ``cache_dir`` and reads that copy on later passes. Unlike
webdataset, which downloads a whole shard before its first sample, the first
pass streams: every chunk the tar reader takes from the source is also
written to a temporary file, so training starts at once.

What the cache promises (NOTE [cache entry], in :mod:`wdsmp.storage.cacheentry`, has
the protocol):

- a cache file is a bit-identical, complete copy of its source: it appears,
  by an atomic rename, only after the source was read to its end without an
  error and the copy passed the tar reader's own checks;
- several processes reading the same URL fetch it once (a lock per entry);
- a full disk, or any other error writing the cache, never stops training:
  reading goes on from the source, uncached, with a warning;
- ``cache_size`` caps the bytes of cache files, least recently used first out,
  never one another process is reading, and never a file the cache did not write
  (a user's file in ``cache_dir`` is neither counted nor removed);
- a cached file that is not a tar (or gzip) archive, or whose size changed since it
  was cached (cut short), is replaced, with a warning.

Local paths and ``file:`` URLs are never cached, as they are already local
(``always=True`` caches them too, for slow network filesystems); nor is ``-``.

Differences from webdataset, on purpose: ``cache_dir=None`` disables caching
everywhere (webdataset's ``cached_url_opener`` took None as "the default
directory": omit the argument for that); cache files are named from a hash of
the whole URL (see :func:`url_to_name`), so two shards with the same basename
never collide; samples read through the cache get no ``__local_path__`` naming
the cache file, so every pass yields the same samples.

This module is the public, webdataset-compatible API: cache names, file
checks, :class:`FileCache` (its settings, and the policy of reading the source
uncached whenever the cache cannot serve), the pipeline stages, cleanup and
download. What happens to an entry on disk (locks, the tee, temps, the atomic
rename, eviction) is in :mod:`wdsmp.storage.cacheentry`, with NOTE [cache entry].
"""

import hashlib
import importlib
import os
import re
import time
import urllib.parse
from typing import IO, Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Union, cast

from ._internal import env
from ._internal.atomic import atomic_write
from .storage.cacheentry import (
    LOCK_SUFFIX,
    CachedFile,
    EntryLock,
    claim,
    fetch,
    known_too_big,
    say,
    size_problem,
    sweep,
    temp_beside,
    warn,
)
from .errors import ShardError, WdsmpError
from .stages.base import pipelinefilter
from .gopen import local_path
from .handlers import _Handler, reraise_exception
from .tariterators import group_by_keys, tar_file_expander, tar_file_iterator, url_opener
from .formats.tar import BLOCK, GZIP_MAGIC, checksum_ok

# The gopen module, as webdataset's ``cache.gopen`` is: its ``gopen`` is looked up at each call.
gopen = importlib.import_module(".gopen", __package__)

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
    "magic_filetype",
    "pipe_cleaner",
    "url_to_cache_name",
    "url_to_name",
    "verbose_cache",
]

_DEFAULT_LOCK_TIMEOUT = 60.0  # seconds a reader waits for another process fetching its shard


class _Default:
    """The default of ``cache_dir``: ``default_cache_dir``, as opposed to None (no cache)."""

    def __repr__(self) -> str:
        return "<default_cache_dir>"


_DEFAULT = _Default()

# What the stages open: shard URLs, as strings or ``{"url": ...}`` dicts.
_URLItems = Iterable[Union[str, Mapping[str, Any]]]
# A ``cache_dir`` argument: a directory, None (no cache), or the default one.
_CacheDir = Union[str, "os.PathLike[str]", None, _Default]


# Module-level defaults. webdataset computes them from WDS_CACHE, WDS_CACHE_SIZE and
# WDS_VERBOSE_CACHE at import; wdsmp reads the environment in env.py only, per call,
# so they are functions, and the module attributes are computed when asked.


def _default_cache_dir() -> str:
    return env.cache_dir() or "./_cache"


def _default_cache_size() -> Optional[int]:
    return env.cache_size()  # None: no cap (webdataset: 1e18 bytes)


def _verbose_cache() -> int:
    return int(env.verbose_cache())


def __getattr__(name: str) -> Any:
    """``default_cache_dir``, ``default_cache_size``, ``verbose_cache``: current values."""
    defaults = {"default_cache_dir": _default_cache_dir, "default_cache_size": _default_cache_size,
                "verbose_cache": _verbose_cache}
    if name in defaults:
        return defaults[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Names.


def islocal(url: str) -> bool:
    """Whether ``url`` is already local: a path, a ``file:`` URL, or ``-`` (stdin)."""
    return url == "-" or local_path(url) is not None


def pipe_cleaner(spec: str) -> str:
    """The storage URL inside a ``pipe:`` command (its first http(s)/hdfs/gs/ais/s3 word),
    else the command; any other spec unchanged."""
    if not spec.startswith("pipe:"):
        return spec
    command = spec[len("pipe:"):]
    for word in command.split(" "):
        if re.match(r"(https?|hdfs|gs|ais|s3):", word):
            return word
    return command


def _readable_name(url: str) -> str:
    """The shard's file name in ``url``, made safe for a file name; "" when there is none."""
    words = pipe_cleaner(url).split() if url.startswith("pipe:") else [url]
    for word in reversed(words):
        name = os.path.basename(urllib.parse.urlsplit(word.strip("'\"")).path)
        name = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")[-80:]
        if "." in name:
            return name
    return ""


def url_to_name(url: str) -> str:
    """The default cache file name: 32 hex digits of the URL's SHA-256, then its shard name.

    The hash covers the whole URL (query and pipe command included), so two
    shards with the same basename never share a cache file; the shard name
    (``a-000001.tar`` from ``pipe:curl -s http://host/a-000001.tar``) only
    makes the cache directory readable.
    """
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    name = _readable_name(url)
    return f"{digest}-{name}" if name else digest


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """webdataset's naming: the last ``ndir + 1`` components of the URL's path.

    Two URLs whose paths end alike share a name; pass it as ``url_to_name`` to
    reuse a cache directory filled by webdataset. URLs of other schemes
    (``pipe:`` ...) are quoted whole, keeping the last 128 characters.
    """
    if not isinstance(url, str):
        raise TypeError(f"url_to_cache_name needs a URL string, not {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais"):
        components = parts.path.lstrip("/").split("/")
        return "/".join(components[-1 - ndir:])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


# File checks.


def get_filetype(fname: Union[str, "os.PathLike[str]"]) -> str:
    """A short description of a file's format from its first block, in the words of
    file(1): "POSIX tar archive", "tar archive", "gzip compressed data", "empty" or "data"."""
    with open(fname, "rb") as f:
        head = f.read(BLOCK)
    if not head:
        return "empty"
    if head[:2] == GZIP_MAGIC:
        return "gzip compressed data"
    if len(head) == BLOCK and (not any(head) or checksum_ok(head)):
        return "POSIX tar archive" if head[257:262] == b"ustar" else "tar archive"
    return "data"


def magic_filetype(fname: Union[str, "os.PathLike[str]"]) -> str:
    """``"FNAME: TYPE"`` as file(1) prints it, TYPE from :func:`get_filetype` (webdataset's name)."""
    return f"{fname}: {get_filetype(fname)}"


def check_tar_format(fname: Union[str, "os.PathLike[str]"]) -> bool:
    """Whether a file starts like a tar archive or gzip data (its first block only)."""
    filetype = get_filetype(fname)
    return "tar archive" in filetype or "gzip compressed" in filetype


def _tar_problem(path: str, url: str) -> Optional[Exception]:
    """Why the fetched file at ``path`` would fail the tar reader, or None: the check before
    it becomes an entry (NOTE [cache entry] (rename)), by the reader's own code (page-cache
    fast for a tar; a gzip shard is decompressed once more, on its first pass only)."""
    try:
        with open(path, "rb") as f:
            for _ in tar_file_iterator(f, url=url):
                pass
    except (ValueError, OSError) as exn:
        return exn
    return None


# Cleanup and download.


def lru_cleanup(cache_dir: Union[str, "os.PathLike[str]"], cache_size: Optional[float],
                keyfn: Callable[[str], float] = os.path.getmtime, verbose: bool = False) -> None:
    """Evict cache files, least recently used first, until their total is at most
    ``cache_size`` bytes; files other processes are reading are kept, and orphaned
    temps are removed. The cache touches a file's mtime whenever it is opened, so
    the default ``keyfn`` orders by last use (webdataset: ``os.path.getctime``)."""
    if os.path.isdir(cache_dir):
        sweep(cache_dir, cache_size, keyfn=keyfn, verbose=verbose)


class LRUCleanup:
    """:func:`lru_cleanup` at most once every ``interval`` seconds (webdataset's class)."""

    def __init__(self, cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 cache_size: Optional[float] = int(1e12), keyfn: Callable[[str], float] = os.path.getmtime,
                 verbose: bool = False, interval: Optional[float] = 30) -> None:
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.keyfn = keyfn
        self.verbose = verbose
        self.interval = interval
        self.last_run: Optional[float] = None  # time.monotonic() of the last run

    def set_cache_dir(self, cache_dir: Optional[Union[str, "os.PathLike[str]"]]) -> None:
        self.cache_dir = cache_dir

    def cleanup(self) -> None:
        """Run :func:`lru_cleanup` unless it ran less than ``interval`` seconds ago."""
        if self.cache_dir is None:
            return
        if (self.interval is not None and self.last_run is not None
                and time.monotonic() - self.last_run < self.interval):
            return
        lru_cleanup(self.cache_dir, self.cache_size, keyfn=self.keyfn, verbose=self.verbose)
        self.last_run = time.monotonic()


def download(url: str, dest: str, chunk_size: int = 1 << 20, verbose: bool = False) -> None:
    """Copy ``url`` to the file ``dest``: through a temp beside it, fsynced, renamed at the
    end, so ``dest`` is whole or absent. Errors name ``url``: the source's as gopen
    raises them, a failure to write ``dest`` as a ShardError (an OSError) caused by it."""
    if verbose:
        say(f"[downloading {url} to {dest}]")
    try:
        with atomic_write(dest, temp_beside(dest)) as temp, open(temp, "wb") as f, \
                gopen.gopen(url) as stream:  # no source started for nothing
            while True:
                data = stream.read(chunk_size)
                if not data:
                    break
                f.write(data)
    except WdsmpError:
        raise
    except OSError as exn:
        raise ShardError(f"cannot download to {dest!r}: {exn}", url=url) from exn


# The cache.


def _resolve_size(cache_size: Optional[float]) -> Optional[int]:
    """Bytes, None for no cap, or 0 for no caching; see FileCache."""
    if cache_size is None:
        return None
    if isinstance(cache_size, bool) or not isinstance(cache_size, (int, float)):
        raise TypeError(f"cache_size must be a number of bytes or None, not {cache_size!r}")
    if cache_size != cache_size:
        raise ValueError(f"cache_size must be a number of bytes or None, not {cache_size!r}")
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
    ``validator(path)``: whether a cache file is fit to read; one that is not, or
    whose size is not the one it was cached with, is removed and fetched again,
    with a warning (default :func:`check_tar_format`; None trusts every file).
    ``lock_timeout``: seconds to wait while another process fetches the same URL,
    after which the shard is read from its source without caching, with a warning. ``always``: cache local files too.
    ``verbose``: say what the cache does, on stderr. ``handler``: what an error
    opening a URL does to the stage. ``cache_cleanup_interval`` is accepted for
    webdataset's signature, where it spaces out the size checks: here the cap is
    kept each time a shard is added, so there is nothing to space out.
    """

    def __init__(self, cache_dir: _CacheDir = _DEFAULT, *, url_to_name: Callable[[str], str] = url_to_name,
                 verbose: bool = False, validator: Optional[Callable[[str], Any]] = check_tar_format,
                 handler: _Handler = reraise_exception, cache_size: Optional[float] = -1,
                 cache_cleanup_interval: Optional[float] = 30, lock_timeout: float = _DEFAULT_LOCK_TIMEOUT,
                 always: bool = False, cache_name: Optional[Callable[[str], str]] = None) -> None:
        if cache_dir is _DEFAULT:
            cache_dir = _default_cache_dir()
        if not isinstance(lock_timeout, (int, float)) or not lock_timeout >= 0:  # NaN too
            raise ValueError(f"lock_timeout must be a non-negative number of seconds, "
                             f"not {lock_timeout!r}")
        self.cache_size = _resolve_size(cache_size)
        self.cache_dir = (None if cache_dir is None or self.cache_size == 0  # _DEFAULT was replaced above
                          else os.fspath(cast(Union[str, "os.PathLike[str]"], cache_dir)))
        self.url_to_name = cache_name if cache_name is not None else url_to_name
        if not callable(self.url_to_name):
            raise TypeError(f"url_to_name must be a function of the URL, not {self.url_to_name!r}")
        self.verbose = verbose or bool(_verbose_cache())
        self.validator = validator
        self.handler = handler
        self.lock_timeout = float(lock_timeout)
        self.always = always

    def _say(self, message: str) -> None:
        if self.verbose:
            say(message)

    def entry_path(self, url: str) -> str:
        """The path of ``url``'s cache file (which may not exist). Hidden names and lock
        names are refused: they are the temps' and locks' (NOTE [cache entry])."""
        name = self.url_to_name(url)
        parts = name.split("/") if isinstance(name, str) else None
        if (not parts or "\0" in name or any(not p or p in (".", "..") or p.startswith(".")
                                             for p in parts) or name.endswith(LOCK_SUFFIX)):
            raise ValueError(f"cache name {name!r} for {url!r} is not a relative path of "
                             f"non-hidden components, or ends in {LOCK_SUFFIX!r}")
        return os.path.join(cast(str, self.cache_dir), *parts)  # called with a cache directory only

    def open(self, url: str) -> IO[bytes]:
        """A binary stream of ``url``: its cache file, or the source, teed into the cache
        while read (NOTE [cache entry], in wdsmp.storage.cacheentry), or the source alone when
        caching is off or fails."""
        if self.cache_dir is None or (islocal(url) and not (self.always and url != "-")):
            return gopen.gopen(url)
        path = self.entry_path(url)
        lock = EntryLock(path)
        if lock.held_here():
            self._say(f"[{url} is being cached by this process: reading this copy uncached]")
            return gopen.gopen(url)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            cached = claim(url, path, lock, unfit=self._unfit, timeout=self.lock_timeout,
                           verbose=self.verbose)
        except OSError as exn:
            warn(f"shard cache {self.cache_dir} unusable ({exn}); reading {url} without caching")
            return gopen.gopen(url)
        if cached is not None:
            return cached
        if lock.held:
            return fetch(url, path, lock, cache_dir=self.cache_dir, cache_size=self.cache_size,
                         validate=_tar_problem, verbose=self.verbose, opener=gopen.gopen)
        warn(f"waited {self.lock_timeout:g}s for another process caching {url} at {path}; "
             f"reading it without caching")
        return gopen.gopen(url)

    def _unfit(self, path: str) -> Optional[str]:
        """Why the cache file at ``path`` may not be read (its size changed since it was cached,
        or ``validator`` rejects it), or None; with ``validator=None`` every file is read."""
        if self.validator is None:
            return None
        if not self.validator(path):
            return f"is not a tar archive ({get_filetype(path)})"
        return size_problem(path)

    def get_file(self, url: str) -> str:
        """The path of ``url``'s cache file, fetching it whole first if needed (local
        URLs: their own path unless ``always``)."""
        if self.cache_dir is None:
            raise ValueError("get_file needs a cache directory (cache_dir is None)")
        path = local_path(url)
        if path is not None and not self.always:
            return path
        size = known_too_big(url, self.cache_size)
        if size is not None:
            raise ShardError(f"it is larger than cache_size ({size} bytes, more than {self.cache_size}), as "
                             f"fetching it found before: not fetched for the cache again", url=url)
        stream = self.open(url)
        try:
            if not isinstance(stream, CachedFile):
                while stream.read(1 << 20):
                    pass
        finally:
            stream.close()
        path = self.entry_path(url)
        if not os.path.exists(path):
            raise ShardError(f"could not add it to the cache at {path}: it is not a complete tar archive, or "
                             f"it was not kept (a warning says why)", url=url)
        return path

    def __call__(self, urls: _URLItems) -> Iterator[Dict[str, Any]]:
        return url_opener(urls, handler=self.handler, opener=self.open, local_paths=True)


class StreamingOpen:
    """The stage that opens URLs without a cache (webdataset's class; ``url_opener``)."""

    def __init__(self, verbose: bool = False, handler: _Handler = reraise_exception) -> None:
        self.verbose = verbose
        self.handler = handler

    def __call__(self, urls: _URLItems) -> Iterator[Dict[str, Any]]:
        return FileCache(None, handler=self.handler, verbose=self.verbose)(urls)


def cached_url_opener(data: _URLItems, handler: _Handler = reraise_exception, cache_size: Optional[float] = -1,
                      cache_dir: _CacheDir = _DEFAULT, url_to_name: Callable[[str], str] = url_to_name,
                      validator: Optional[Callable[[str], Any]] = check_tar_format, verbose: bool = False,
                      always: bool = False, *, cache_name: Optional[Callable[[str], str]] = None,
                      lock_timeout: float = _DEFAULT_LOCK_TIMEOUT) -> Iterator[Dict[str, Any]]:
    """``url_opener`` through the shard cache; the arguments are :class:`FileCache`'s.

    The cache is this module's ``FileCache`` at the call, given wdsmp's own keywords
    (``cache_name``, ``lock_timeout``, ``always``) only where they are not their defaults, so
    that a class taking webdataset's ``FileCache`` arguments can replace it."""
    extra: Dict[str, Any] = {}
    if cache_name is not None:
        extra["cache_name"] = cache_name
    if lock_timeout != _DEFAULT_LOCK_TIMEOUT:
        extra["lock_timeout"] = lock_timeout
    if always:
        extra["always"] = always
    cache = FileCache(cache_dir, url_to_name=url_to_name, verbose=verbose, validator=validator,
                      handler=handler, cache_size=cache_size, **extra)
    yield from cache(data)


def cached_tarfile_samples(src: _URLItems, handler: _Handler = reraise_exception, cache_size: Optional[float] = -1,
                           cache_dir: _CacheDir = _DEFAULT, verbose: bool = False,
                           url_to_name: Callable[[str], str] = url_to_name, always: bool = False,
                           select_files: Optional[Callable[[str], Any]] = None,
                           rename_files: Optional[Callable[[str], str]] = None, *,
                           cache_name: Optional[Callable[[str], str]] = None,
                           validator: Optional[Callable[[str], Any]] = check_tar_format,
                           lock_timeout: float = _DEFAULT_LOCK_TIMEOUT) -> Iterator[Dict[str, Any]]:
    """``tarfile_samples`` through the shard cache: the same samples, fetched once.
    ``GOPEN_VERBOSE=1`` turns ``verbose`` on, as in webdataset."""
    verbose = verbose or env.gopen_verbose()
    streams = cached_url_opener(src, handler=handler, cache_size=cache_size, cache_dir=cache_dir,
                                url_to_name=url_to_name, validator=validator, verbose=verbose,
                                always=always, cache_name=cache_name, lock_timeout=lock_timeout)
    members = tar_file_expander(streams, handler=handler, select_files=select_files,
                                rename_files=rename_files, boundaries=True)
    return group_by_keys(members, handler=handler)


cached_tarfile_to_samples = pipelinefilter(cached_tarfile_samples)
