"""Shard lists: URL specs to URLs, and the sources and splitters that hand them out.

A source (``SimpleShardList``, ``ResampledShards``, ``MultiShardSample``,
``DirectoryShardList``) yields ``{"url": ...}`` dicts; a splitter
(``split_by_node``, ``split_by_worker``) is a plain generator function over
that stream, used as a pipeline stage without calling it, as in webdataset:
``DataPipeline(SimpleShardList(spec), split_by_worker, ...)``. As in webdataset,
the two plain sources expand a string spec with this module's ``expand_urls``,
and ``ResampledShards`` seeds with ``utils.pytorch_worker_seed``, each as it is
when the source is made.

This module holds the two plain sources and keeps webdataset's names; the
rest lives in one module per idea: spec expansion (``wdsmp.shards.urls``), stages
over the shard stream (``_shardstages``), ``MultiShardSample``
(``_multishard``) and ``DirectoryShardList`` (``_directoryshards``).
"""

import os
import random
import sys
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

from torch.utils.data import IterableDataset

from . import utils
from .shards.directory import DirectoryShardList, check_pid_is_running, get_pid_from_filename, without_last_extension
from .shards.multishard import MSSource, MultiShardSample, default_rng, expand
from ._internal.seeding import make_seed
from .shards.stages import non_empty, resampled, resampled_, single_node_only, split_by_node, split_by_worker
from .shards.urls import envlookup, envsubst, expand_source, expand_urls
from ._internal.validation import non_negative_int

__all__ = [
    "DirectoryShardList",
    "MSSource",
    "MultiShardSample",
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "check_pid_is_running",
    "default_rng",
    "envlookup",
    "envsubst",
    "expand",
    "expand_source",
    "expand_urls",
    "get_pid_from_filename",
    "non_empty",
    "resampled",
    "resampled_",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "without_last_extension",
]

# A shard spec: a string or path (brace patterns, "::" lists, globs), or URLs one by one.
_ShardSpec = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]


def _nonempty(urls: List[str], spec: Any) -> List[str]:
    if not urls:
        raise ValueError(f"no shards in shard spec {spec!r}")
    return urls


class SimpleShardList(IterableDataset):
    """Each shard URL once, as ``{"url": ...}``; shuffled the same way every time if seeded.

    ``seed=True`` picks a seed from the clock (webdataset's convention).
    """

    def __init__(self, urls: _ShardSpec, seed: Optional[Union[int, float, str, bytes, bytearray]] = None) -> None:
        super().__init__()
        self.urls = _nonempty(expand_urls(urls) if isinstance(urls, str) else expand_source(urls), urls)
        self.seed = time.time_ns() if seed is True else seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[Dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)  # webdataset's order for a seed
        for url in urls:
            yield {"url": url}


class ResampledShards(IterableDataset):
    """``nshards`` URLs drawn with replacement, as ``{"url": ...}``.

    Each ``__iter__`` is a new epoch. With ``deterministic=True`` the draws
    depend only on ``(worker_seed(), epoch, seed)`` -- by default the node
    rank, the DataLoader worker, the epoch and ``seed`` -- so every run draws
    the same shards; otherwise the process id, the clock and the OS add
    entropy. ``set_epoch(e)`` makes the next ``__iter__`` epoch ``e``: call it
    in the main process before each epoch, because DataLoader workers start
    from a fresh copy of the dataset and would otherwise all be in epoch 0.
    """

    def __init__(self, urls: _ShardSpec, nshards: int = sys.maxsize, seed: Any = 0,
                 worker_seed: Optional[Callable[[], Any]] = None, deterministic: bool = False,
                 max_urls: int = int(1e6), empty_check: bool = True) -> None:
        super().__init__()
        non_negative_int(nshards, "nshards")
        if worker_seed is not None and not callable(worker_seed):
            raise TypeError(f"worker_seed must be callable, not {worker_seed!r}")
        self.urls = expand_urls(urls) if isinstance(urls, str) else expand_source(urls, max_urls)
        if empty_check:
            _nonempty(self.urls, urls)
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = utils.pytorch_worker_seed if worker_seed is None else worker_seed
        self.deterministic = deterministic
        self.epoch = -1
        self._next_epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (later ones count on from it)."""
        self._next_epoch = int(epoch)

    def _epoch_seed(self) -> int:
        if self.deterministic:
            return make_seed(self.worker_seed(), self.epoch, self.seed)
        return make_seed(self.worker_seed(), self.epoch, self.seed, os.getpid(),
                         time.time_ns(), os.urandom(8))

    def __iter__(self) -> Iterator[Dict[str, str]]:
        if self._next_epoch is not None:
            self.epoch, self._next_epoch = self._next_epoch, None
        else:
            self.epoch += 1
        rng = random.Random(self._epoch_seed())
        urls = self.urls
        if not urls:
            return
        for _ in range(self.nshards):
            yield {"url": urls[rng.randrange(len(urls))]}


ResampledShardList = ResampledShards


def shardspec(spec: _ShardSpec) -> Union[MultiShardSample, SimpleShardList]:
    """A shard source for ``spec``: a ``MultiShardSample`` for a ``.yaml``/``.yml`` file, else a ``SimpleShardList``."""
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")):
        return MultiShardSample(spec)
    return SimpleShardList(spec)
