"""Every shard's sample count without an index written by hand: what makes epochs exact.

FastLoader and ``ExactSamples`` call ``known_counts`` on their ``urls``:

- counts given (``(url, count)`` pairs, a shard index) are taken as they are;
- a local shard counts itself: its tar headers are walked with the data
  skipped by offset (``native.tar_headers_class``: a few small reads per
  sample, whatever the shard's size), several shards at once, and the member
  names grouped by the reader's own rules (``tariterators.sample_count``). A
  gzip-compressed shard has no headers to jump between: it is decompressed
  whole, which costs the time reading it costs but not the memory, as the data
  is dropped as it goes by (``tariterators.tar_member_names``). Counts are
  kept in a small cache file per directory of shards (``CountCache``), so a
  restart does not walk them again;
- a remote shard (``http(s)://``, ``s3://``, ...) takes its count from the
  shard index beside it (``shardindex.INDEX_NAME`` in its directory), when
  there is one.

A local shard that does not exist, or is not a regular file (a directory, a
symlink loop, a FIFO, a device), is an error at once, naming the file and what
it is (``gopen.local_shard_stat``, the rule every reader of local shards
applies). Where
counts stay unknown and the caller needs them (``required_by``), the error
gives the ``wdsmp index`` command that writes the index.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import uuid
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar, Union, cast

import numpy as np

from .._internal.versions import versioned
from .._internal import env
from .._internal.atomic import atomic_write
from ..errors import ShardError
from ..gopen import local_path, local_shard_stat
from ..handlers import reraise_exception
from ..native.core import tar_headers_class
from ..shards.index import INDEX_NAME, index_beside, read_index, shard_counts
from ..formats.tar import BLOCK, GZIP_MAGIC
from ..tariterators import SHARD_END, ShardFailed, sample_spans, tar_member_names

__all__ = ["CountCache", "ShardWalk", "count_local_shard", "count_local_shards", "file_identity", "known_counts",
           "walk_local_shards"]

_THREADS = 8  # shards counted at once: the walk waits on reads, not on the CPU

_V = TypeVar("_V")
_Urls = Union[str, Sequence[Union[str, Tuple[str, Optional[int]]]]]  # a loader's urls: see known_counts


@dataclass(frozen=True)
class ShardWalk:
    """What the header walk found in a local shard: its sample ``count``, and each sample's byte
    span (``spans``, an int64 array of ``(start, end)`` rows, ``tariterators.sample_spans``), or
    None where a sample cannot be read alone: a gzip-compressed shard has no offsets, and a
    link member's data is another member's (``why`` says which)."""

    count: int
    spans: Optional[np.ndarray]
    why: Optional[str] = None
    file: Tuple[int, ...] = ()  # what identified the file walked (``file_identity``), where known


def walk_local_shard(path: str, url: Optional[str] = None,
                     handler: Callable[[Exception], Any] = reraise_exception) -> ShardWalk:
    """The ``ShardWalk`` of the local shard file ``path`` (named ``url`` in errors). A damaged
    shard raises its ``TarFormatError`` unless ``handler`` goes on: then the samples before the
    damage count, as the reader yields them."""
    url = path if url is None else url
    members: List[Tuple[str, int, int]]
    members, why, boundary = [], None, SHARD_END
    local_shard_stat(path, url)
    with open(path, "rb", buffering=0) as file:
        try:
            if os.pread(file.fileno(), 2, 0) == GZIP_MAGIC:  # no offsets to jump to: the data read and dropped
                why = "it is gzip-compressed"
                members.extend((name, 0, 0) for name in tar_member_names(file, url))
            else:
                if hasattr(os, "posix_fadvise"):  # no readahead: a header read fetches its page, not the data
                    os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
                headers = tar_headers_class()(file, url)
                members.extend((name, offset, headers.position) for name, _, offset in headers)
                if headers.links:
                    why = f"it has link members ({headers.links[0][0]!r})"
        except Exception as exn:
            handler(exn)
            boundary = ShardFailed(getattr(exn, "member", None))
    spans = sample_spans(members, boundary)
    if why is not None:
        return ShardWalk(len(spans), None, why)
    return ShardWalk(len(spans), np.array(spans, dtype=np.int64).reshape(-1, 2))


def count_local_shard(path: str, url: Optional[str] = None,
                      handler: Callable[[Exception], Any] = reraise_exception) -> int:
    """The number of samples the reader makes of the local shard file ``path`` (named ``url``
    in errors); see ``walk_local_shard``."""
    return walk_local_shard(path, url, handler).count


def _packed_spans(walk: ShardWalk) -> Optional[str]:
    """A walk's spans as text for the cache: gaps and lengths (small numbers), compressed."""
    if walk.spans is None:
        return None
    flat = walk.spans.reshape(-1)
    steps = np.diff(flat, prepend=0) // BLOCK
    return base64.b64encode(zlib.compress(steps.astype("<i8").tobytes())).decode("ascii")


def _unpacked_spans(text: str, count: int, size: int) -> Optional[np.ndarray]:
    """The spans kept as ``text``, or None unless they are ``count`` ordered, block-aligned spans
    within a file of ``size`` bytes."""
    try:
        # No more than the entry's count says (two steps of 8 bytes a sample): a bomb stops there.
        raw = zlib.decompressobj().decompress(base64.b64decode(text, validate=True), 16 * count + 1)
        steps = np.frombuffer(raw, dtype="<i8") if len(raw) % 8 == 0 else np.empty(0, "<i8")
    except (ValueError, TypeError, zlib.error):
        return None
    if steps.size != 2 * count or (steps < 0).any():
        return None
    flat = np.cumsum(steps) * BLOCK
    spans = flat.reshape(-1, 2)
    if count and (flat[-1] > size or (spans[:, 1] <= spans[:, 0]).any()):
        return None
    return spans


# The count cache's files: their format and version (version 1: counts, spans as packed steps).
_FORMAT, _VERSION = "wdsmp.CountCache", 1


class CountCache:
    """Sample counts of local shards kept on disk under ``root``: one small JSON file per
    directory of shards, each count filed under the shard's name with what identifies that
    version of the file (size, mtime, inode and ctime: a shard rewritten since, also one whose
    mtime was put back by ``cp -p`` or ``rsync -t``, is counted again).

    The files are dot files (``.shardcounts-<hash of the directory>.json``), which the shard
    cache, when it shares ``root``, neither evicts nor counts. Written atomically (temp beside,
    rename), merged with what is there: processes writing at once (the ranks of a node) lose
    at most each other's new entries, never a count's correctness. What is read is checked, as
    a planted count would take samples out of every epoch: a file that is not this user's (the
    names are predictable, and ``root`` may be shared) is ignored, and so is one of another format
    version (a cache is rebuilt, never refused), and an entry that is
    not a count a file of its size can hold (at least 1, at most one per 512-byte tar header);
    those shards are counted again. ``root`` is made private (mode 0700) when made here.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def _file(self, directory: str) -> str:
        digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:24]
        return os.path.join(self.root, f".shardcounts-{digest}.json")

    def _read(self, directory: str) -> Dict[str, Any]:
        try:
            fd = os.open(self._file(directory), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return {}  # none yet, or a link: counted again
        try:
            with os.fdopen(fd) as stream:
                if os.fstat(stream.fileno()).st_uid != os.getuid():
                    return {}
                entries = json.load(stream)
        except (OSError, ValueError, RecursionError):
            return {}  # unreadable: counted again
        if not isinstance(entries, dict) or entries.get("directory") != directory:
            return {}
        if entries.get("format") != _FORMAT or entries.get("version") != _VERSION:
            return {}  # another version's cache (or none): counted again, and rewritten in this one
        shards = entries.get("shards")
        return shards if isinstance(shards, dict) else {}

    def lookup(self, paths: Mapping[str, os.stat_result], spans: bool = False) -> Dict[str, ShardWalk]:
        """``{path: ShardWalk}`` for those of ``paths`` (real paths, with their ``os.stat_result``
        as values) whose count is kept, fits the file as it is now, and could be its count;
        ``spans=True``: only those whose spans are kept too (or known not to be readable)."""
        found = {}
        for directory, group in _by_directory(paths).items():
            kept = self._read(directory)
            for path, info in group.items():
                entry = kept.get(os.path.basename(path))
                if not isinstance(entry, dict) or entry.get("file") != _identity(info):
                    continue
                count = entry.get("samples")
                if not (type(count) is int and 0 < count <= info.st_size // 512):
                    continue
                packed, why = entry.get("spans"), entry.get("why")
                if isinstance(packed, str):
                    walk = ShardWalk(count, _unpacked_spans(packed, count, info.st_size))
                    if walk.spans is None:
                        continue  # not spans this file can have: walked again
                elif isinstance(why, str):
                    walk = ShardWalk(count, None, why)
                elif spans:
                    continue
                else:
                    walk = ShardWalk(count, None)
                found[path] = walk
        return found

    def store(self, walks: Mapping[str, Tuple[os.stat_result, ShardWalk]]) -> None:
        """Keep ``{path: (os.stat_result, ShardWalk)}``; a cache that cannot be written is warned
        about and does without (the shards are then walked again next time)."""
        for directory, group in _by_directory(walks).items():
            path = self._file(directory)
            shards = self._read(directory)
            for p, (info, walk) in group.items():
                entry = {"file": _identity(info), "samples": walk.count}
                if walk.spans is not None:
                    entry["spans"] = _packed_spans(walk)
                elif walk.why is not None:
                    entry["why"] = walk.why
                shards[os.path.basename(p)] = entry
            text = json.dumps(versioned(_FORMAT, _VERSION, {"directory": directory, "shards": shards}),
                              separators=(",", ":"))
            try:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
                with atomic_write(path, f"{path}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}") as temp:
                    with open(temp, "w") as stream:
                        stream.write(text)
            except OSError as exn:
                warnings.warn(f"cannot keep the sample counts of the shards in {directory} in {path} ({exn}); "
                              f"they will be counted again", RuntimeWarning, stacklevel=3)


def file_identity(info: os.stat_result) -> Tuple[int, int, int, int]:
    """What tells one version of a file from another, from its ``os.stat_result``: size, mtime,
    inode and ctime (a file rewritten, also one whose mtime was put back, differs)."""
    return (info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)


def _identity(info: os.stat_result) -> List[int]:
    return list(file_identity(info))  # as kept in the cache's JSON


def _by_directory(items: Mapping[str, _V]) -> Dict[str, Dict[str, _V]]:
    groups: Dict[str, Dict[str, _V]] = {}
    for path, value in items.items():
        groups.setdefault(os.path.dirname(path), {})[path] = value
    return groups


def walk_local_shards(paths: Sequence[str], cache_dir: Optional[str] = None,
                      handler: Callable[[Exception], Any] = reraise_exception,
                      spans: bool = False) -> Dict[str, ShardWalk]:
    """``{path: ShardWalk}`` for the local shard files ``paths``: from the count cache (under
    ``cache_dir`` when given, else the user's cache directory, ``env.user_cache_dir``) where
    it knows them, else walked, several at once, and kept there (``handler``: see
    ``walk_local_shard``; a damaged shard's walk is not kept). ``spans=True``: the walks must
    have each sample's span (an entry kept with its count alone is walked again). Errors name
    the path given."""
    given: Dict[str, str]
    stats: Dict[str, os.stat_result]
    given, stats = {}, {}  # by real path: a name for errors, and what the cache is keyed on
    for path in paths:
        info = local_shard_stat(path)
        real = os.path.realpath(path)
        given.setdefault(real, path)
        stats[real] = info
    cache = CountCache(cache_dir if cache_dir is not None else env.user_cache_dir())
    walks = cache.lookup(stats, spans)
    todo = [real for real in stats if real not in walks]
    if todo:
        def walk(real: str) -> Tuple[ShardWalk, bool]:
            damaged: List[Any] = []

            def keep_going(exn: Exception) -> Any:  # the damaged shard's walk is not kept
                damaged.append(handler(exn))
                return damaged[-1]

            return walk_local_shard(real, given[real], keep_going), bool(damaged)

        with ThreadPoolExecutor(min(_THREADS, len(todo)), thread_name_prefix="wdsmp-count") as pool:
            results = dict(zip(todo, pool.map(walk, todo)))
        walks.update((real, w) for real, (w, _) in results.items())
        cache.store({real: (stats[real], w) for real, (w, damaged) in results.items() if not damaged})
    return {path: replace(walks[os.path.realpath(path)], file=file_identity(stats[os.path.realpath(path)]))
            for path in paths}


def count_local_shards(paths: Sequence[str], cache_dir: Optional[str] = None,
                       handler: Callable[[Exception], Any] = reraise_exception) -> Dict[str, int]:
    """``{path: count}`` for the local shard files ``paths``; see ``walk_local_shards``."""
    return {path: walk.count for path, walk in walk_local_shards(paths, cache_dir, handler).items()}


def _index_counts(urls: Iterable[str]) -> Tuple[Dict[str, int], Dict[str, str]]:
    """``({url: count}, {index URL: why it is not usable})`` from the shard indexes beside the
    remote ``urls``."""
    counts: Dict[str, int]
    missing: Dict[str, str]
    counts, missing = {}, {}
    for index in dict.fromkeys(index_beside(url) for url in urls):
        if index is None:
            continue
        try:
            counts.update(read_index(index))
        except OSError as exn:  # not there, or not reachable: the counts stay unknown
            missing[index] = str(exn)
    return counts, missing


def known_counts(urls: _Urls, index: Optional[str] = None, *, cache_dir: Optional[str] = None,
                 handler: Callable[[Exception], Any] = reraise_exception, required_by: Optional[str] = None,
                 otherwise: Optional[str] = None) -> Tuple[Tuple[str, Optional[int]], ...]:
    """``((url, count or None), ...)`` for a loader's ``urls`` (a shard spec, URLs or ``(url,
    count)`` pairs, or a shard index) and ``index`` (see ``shardindex.shard_counts``), with the
    counts the data can give (module docstring). ShardError for a local shard that does not
    exist or is not a regular file (``gopen.local_shard_stat``). ``required_by`` (what needs
    every count, e.g. "FastLoader on 2 ranks"): ValueError, with the command that writes an
    index (and ``otherwise``, another way out), when some count stays unknown."""
    table = list(shard_counts(urls, index))
    local = cast(Dict[str, str], {url: local_path(url) for url, _ in table if local_path(url) is not None})
    unreadable = [exn for exn in map(_unreadable, local.items()) if exn is not None]
    if len(unreadable) > 1:
        first = unreadable[0]
        raise type(first)(f"{first.problem} (and {len(unreadable) - 1} more of the shards)", first.url) from first
    if unreadable:
        raise unreadable[0]
    unknown = [url for url, count in table if count is None and url in local]
    counted = cast(Dict[Optional[str], int],  # keyed by local path: a URL that is not local gets the default
                   count_local_shards([local[url] for url in unknown], cache_dir, handler) if unknown else {})
    remote = [url for url, count in table if count is None and url not in local]
    found, missing = _index_counts(remote) if remote else ({}, {})
    table = [(url, count if count is not None else counted.get(local.get(url), found.get(url))) for url, count in table]
    unknown = [url for url, count in table if count is None]
    if unknown and required_by is not None:
        raise ValueError(_needs_index(required_by, otherwise, urls, unknown, missing))
    return tuple(table)


def _unreadable(local: Tuple[str, str]) -> Optional[ShardError]:
    """Why the local shard ``(url, path)`` cannot be read as a shard file, or None."""
    url, path = local
    try:
        local_shard_stat(path, url)
    except ShardError as exn:
        return exn
    return None


def _needs_index(who: str, otherwise: Optional[str], urls: _Urls, unknown: Sequence[str],
                 missing: Mapping[str, str]) -> str:
    """The error text for shards without counts: where wdsmp looked, and the command to run."""
    beside = sorted(cast(Set[str], {index_beside(url) for url in unknown} - {None}))
    looked = "; ".join(f"{index}: {missing.get(index, 'it does not list them')}" for index in beside[:3])
    spec = urls if isinstance(urls, str) else " ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
    shards = "1 shard has" if len(unknown) == 1 else f"{len(unknown)} shards have"
    place = f" as {beside[0]}" if len(beside) == 1 else ""
    return (f"{who} needs the sample count of every shard for exact epochs (every sample once, the same "
            f"number of batches on every rank), and {shards} none, e.g. {unknown[0]!r}"
            + (f"; no shard index beside them ({looked})" if looked else "")
            + f". Write one with\n\n    wdsmp index -o {INDEX_NAME} {shlex.quote(spec)}\n\n"
            + f"and put {INDEX_NAME} beside the shards{place} (or pass index=...)"
            + (f", or {otherwise}" if otherwise else ""))
