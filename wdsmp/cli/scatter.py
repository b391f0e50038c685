"""A uniform shuffle of any number of samples in bounded memory: ``wdsmp split/cat --shuffle --memory``.

Two passes, the scatter shuffle (Rao, 1961; Sandelius, 1962): the samples are
first dealt at random into K temporary shards, each sample to each shard with
the same chance; then each temporary shard, small enough for ``memory``, is
read back, permuted in memory and written out, one after the other. Every
order of the samples is then equally likely, exactly as if they had all been
shuffled in memory. A temporary shard that came out larger than ``memory`` (chance,
or K too small for the data) is scattered again the same way. The temporary
shards live in a hidden directory beside the output and go when the run ends,
failed or not.
"""

import collections
import math
import os
import shutil
import tempfile

from ..writer import TarWriter
from .listing import read_samples

__all__ = ["bucket_count", "scatter_shuffled"]

MAX_BUCKETS = 256  # temporary shards open at once: well inside the usual limit of 1,024 files


def bucket_count(data_bytes, memory):
    """K for ``data_bytes`` of samples (None: unknown) and ``memory`` bytes: temporary shards of
    half the memory on average, so that few need a second scatter."""
    if data_bytes is None:
        return 16
    return max(2, min(MAX_BUCKETS, math.ceil(2 * data_bytes / memory)))


def scatter_shuffled(samples, memory, rng, directory, buckets):
    """``samples`` (dicts of bytes, as ``read_samples`` gives them) in a uniformly random order
    drawn from ``rng``, holding at most about ``memory`` bytes of them at once; temporary shards
    in ``directory``, ``buckets`` of them per scatter."""
    temporary = tempfile.mkdtemp(prefix=".wdsmp-shuffle-", dir=directory)
    try:
        yield from _scatter(samples, memory, rng, temporary, buckets)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _scatter(samples, memory, rng, directory, buckets):
    paths = [os.path.join(directory, f"{i:03d}.tar") for i in range(buckets)]
    sizes, counts = [0] * buckets, [0] * buckets
    writers = [TarWriter(open(path, "wb"), encoder=False, keep_meta=True) for path in paths]
    try:
        for sample in samples:
            i = rng.randrange(buckets)
            sizes[i] += writers[i].write(sample)
            counts[i] += 1
    finally:
        for writer in writers:
            writer.close()
    for i, path in enumerate(paths):
        if counts[i] <= 1 or sizes[i] <= memory:  # one sample larger than memory is held all the same
            held = list(read_samples([path], collections.Counter()))
            os.unlink(path)
            rng.shuffle(held)
            while held:  # each sample let go once written
                yield held.pop()
        else:
            deeper = os.path.join(directory, f"{i:03d}")
            os.mkdir(deeper)
            yield from _scatter(read_samples([path], collections.Counter()), memory, rng, deeper, buckets)
            os.unlink(path)
