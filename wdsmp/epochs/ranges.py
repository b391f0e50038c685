"""The samples of an epoch plan's shard ranges, and the buffer shuffle both loaders apply to them.

FastLoader's workers and the reference path's ``ExactSamples`` read the same
plan (``wdsmp/epochs/plan.py``) the same way, so that both make the same samples in
the same order from the same seed.
"""

from __future__ import annotations

import os
import random
import warnings
from itertools import islice
from typing import Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, TypeVar, cast

from .._internal import env
from ..cache import FileCache
from .._internal.redact import redacted
from .._internal.timing import ReadClock
from ..gopen import gopen, local_path, local_shard_stat
from ..handlers import reraise_exception
from ..tariterators import tarfile_samples
from .plan import ShardRange

__all__ = ["buffer_shuffled", "read_ranges"]

_T = TypeVar("_T")


def read_ranges(ranges: Iterable[ShardRange], handler: Callable[[Exception], Any] = reraise_exception,
                cache_dir: Optional[str] = None, clock: Optional[ReadClock] = None,
                counts: Optional[Sequence[Optional[int]]] = None) -> Iterator[Dict[str, Any]]:
    """The samples of each ``epochplan.ShardRange`` in turn: samples ``[start, stop)`` of its shard,
    opened directly or from the shard cache in ``cache_dir``.

    A range often ends before its shard does (a shard split between ranks or
    workers), and the cache keeps only shards read to their end, so a shard
    to be cached is first fetched whole: the rest of it is the next range's.
    A shard that cannot be cached (larger than the cache may hold, no room,
    another process fetching it for too long) is read directly, with a
    warning: caching never stops training; one found too large is not fetched
    for the cache again by this process (``_cacheentry.known_too_big``). ``clock`` (a ``timing.ReadClock``)
    gets the time spent fetching, opening and reading the shards' bytes.

    ``counts`` (each shard's sample count by its number, those the plan was
    made from) checks them: a shard that ends before a range of it does, or
    has samples after a range that ends at its count, gets a warning naming
    it and both counts (NOTE [stale counts]). Samples past the count are read, counted and dropped; samples
    missing are missing: the caller pads.

    A local shard is checked before it is opened (``gopen.local_shard_stat``): one that has
    become a directory, a symlink loop, a FIFO or a device since the loader was made is an
    error naming what it is, through ``handler``, never a read that blocks or never ends.
    """
    for shard in ranges:
        damaged: List[Exception] = []

        def noted(exn: Exception) -> Any:
            damaged.append(exn)  # a shard cut short by damage is not a stale count
            return handler(exn)

        opener: Callable[..., Any] = gopen
        if cache_dir is not None:
            cache = FileCache(cache_dir, verbose=env.gopen_verbose())
            try:
                if clock is None or local_path(shard.url) is not None:  # local files are not cached
                    cache.get_file(shard.url)
                else:
                    clock.cache_fetch(cache.get_file, shard.url, os.path.exists(cache.entry_path(shard.url)))
                opener = cache.open
            except Exception as exn:  # an unreadable source fails again below, through the handler
                warnings.warn(f"could not cache {redacted(shard.url)} in {cache_dir} ({exn}); reading it directly")
        if clock is not None:
            opener = clock.timed_opener(opener)
        samples = cast(Generator[Dict[str, Any], None, None],  # a generator: closing it closes the shard
                       tarfile_samples([shard.url], handler=noted, opener=_checked(opener)))
        try:
            if counts is None or shard.stop is None or counts[shard.shard] is None:
                yield from islice(samples, shard.start, shard.stop)
            else:
                yield from _counted(samples, shard, cast(int, counts[shard.shard]), damaged)
        finally:
            samples.close()


def _checked(opener: Callable[..., Any]) -> Callable[..., Any]:
    """``opener``, applying the rule for local shard files (``gopen.local_shard_stat``) first."""

    def opened(url: str, **kw: Any) -> Any:
        path = local_path(url)
        if path is not None:
            local_shard_stat(path, url)
        return opener(url, **kw)

    return opened


def _counted(samples: Iterable[Dict[str, Any]], shard: ShardRange, count: int,
             damaged: Sequence[Exception]) -> Iterator[Dict[str, Any]]:
    """Samples ``[start, stop)`` of ``shard``, with a warning when the shard has not ``count``
    samples.

    NOTE [stale counts]: an index made before a shard was rewritten gives the
    plan a wrong count. The plan is what it is (every rank computed the same
    one, so changing it here would break the equal batch counts that keep DDP's
    ranks together): samples past the count are skipped this epoch, samples
    the shard lacks are missing (the loader pads their rows). Both are said
    in a warning that names the shard and both counts, as soon as a range
    meets the shard's real end. A range that ends at the count holds its last
    sample back until the next read says whether the shard ends there: a
    reader that stops at its planned last sample (a stream's last batch) would
    otherwise never see the samples past it.
    """
    assert shard.stop is not None  # read_ranges counts only ranges that end at a known sample
    position = 0  # samples of the shard seen, from its start
    last: Optional[Dict[str, Any]] = None  # the range's last sample, where the range ends at the count
    for sample in samples:
        if position >= shard.stop:
            if shard.stop < count:
                return  # the rest of the shard is another range's
        elif position + 1 == shard.stop == count and position >= shard.start:
            last = sample
        elif position >= shard.start:
            yield sample
        position += 1
    if not damaged and not shard.stop <= position <= count:  # read as planned, or the shortfall is another range's
        stale = (f"stale sample count: shard {redacted(shard.url)!r} has {position} samples, not the {count} the "
                 f"epoch was planned with")
        if position > count:
            warnings.warn(f"{stale}; its last {position - count} are skipped this epoch. Rebuild the index "
                          f"(wdsmp index)")
        else:
            warnings.warn(f"{stale}; {shard.stop - max(position, shard.start)} of the samples planned from it "
                          f"({shard.start}..{shard.stop - 1}) are not there, and their rows are padded with repeats "
                          f"so that every rank still gets its planned batches. Rebuild the index (wdsmp index)")
    if last is not None:
        yield last


def buffer_shuffled(samples: Iterable[_T], size: int, rng: random.Random) -> Iterator[_T]:
    """``samples`` in a random order through a buffer of ``size``: all of them, each once, the
    order fixed by ``rng``."""
    buffer: List[_T] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        buffer[i], sample = sample, buffer[i]
        yield sample
    rng.shuffle(buffer)
    yield from buffer
