"""The samples of an epoch plan's shard ranges, and the buffer shuffle both loaders apply to them.

FastLoader's workers and the reference path's ``ExactSamples`` read the same
plan (``epochplan.py``) the same way, so that both make the same samples in
the same order from the same seed.
"""

import os
import warnings
from itertools import islice

from . import _env
from .cache import FileCache
from .gopen import gopen, local_path
from .handlers import reraise_exception
from .tariterators import tarfile_samples

__all__ = ["buffer_shuffled", "read_ranges"]


def read_ranges(ranges, handler=reraise_exception, cache_dir=None, clock=None):
    """The samples of each ``epochplan.ShardRange`` in turn: samples ``[start, stop)`` of its shard,
    opened directly or from the shard cache in ``cache_dir``.

    A range often ends before its shard does (a shard split between ranks or
    workers), and the cache keeps only shards read to their end, so a shard
    to be cached is first fetched whole: the rest of it is the next range's.
    A shard that cannot be cached (larger than the cache may hold, no room,
    another process fetching it for too long) is read directly, with a
    warning: caching never stops training. ``clock`` (a ``timing.ReadClock``)
    gets the time spent fetching, opening and reading the shards' bytes.
    """
    for shard in ranges:
        opener = gopen
        if cache_dir is not None:
            cache = FileCache(cache_dir, verbose=_env.gopen_verbose())
            try:
                if clock is None or local_path(shard.url) is not None:  # local files are not cached
                    cache.get_file(shard.url)
                else:
                    clock.cache_fetch(cache.get_file, shard.url, os.path.exists(cache.entry_path(shard.url)))
                opener = cache.open
            except Exception as exn:  # an unreadable source fails again below, through the handler
                warnings.warn(f"could not cache {shard.url} in {cache_dir} ({exn}); reading it directly")
        if clock is not None:
            opener = clock.timed_opener(opener)
        samples = tarfile_samples([shard.url], handler=handler, opener=opener)
        try:
            yield from islice(samples, shard.start, shard.stop)
        finally:
            samples.close()


def buffer_shuffled(samples, size, rng):
    """``samples`` in a random order through a buffer of ``size``: all of them, each once, the
    order fixed by ``rng``."""
    buffer = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        buffer[i], sample = sample, buffer[i]
        yield sample
    rng.shuffle(buffer)
    yield from buffer
