"""Mixing several datasets into one stream: ``RandomMix`` and ``RoundRobin``.

Both are IterableDatasets, so they serve as the first stage of a
``DataPipeline`` (``DataPipeline(RandomMix([a, b], [0.7, 0.3]), ...)``) or
directly as a DataLoader's dataset. By default a mix ends when the first
source runs out, so no source is over-represented at the end of an epoch;
``longest=True`` goes on with the remaining sources until all are exhausted.

``RandomMix`` picks the source of each item at random, in proportion to
``probs``. Without a seed it draws from Python's global ``random`` (as
webdataset does, so ``random.seed`` and torch's per-worker seeding apply).
With ``seed=`` its picks depend only on that seed, the epoch and the node and
DataLoader worker running it (``make_seed(seed, epoch, rank, worker)``, read
when iteration starts), so a run is reproducible while every worker mixes
differently. Like ``ResampledShards``, each ``__iter__`` is a new epoch unless
``set_epoch`` said which; ``set_epoch`` is passed on to the mixed datasets.
"""

import bisect
import math
import random
from typing import Any, Iterable, Iterator, List, Optional

from torch.utils.data import IterableDataset

from . import utils
from .utils import make_seed

__all__ = [
    "RandomMix",
    "RoundRobin",
    "random_samples",
    "round_robin_longest",
    "round_robin_shortest",
]


def round_robin_shortest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each iterator in turn, until the first one that is asked runs out."""
    i = 0
    while True:
        try:
            item = next(sources[i % len(sources)])
        except StopIteration:
            return
        yield item
        i += 1


def round_robin_longest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each iterator in turn, dropping exhausted ones, until none is left."""
    live = list(sources)
    i = 0
    while live:
        i %= len(live)
        try:
            item = next(live[i])
        except StopIteration:
            del live[i]  # the next source moves into place i
            continue
        yield item
        i += 1


def _checked_probs(probs: Optional[Iterable[float]], n: int) -> List[float]:
    """``probs`` as a list of ``n`` finite non-negative floats, or ValueError."""
    if probs is None:
        return [1.0] * n
    probs = list(probs)
    if len(probs) != n:
        raise ValueError(f"got {len(probs)} probabilities for {n} datasets")
    for i, p in enumerate(probs):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise ValueError(f"probability {i} must be a finite number >= 0, not {p!r}")
    if n and sum(probs) <= 0:
        raise ValueError("the probabilities must not all be zero")
    return [float(p) for p in probs]


def random_samples(sources: Iterable[Iterator[Any]], probs: Optional[Iterable[float]] = None, longest: bool = False,
                   rng: Optional[random.Random] = None) -> Iterator[Any]:
    """Items from iterators picked at random in proportion to ``probs``.

    Ends when a picked source is exhausted, or with ``longest=True`` when every
    source that can still be picked (probability > 0) is. ``rng`` is a
    ``random.Random``; by default the global one.
    """
    sources = list(sources)
    probs = _checked_probs(probs, len(sources))
    draw = random.random if rng is None else rng.random
    while True:
        live = [i for i, p in enumerate(probs) if p > 0]
        if not live:
            return
        cumulative = []
        total = 0.0
        for i in live:
            total += probs[i]
            cumulative.append(total)
        while True:
            pick = live[min(bisect.bisect_right(cumulative, draw() * total), len(live) - 1)]
            try:
                item = next(sources[pick])
            except StopIteration:
                if not longest:
                    return
                probs[pick] = 0.0
                break  # recompute the weights of the sources left
            yield item


def _set_epoch(datasets: Iterable[Any], epoch: int) -> None:
    for dataset in datasets:
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)


class RoundRobin(IterableDataset):
    """Items of ``datasets`` taken in turn; see the module docstring for ``longest``."""

    def __init__(self, datasets: Iterable[Iterable[Any]], longest: bool = False) -> None:
        super().__init__()
        self.datasets = list(datasets)
        self.longest = longest

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the datasets that take one."""
        _set_epoch(self.datasets, epoch)

    def __iter__(self) -> Iterator[Any]:
        sources = [iter(d) for d in self.datasets]
        if not sources:
            return iter(())
        if self.longest:
            return round_robin_longest(*sources)
        return round_robin_shortest(*sources)


class RandomMix(IterableDataset):
    """Items of ``datasets`` picked at random in proportion to ``probs``.

    ``probs`` defaults to equal weights; they need not sum to 1. See the
    module docstring for ``longest``, ``seed`` and epochs.
    """

    def __init__(self, datasets: Iterable[Iterable[Any]], probs: Optional[Iterable[float]] = None,
                 longest: bool = False, seed: Any = None) -> None:
        super().__init__()
        self.datasets = list(datasets)
        self.probs = _checked_probs(probs, len(self.datasets))
        self.longest = longest
        self.seed = seed
        self.epoch = -1
        self._next_epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``, here and in the mixed datasets."""
        self._next_epoch = int(epoch)
        _set_epoch(self.datasets, epoch)

    def epoch_probs(self, epoch: int) -> List[float]:
        """The mixing weights of an epoch: ``probs`` (subclasses may vary them)."""
        return self.probs

    def _rng(self) -> Optional[random.Random]:
        if self.seed is None:
            return None
        rank, _, worker, _ = utils.pytorch_worker_info()
        return random.Random(make_seed(self.seed, self.epoch, rank, worker))

    def __iter__(self) -> Iterator[Any]:
        if self._next_epoch is not None:
            self.epoch, self._next_epoch = self._next_epoch, None
        else:
            self.epoch += 1
        sources = [iter(d) for d in self.datasets]
        return random_samples(sources, self.epoch_probs(self.epoch), longest=self.longest,
                              rng=self._rng())
