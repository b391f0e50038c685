"""A uniform shuffle of any number of samples in bounded memory: ``wdsmp split/cat --shuffle --memory``.

Two passes, the scatter shuffle (Rao, 1961; Sandelius, 1962): the samples are
first dealt at random into K temporary shards, each sample to each shard with
the same chance; then each temporary shard, small enough for ``memory``, is
read back, permuted in memory and written out, one after the other. Every
order of the samples is then equally likely, exactly as if they had all been
shuffled in memory. A temporary shard that came out larger than ``memory``
(chance, or K too small for the data) is scattered again the same way.

In a temporary shard each sample goes under a key of its own (its number),
its own key kept in a list beside the shard: inputs often repeat keys from
shard to shard (``000000`` in every one), which one tar cannot hold as
separate samples. The temporary shards live in a hidden directory beside the
output (or in the current directory) and go when the run ends, failed or not;
a killed run leaves its ``.wdsmp-shuffle-*`` directory behind.
"""

import collections
import json
import math
import os
import random
import shutil
import tempfile
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional

from ..writer import TarWriter
from .listing import read_samples

__all__ = ["bucket_count", "scatter_shuffled"]

MAX_BUCKETS = 256  # temporary shards open at once: well inside the usual limit of 1,024 files


def bucket_count(data_bytes: Optional[int], memory: int) -> int:
    """K for ``data_bytes`` of samples (None: unknown) and ``memory`` bytes: temporary shards of
    half the memory on average, so that few need a second scatter."""
    if data_bytes is None:
        return 16
    return max(2, min(MAX_BUCKETS, math.ceil(2 * data_bytes / memory)))


def scatter_shuffled(samples: Iterable[Dict[str, Any]], memory: int, rng: random.Random, directory: str,
                     buckets: int) -> Iterator[Dict[str, Any]]:
    """``samples`` (dicts of bytes, as ``read_samples`` gives them) in a uniformly random order
    drawn from ``rng``, holding at most about ``memory`` bytes of them at once; temporary shards
    in ``directory``, ``buckets`` of them for the first scatter."""
    temporary = tempfile.mkdtemp(prefix=".wdsmp-shuffle-", dir=directory)
    try:
        yield from _scatter(samples, memory, rng, temporary, buckets)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


class _Bucket:
    """A temporary shard and the list of its samples' own keys beside it."""

    def __init__(self, path: str) -> None:
        self.path, self.size, self.count = path, 0, 0
        self.writer = TarWriter(open(path, "wb"), encoder=False, keep_meta=True)
        self.keys = open(path + ".keys", "w")

    def write(self, sample: Mapping[str, Any]) -> None:
        self.keys.write(json.dumps(sample["__key__"]) + "\n")
        self.size += self.writer.write(dict(sample, __key__=f"{self.count:012d}"))
        self.count += 1

    def close(self) -> None:
        self.writer.close()
        self.keys.close()

    def samples(self) -> Iterator[Dict[str, Any]]:
        """The samples written, in order, with their own keys."""
        with open(self.path + ".keys") as keys:
            for sample, key in zip(read_samples([self.path], collections.Counter()), keys):
                sample["__key__"] = json.loads(key)
                yield sample

    def remove(self) -> None:
        os.unlink(self.path)
        os.unlink(self.path + ".keys")


def _scatter(samples: Iterable[Dict[str, Any]], memory: int, rng: random.Random, directory: str,
             buckets: int) -> Iterator[Dict[str, Any]]:
    parts = [_Bucket(os.path.join(directory, f"{i:03d}.tar")) for i in range(buckets)]
    try:
        for sample in samples:
            parts[rng.randrange(buckets)].write(sample)
    finally:
        for part in parts:
            part.close()
    for i, part in enumerate(parts):
        if part.count <= 1 or part.size <= memory:  # one sample larger than memory is held all the same
            held = list(part.samples())
            part.remove()
            rng.shuffle(held)
            while held:  # each sample let go once written
                yield held.pop()
        else:
            deeper = os.path.join(directory, f"{i:03d}")
            os.mkdir(deeper)
            yield from _scatter(part.samples(), memory, rng, deeper, bucket_count(part.size, memory))
            part.remove()
