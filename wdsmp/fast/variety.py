"""A warning for batches whose labels are far less varied than a shuffle would make them.

Shards written in label order (as ``ImageFolder`` lists the files) and read
shard by shard, with a shuffle buffer, give batches of a few labels each: the
loss and BatchNorm then see another distribution than the data's, and training
suffers without a word. Where the loader cannot shuffle every sample (streamed
shards: ``order="shards"``), it watches the labels of the first batches it
hands out and warns once when they are much less varied than uniform draws of
the same labels would be.
"""

import warnings
from typing import Any, List, Optional

import numpy as np

__all__ = ["LabelVariety", "expected_distinct"]

BATCHES = 16  # batches watched: enough for a median, few enough to cost nothing
MIN_EXPECTED = 3  # judged only where uniform batches would hold at least this many labels
THRESHOLD = 0.7  # warn below this share of the distinct labels a uniform draw gives (well-mixed batches: ~1.0)


def expected_distinct(counts: Any, batch_size: int) -> float:
    """The mean number of distinct labels in ``batch_size`` draws, with replacement, from labels
    seen ``counts`` times each: the sum over labels of 1 - (1 - p) ** batch_size."""
    p = np.asarray(counts, dtype=np.float64)
    p = p / p.sum()
    return float(np.sum(1.0 - (1.0 - p) ** batch_size))


class LabelVariety:
    """Watches the labels of the first ``BATCHES`` full batches; ``why`` (text, may be None) says
    why the loader reads shard by shard, for the warning."""

    def __init__(self, why: Optional[str] = None) -> None:
        self.why = why
        self.distinct: List[int] = []
        self.labels: List[np.ndarray] = []
        self.done = False

    def observe(self, labels: Any) -> None:
        """The labels of a batch handed out (a 1-d integer array)."""
        if self.done:
            return
        labels = np.asarray(labels).reshape(-1)
        self.distinct.append(len(np.unique(labels)))
        self.labels.append(labels.copy())
        if len(self.distinct) == BATCHES:
            self.done = True
            self._judge(len(labels))

    def _judge(self, batch_size: int) -> None:
        _, counts = np.unique(np.concatenate(self.labels), return_counts=True)
        self.labels = []
        uniform = expected_distinct(counts, batch_size)
        seen = float(np.median(self.distinct))
        if uniform < MIN_EXPECTED or seen >= THRESHOLD * uniform:
            return  # too few labels per batch for a median of small counts to tell, or varied enough
        because = f" (the loader reads shard by shard: {self.why})" if self.why else ""
        warnings.warn(
            f"the first {BATCHES} batches hold a median of {seen:g} distinct labels, where batches drawn "
            f"uniformly from the same labels would hold about {uniform:.0f}: the shards are probably written in "
            f"label order{because}. Training may suffer. Fixes: read local or cached shards in global order "
            f"(cache_dir=... for remote shards, with order='global'), reshuffle the shards once "
            f"(wdsmp split --shuffle), or raise shuffle_buffer", RuntimeWarning, stacklevel=4)
