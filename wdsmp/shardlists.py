"""Shard lists: URL specs to URLs, and the sources and splitters that hand them out.

A source (``SimpleShardList``, ``ResampledShards``) yields ``{"url": ...}``
dicts; a splitter (``split_by_node``, ``split_by_worker``) is a plain generator
function over that stream, used as a pipeline stage without calling it, as in
webdataset: ``DataPipeline(SimpleShardList(spec), split_by_worker, ...)``.
"""

import glob
import os
import random
import re
import sys
import time
import warnings
from itertools import islice

import braceexpand
from torch.utils.data import IterableDataset

from . import _env, utils
from .gopen import local_path

__all__ = [
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "envsubst",
    "expand_source",
    "expand_urls",
    "non_empty",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
]

# "::" separates shard specs, except inside [...] (an IPv6 host such as [::1]).
_LIST_SEPARATOR = re.compile(r"::(?![^\[]*\])")
_VARIABLE = re.compile(r"\$\{(\w+)\}")


def _lookup(match):
    value = _env.wds_variable(match.group(1))
    if value is None:
        raise ValueError(f"shard spec uses ${{{match.group(1)}}} but WDS_{match.group(1)} is not set")
    return value


def envsubst(spec):
    """Replace ``${name}`` with the environment variable ``WDS_name`` (webdataset's rule)."""
    for _ in range(10):  # values may name further variables; bounded, so no cycles
        expanded = _VARIABLE.sub(_lookup, spec)
        if expanded == spec:
            break
        spec = expanded
    return spec


def _braces(spec):
    try:
        return list(braceexpand.braceexpand(spec))
    except braceexpand.UnbalancedBracesError as exn:
        raise ValueError(f"unbalanced braces in shard spec {spec!r}") from exn


def _globbed(url):
    """A local glob pattern becomes the sorted files it matches; anything else stays."""
    if "{" in url or local_path(url) != url or not glob.has_magic(url) or os.path.exists(url):
        return [url]  # a URL with a scheme, an escaped brace, or a literal file name
    matches = sorted(glob.glob(url))
    if not matches:
        raise ValueError(f"shard pattern {url!r} matches no files")
    return matches


def expand_urls(urls):
    """A shard spec to a list of URLs.

    A string is split at ``::``, gets ``${name}`` replaced by ``WDS_name`` and
    is brace-expanded (``"a-{000..009}.tar::b-{0..3}.tar"``); each element of a
    list is brace-expanded. Local paths with ``*``, ``?`` or ``[...]`` are then
    globbed, sorted; a pattern matching nothing is a ValueError.
    """
    if isinstance(urls, (str, os.PathLike)):
        specs = [envsubst(s) for s in _LIST_SEPARATOR.split(os.fspath(urls))]
    else:
        specs = [os.fspath(u) if isinstance(u, os.PathLike) else u for u in urls]
    result = []
    for spec in specs:
        if not isinstance(spec, str):
            raise TypeError(f"shard URLs must be strings, not {type(spec).__name__}: {spec!r}")
        for url in _braces(spec):
            result.extend(_globbed(url))
    return result


def expand_source(source, max_urls=int(1e9)):
    """A spec (string or list, see ``expand_urls``) or any iterable of URLs to a list."""
    if isinstance(source, (str, os.PathLike, list, tuple)):
        return expand_urls(source)
    if utils.is_iterable(source):
        return expand_urls(list(islice(source, max_urls)))
    raise TypeError(f"cannot make shard URLs from {type(source).__name__}: {source!r}")


def _nonempty(urls, spec):
    if not urls:
        raise ValueError(f"no shards in shard spec {spec!r}")
    return urls


class SimpleShardList(IterableDataset):
    """Each shard URL once, as ``{"url": ...}``; shuffled the same way every time if seeded.

    ``seed=True`` picks a seed from the clock (webdataset's convention).
    """

    def __init__(self, urls, seed=None):
        super().__init__()
        self.urls = _nonempty(expand_source(urls), urls)
        self.seed = time.time_ns() if seed is True else seed

    def __len__(self):
        return len(self.urls)

    def __iter__(self):
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

    def __init__(self, urls, nshards=sys.maxsize, seed=0, worker_seed=None,
                 deterministic=False, max_urls=int(1e6), empty_check=True):
        super().__init__()
        if not isinstance(nshards, int) or nshards < 0:
            raise ValueError(f"nshards must be a non-negative int, not {nshards!r}")
        if worker_seed is not None and not callable(worker_seed):
            raise TypeError(f"worker_seed must be callable, not {worker_seed!r}")
        self.urls = expand_source(urls, max_urls)
        if empty_check:
            _nonempty(self.urls, urls)
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = utils.pytorch_worker_seed if worker_seed is None else worker_seed
        self.deterministic = deterministic
        self.epoch = -1
        self._next_epoch = None

    def set_epoch(self, epoch):
        """Make the next iteration epoch ``epoch`` (later ones count on from it)."""
        self._next_epoch = int(epoch)

    def _epoch_seed(self):
        if self.deterministic:
            return utils.make_seed(self.worker_seed(), self.epoch, self.seed)
        return utils.make_seed(self.worker_seed(), self.epoch, self.seed, os.getpid(),
                               time.time_ns(), os.urandom(8))

    def __iter__(self):
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


def _split(src, index, count, what):
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


def split_by_node(src, group=None):
    """This node's share of the shards: every ``world_size``-th one from ``rank``."""
    rank, world_size, _, _ = utils.pytorch_worker_info(group=group)
    yield from _split(src, rank, world_size, "node")


def split_by_worker(src):
    """This DataLoader worker's share of the shards: every ``num_workers``-th from ``worker``.

    Shards are streamed, never collected, so it works on endless resampled
    sources too; a worker left without shards warns once its input ends.
    """
    _, _, worker, num_workers = utils.pytorch_worker_info()
    yield from _split(src, worker, num_workers, "worker")


def single_node_only(src, group=None):
    """Pass shards through, refusing to run on several nodes (each would see every shard)."""
    _, world_size, _, _ = utils.pytorch_worker_info(group=group)
    if world_size > 1:
        raise ValueError(f"single_node_only: running on {world_size} nodes; add a node "
                         f"splitter (split_by_node) to the pipeline for multi-node training")
    yield from src


def non_empty(src):
    """Pass items through; raise if none came, rather than train on nothing."""
    count = 0
    for item in src:
        count += 1
        yield item
    if count == 0:
        raise ValueError("non_empty: no shards (or samples) reached this pipeline stage")
