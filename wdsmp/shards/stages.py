"""Pipeline stages over the stream of shards: each node's and worker's share, checks, resampling.

Splitters are plain generator functions over ``{"url": ...}`` dicts, used as
stages without calling them, as in webdataset:
``DataPipeline(SimpleShardList(spec), split_by_worker, ...)``. They ask
``wdsmp.utils.pytorch_worker_info`` as it is when they run, so a replacement
assigned there decides the shares, as in webdataset.
"""

import random
import sys
import warnings
from typing import Any, Iterable, Iterator, TypeVar

from .. import utils
from ..stages.base import pipelinefilter
from .._internal.validation import non_negative_int

__all__ = ["non_empty", "resampled", "resampled_", "single_node_only", "split_by_node", "split_by_worker"]

_T = TypeVar("_T")


def _split(src: Iterable[_T], index: int, count: int, what: str) -> Iterator[_T]:
    """Every ``count``-th item from ``index``; warns when this share turns out empty."""
    if count <= 1:
        yield from src
        return
    total = taken = 0
    for i, item in enumerate(src):
        total = i + 1
        if i % count == index:
            taken += 1
            yield item
    if taken == 0:
        warnings.warn(f"{what} {index} of {count} received no shards: there were only "
                      f"{total} shards for {count} {what}s", UserWarning, stacklevel=2)


def split_by_node(src: Iterable[_T], group: Any = None) -> Iterator[_T]:
    """This node's share of the shards: every ``world_size``-th one from ``rank``."""
    rank, world_size, _, _ = utils.pytorch_worker_info(group=group)
    yield from _split(src, rank, world_size, "node")


def split_by_worker(src: Iterable[_T]) -> Iterator[_T]:
    """This DataLoader worker's share of the shards: every ``num_workers``-th from ``worker``.

    Shards are streamed, never collected, so it works on endless resampled
    sources too; a worker left without shards warns once its input ends.
    """
    _, _, worker, num_workers = utils.pytorch_worker_info()
    yield from _split(src, worker, num_workers, "worker")


def single_node_only(src: Iterable[_T], group: Any = None) -> Iterator[_T]:
    """Pass shards through, refusing to run on several nodes (each would see every shard)."""
    _, world_size, _, _ = utils.pytorch_worker_info(group=group)
    if world_size > 1:
        raise ValueError(f"single_node_only: running on {world_size} nodes; add a node "
                         f"splitter (split_by_node) to the pipeline for multi-node training")
    yield from src


def non_empty(src: Iterable[_T]) -> Iterator[_T]:
    """Pass items through; raise if none came, rather than train on nothing."""
    count = 0
    for item in src:
        count += 1
        yield item
    if count == 0:
        raise ValueError("non_empty: no shards (or samples) reached this pipeline stage")


def resampled_(src: Iterable[_T], n: int = sys.maxsize, seed: Any = None) -> Iterator[_T]:
    """``n`` items drawn with replacement from everything ``src`` yields (all of it is read first).

    ``seed=None`` draws from OS entropy, as webdataset does; give a seed for
    the same draws on every run.
    """
    non_negative_int(n, "resampled: n")
    items = list(src)
    if not items and n > 0:
        raise ValueError("resampled: the upstream stage yielded nothing to resample")
    rng = random.Random(seed)
    for _ in range(n):
        yield items[rng.randrange(len(items))]


resampled = pipelinefilter(resampled_)
