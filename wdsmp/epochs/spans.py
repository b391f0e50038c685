"""Samples read one at a time by their byte spans: what an epoch in global order reads.

The header walk that counts a local shard (``shardcount.walk_local_shard``)
also finds where each of its samples lies, so any sample can be read alone with
one ``pread``. Its bytes go through the same tar splitter and the same
grouping rules as a shard read front to back (``tariterators``), so a sample
read by its span is the sample ``tarfile_samples`` makes, field for field.
Errors name the shard, the member and the offset in the shard.
"""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from time import perf_counter_ns

from typing import Any, Callable, Dict, Iterable, Iterator, NamedTuple, Optional, Sequence, Tuple, cast

import numpy as np

from .._internal import env
from .._internal.redact import redacted
from .._internal.timing import ReadClock
from ..cache import FileCache
from ..errors import SampleError, ShardError, TarFormatError
from ..gopen import local_path, local_shard_stat
from ..handlers import reraise_exception
from .counts import file_identity, walk_local_shards
from ..formats.tar import BLOCK
from ..tariterators import group_by_keys, tar_file_iterator

__all__ = ["SampleFiles", "SpanReader", "locate_samples", "read_positions"]

_OPEN_FILES = 64  # shard files kept open at once: a global order visits them all, over and over
_END_MARKER = bytes(2 * BLOCK)


class SampleFiles(NamedTuple):
    """Where every sample of a shard list lies: each shard's local file (``paths``), its
    samples' byte spans (``spans``) and so its sample count (``counts``), and what identifies
    the version of the file the spans were found in (``files``), by shard number."""

    paths: Tuple[str, ...]
    spans: Tuple[np.ndarray, ...]
    files: Tuple[Tuple[int, ...], ...]

    @property
    def counts(self) -> Tuple[int, ...]:
        return tuple(len(spans) for spans in self.spans)


def locate_samples(urls: Sequence[str], cache_dir: Optional[str] = None,
                   handler: Callable[[Exception], Any] = reraise_exception,
                   fetch: bool = False) -> Tuple[Optional[SampleFiles], Optional[str]]:
    """``(SampleFiles, None)`` when every shard of ``urls`` can be read sample by sample (an
    uncompressed local file without link members), else ``(None, why not)``. A remote shard
    is read from the shard cache in ``cache_dir``, fetched there first (whole, once) when
    ``fetch`` is true; else it is refused. The spans are kept with the counts
    (``shardcount.CountCache``)."""
    paths, cache = [], None
    for url in urls:
        path = local_path(url)
        if path is None:
            if not fetch or cache_dir is None:
                return None, (f"{redacted(url)} is remote; order='global' with cache_dir=... fetches remote "
                              f"shards into the cache to shuffle every sample")
            cache = cache or FileCache(cache_dir, verbose=env.gopen_verbose())
            path = cache.get_file(url)
        paths.append(path)
    walks = walk_local_shards(paths, cache_dir, handler, spans=True)
    for url, path in zip(urls, paths):
        if walks[path].spans is None:
            return None, f"{redacted(url)}: {walks[path].why}"
    return SampleFiles(tuple(paths), cast(Tuple[np.ndarray, ...], tuple(walks[p].spans for p in paths)),
                       tuple(walks[p].file for p in paths)), None


class SpanReader:
    """Reads samples of local shard files by their spans.

    ``paths``: each shard's local file, by shard number; ``spans``: each
    shard's ``(start, end)`` rows (``shardcount.ShardWalk.spans``); ``files``
    (optional): what identified each file when its spans were found
    (``ShardWalk.file``): a file opened that is not that version any more (a
    shard rewritten, a cache entry fetched again) is an error, never spans
    applied to other bytes. ``clock`` (a ``timing.ReadClock``, optional) gets
    the time spent opening and reading. One reader serves any number of
    streams; ``close()`` closes its files.
    """

    def __init__(self, paths: Sequence[str], spans: Sequence[np.ndarray], clock: Optional[ReadClock] = None,
                 files: Sequence[Tuple[int, ...]] = ()) -> None:
        self.paths, self.spans, self.clock, self.files = paths, spans, clock, files
        self._files: OrderedDict[int, int] = OrderedDict()  # shard number -> open descriptor, least recently used first

    def _descriptor(self, shard: int) -> int:
        fd = self._files.pop(shard, None)
        if fd is None:
            if len(self._files) >= _OPEN_FILES:
                os.close(self._files.popitem(last=False)[1])
            local_shard_stat(self.paths[shard])  # never a FIFO (its open would block) or a device
            fd = os.open(self.paths[shard], os.O_RDONLY)
            if self.files and file_identity(os.fstat(fd)) != tuple(self.files[shard]):
                os.close(fd)
                raise ShardError("the shard file changed since its samples were located (it was rewritten or "
                                 "fetched again); make a new loader to locate them again", url=self.paths[shard])
            if self.clock is not None:
                self.clock.shards += 1
        self._files[shard] = fd
        return fd

    def sample(self, shard: int, index: int, url: str) -> Dict[str, Any]:
        """Sample ``index`` of shard number ``shard`` (named ``url`` in the sample and in errors)."""
        start, end = (int(x) for x in self.spans[shard][index])
        begun = perf_counter_ns()
        try:
            data = os.pread(self._descriptor(shard), end - start, start)
        finally:
            if self.clock is not None:
                self.clock.ns += perf_counter_ns() - begun
        if len(data) < end - start:
            raise TarFormatError(f"the shard is shorter than when its samples were located ({start + len(data)} "
                                 f"bytes, sample {index} ends at {end}): it changed since", url, None, start)
        try:
            members = tar_file_iterator(io.BytesIO(data + _END_MARKER), url=url)
            samples = list(group_by_keys(dict(member, __url__=url) for member in members))
        except (TarFormatError, SampleError) as exn:
            offset = None if exn.offset is None else exn.offset + start
            raise type(exn)(exn.problem, url, exn.member, offset) from exn
        if len(samples) != 1:
            raise SampleError(f"the bytes where sample {index} was located hold {len(samples)} samples: the shard "
                              f"changed since it was walked", url, None, start)
        return samples[0]

    def close(self) -> None:
        while self._files:
            os.close(self._files.popitem()[1])


def read_positions(reader: SpanReader, refs: Iterable[Tuple[int, int, str]],
                   handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[Dict[str, Any]]:
    """The samples of ``refs`` (``(shard, index, url)`` triples) in order, read by ``reader`` (its
    owner closes it); a sample that cannot be read goes to ``handler`` (skipped when it returns True)."""
    for shard, index, url in refs:
        try:
            sample = reader.sample(shard, index, url)
        except Exception as exn:
            if handler(exn):
                continue
            return
        yield sample
