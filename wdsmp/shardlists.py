"""Shard lists: URL specs to URLs, and the sources and splitters that hand them out.

A source (``SimpleShardList``, ``ResampledShards``, ``MultiShardSample``,
``DirectoryShardList``) yields ``{"url": ...}`` dicts; a splitter
(``split_by_node``, ``split_by_worker``) is a plain generator function over
that stream, used as a pipeline stage without calling it, as in webdataset:
``DataPipeline(SimpleShardList(spec), split_by_worker, ...)``.
"""

import glob
import os
import random
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from itertools import islice
from typing import List

import braceexpand
from torch.utils.data import IterableDataset

from . import _env, utils
from ._process import pid_alive
from ._stages import pipelinefilter
from .gopen import local_path

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

# "::" separates shard specs, except inside [...] (an IPv6 host such as [::1]).
_LIST_SEPARATOR = re.compile(r"::(?![^\[]*\])")
_VARIABLE = re.compile(r"\$\{(\w+)\}")


def envlookup(match):
    """The value of ``WDS_<name>`` for a ``${name}`` regex match; ValueError when it is unset."""
    value = _env.wds_variable(match.group(1))
    if value is None:
        raise ValueError(f"shard spec uses ${{{match.group(1)}}} but WDS_{match.group(1)} is not set")
    return value


def envsubst(spec):
    """Replace ``${name}`` with the environment variable ``WDS_name`` (webdataset's rule)."""
    for _ in range(10):  # values may name further variables; bounded, so no cycles
        expanded = _VARIABLE.sub(envlookup, spec)
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


# -- resampling any stream


def resampled_(src, n=sys.maxsize, seed=None):
    """``n`` items drawn with replacement from everything ``src`` yields (all of it is read first).

    ``seed=None`` draws from OS entropy, as webdataset does; give a seed for
    the same draws on every run.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"resampled: n must be a non-negative int, not {n!r}")
    items = list(src)
    if not items and n > 0:
        raise ValueError("resampled: the upstream stage yielded nothing to resample")
    rng = random.Random(seed)
    for _ in range(n):
        yield items[rng.randrange(len(items))]


resampled = pipelinefilter(resampled_)


# -- MultiShardSample: a YAML (or dict) spec of several datasets


@dataclass
class MSSource:
    """One dataset of a ``MultiShardSample`` spec; an epoch takes ``resample`` draws
    with replacement if positive, else ``perepoch`` distinct URLs if positive, else all."""

    name: str = ""
    perepoch: int = -1
    resample: int = -1
    urls: List[str] = field(default_factory=list)


default_rng = random.Random()  # shared by unseeded MultiShardSamples, as in webdataset


def expand(s):
    """``s`` with ``$VAR``/``${VAR}`` and a leading ``~`` expanded (for spec prefixes and buckets)."""
    return os.path.expanduser(os.path.expandvars(s))


_SPEC_KEYS = ("prefix", "datasets", "buckets")
_DATASET_KEYS = ("name", "shards", "buckets", "resample", "choose")


def _check_keys(mapping, allowed, where):
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(allowed)}, "
                         f"not {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(allowed: {', '.join(allowed)})")


def _strings(value, where, key):
    """A str or a list of str, as a list."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: {key!r} must be a string or a list of strings, not {value!r}")
    return values


def _count(ds, key, where):
    value = ds.get(key, -1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {key!r} must be an int, not {value!r}")
    return value


def _parse_dataset(ds, index, spec, prefix, origin):
    where = f"{origin}: datasets[{index}]"
    if isinstance(ds, dict) and isinstance(ds.get("name"), str):
        where += f" ({ds['name']!r})"
    _check_keys(ds, _DATASET_KEYS, where)
    if "shards" not in ds:
        raise ValueError(f"{where}: missing key 'shards'")
    buckets = [expand(b) for b in _strings(ds.get("buckets", spec.get("buckets", [])), where, "buckets")]
    if len(buckets) > 1:
        raise ValueError(f"{where}: 'buckets' names {len(buckets)} buckets; only one per dataset is supported")
    bucket = buckets[0] if buckets else ""
    name = ds.get("name", "@" + bucket)
    if not isinstance(name, str):
        raise ValueError(f"{where}: 'name' must be a string, not {name!r}")
    try:
        urls = [prefix + os.path.join(bucket, url)
                for shards in _strings(ds["shards"], where, "shards")
                for url in braceexpand.braceexpand(expand(shards))]
    except braceexpand.UnbalancedBracesError as exn:
        raise ValueError(f"{where}: 'shards' has unbalanced braces") from exn
    if not urls:
        raise ValueError(f"{where}: 'shards' names no shards")
    resample, choose = _count(ds, "resample", where), _count(ds, "choose", where)
    if resample > 0 and choose > 0:
        raise ValueError(f"{where}: give only one of 'resample' ({resample}) and 'choose' ({choose})")
    if choose > len(urls):
        raise ValueError(f"{where}: 'choose' is {choose} but the dataset has only {len(urls)} shards")
    return MSSource(name=name, urls=urls, perepoch=choose, resample=resample)


class MultiShardSample(IterableDataset):
    """Shards of several datasets, each contributing a chosen number per epoch.

    ``fname`` is a YAML file (or the dict it would hold)::

        prefix: s3://bucket/          # optional, before every URL ($VARS and ~ expanded)
        buckets: data/                # optional default bucket (a directory in prefix)
        datasets:
          - name: big                 # optional, defaults to "@" + bucket
            shards: big-{000..099}.tar   # a string or a list, brace-expanded
            choose: 10                # optional: 10 distinct shards per epoch
          - shards: small-{0..3}.tar
            resample: 20              # optional: 20 draws with replacement per epoch

    Without ``choose`` or ``resample`` a dataset gives all its shards; the
    epoch's shards are then shuffled together. A malformed spec is a
    ValueError naming the file, the dataset entry and the key.

    Randomness: ``seed=None`` draws from the shared ``default_rng`` as
    webdataset does; ``set_epoch(e)`` reseeds from ``e`` (and ``seed``), so
    every node and worker that sets the same epoch gets the same shards.
    Unlike webdataset, constructing one needs no ``ALLOW_OBSOLETE=1``.
    """

    def __init__(self, fname, seed=None):
        super().__init__()
        self.seed = seed
        self.epoch = -1
        self.rng = default_rng if seed is None else random.Random(seed)
        self.parse_spec(fname)

    def parse_spec(self, fname):
        """Read the spec (a YAML file name or a dict) into ``self.sources``."""
        if isinstance(fname, dict):
            spec, origin = fname, "MultiShardSample spec"
        elif not isinstance(fname, (str, os.PathLike)):
            raise TypeError(f"MultiShardSample needs a YAML file name or a dict, not {type(fname).__name__}")
        else:
            import yaml

            with open(fname) as stream:
                try:
                    spec = yaml.safe_load(stream)
                except yaml.YAMLError as exn:
                    raise ValueError(f"{fname}: not valid YAML: {exn}") from exn
            origin = os.fspath(fname)
        _check_keys(spec, _SPEC_KEYS, origin)
        if "datasets" not in spec:
            raise ValueError(f"{origin}: missing key 'datasets'")
        datasets = spec["datasets"]
        if not isinstance(datasets, list) or not datasets:
            raise ValueError(f"{origin}: 'datasets' must be a non-empty list, not {datasets!r}")
        prefix = spec.get("prefix", "")
        if not isinstance(prefix, str):
            raise ValueError(f"{origin}: 'prefix' must be a string, not {prefix!r}")
        prefix = expand(prefix)
        self.sources = [_parse_dataset(ds, i, spec, prefix, origin) for i, ds in enumerate(datasets)]

    def set_epoch(self, epoch):
        """Reseed, so that every process that sets epoch ``epoch`` draws the same shards."""
        self.epoch = epoch
        self.rng = random.Random(epoch if self.seed is None else utils.make_seed(self.seed, epoch))

    def get_shards_for_epoch(self):
        """One epoch's URLs: each dataset's share, shuffled together."""
        result = []
        for source in self.sources:
            if source.resample > 0:
                result += self.rng.choices(source.urls, k=source.resample)
            elif source.perepoch > 0:
                urls = list(source.urls)
                self.rng.shuffle(urls)
                result += urls[:source.perepoch]
            else:
                result += source.urls
        self.rng.shuffle(result)
        return result

    def __iter__(self):
        for url in self.get_shards_for_epoch():
            yield {"url": url}


def shardspec(spec):
    """A shard source for ``spec``: a ``MultiShardSample`` for a ``.yaml``/``.yml`` file, else a ``SimpleShardList``."""
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")):
        return MultiShardSample(spec)
    return SimpleShardList(spec)


# -- DirectoryShardList: shards claimed from a directory that others may share


def check_pid_is_running(pid):
    """Whether process ``pid`` exists (on this machine).

    A process of another user counts as running (webdataset says it is not,
    and would recycle the shard that process is reading); a zombie does not.
    """
    return pid_alive(pid)


def without_last_extension(fname):
    """``fname`` without its last ``.ext`` (in its last path component only)."""
    head, tail = os.path.split(fname)
    stem, dot, _ = tail.rpartition(".")
    return os.path.join(head, stem) if dot else fname


_CLAIMED = re.compile(r"^(.*)\._(\d+)_$")
_DONE = "._done_"


def get_pid_from_filename(fname):
    """The pid of a claimed shard's name (``shard.tar._1234_`` -> 1234), else None."""
    match = _CLAIMED.match(fname)
    return int(match.group(2)) if match else None


def _mtime(fname):
    try:
        return os.stat(fname).st_mtime
    except FileNotFoundError:  # claimed by another process since it was listed
        return float("inf")


class DirectoryShardList(IterableDataset):
    """Shards taken from a directory that producers fill and several readers share.

    A reader claims a shard by renaming ``x.tar`` to ``x.tar._<pid>_`` (the
    rename succeeds for one reader only) and yields that path. Once the
    consumer asks for the next shard, the finished one is recycled by
    ``mode``: ``"resample"`` renames it back (an endless stream), ``"keep"``
    renames it to ``x.tar._done_``, ``"unlink"`` deletes it. ``select`` is
    ``"random"`` or ``"oldest"`` (by mtime). With no shard to claim it polls
    every ``poll`` seconds, and ends after ``timeout`` seconds without one
    (``poll=None``: at once). Pids only mean something on one machine, so
    readers on several hosts sharing the directory are out of scope, as in
    webdataset.

    Differences from webdataset: a shard not known to be finished -- claimed
    by a process that died, or held when the consumer stopped early (the
    generator was closed) -- goes back under its own name for another reader,
    whatever the mode (webdataset applies the mode to a dead reader's shard,
    deleting it under ``"unlink"``, and leaves an early-closed one claimed until
    the process exits). The path needs no trailing ``/``; the pattern's braces
    work (webdataset hands them to glob, which has none, so its default pattern
    matches nothing); ``timeout`` counts time without a shard (webdataset: since
    the start); ``mode``/``select``/``poll`` are checked up front. ``fate`` is
    accepted for compatibility and, as in webdataset, unused.
    """

    MODES = ("resample", "keep", "unlink")
    SELECTS = ("random", "oldest")

    def __init__(self, path, pattern="*.{tar,tgz,tar.tgz}", poll=1, timeout=1e12, mode="resample",
                 select="random", fate=None):
        super().__init__()
        if not os.path.isdir(path):
            raise ValueError(f"DirectoryShardList: {path!r} is not a directory")
        if mode not in self.MODES:
            raise ValueError(f"DirectoryShardList: mode must be one of {', '.join(self.MODES)}, not {mode!r}")
        if select not in self.SELECTS:
            raise ValueError(f"DirectoryShardList: select must be one of {', '.join(self.SELECTS)}, "
                             f"not {select!r}")
        if poll is not None and not poll >= 0:
            raise ValueError(f"DirectoryShardList: poll must be None or a non-negative number, not {poll!r}")
        self.path = os.fspath(path)
        self.pattern = pattern
        self.poll = poll
        self.timeout = timeout
        self.mode = mode
        self.select = select
        self.fate = fate

    def recycle(self, activename):
        """Return a claimed shard by ``mode``: rename back, mark done, or delete."""
        if self.mode == "unlink":
            os.unlink(activename)
        elif self.mode == "keep":
            os.rename(activename, without_last_extension(activename) + _DONE)
        else:
            os.rename(activename, without_last_extension(activename))

    @staticmethod
    def _release(activename):
        """Give a claimed shard back under its own name, unfinished."""
        os.rename(activename, without_last_extension(activename))

    def cleanup_files_without_processes(self):
        """Give back the shards claimed by processes that no longer run."""
        for fname in glob.glob(os.path.join(glob.escape(self.path), "*._*_")):
            pid = get_pid_from_filename(fname)
            if pid is None or check_pid_is_running(pid):
                continue
            try:
                self._release(fname)
            except FileNotFoundError:  # another reader gave it back first
                pass

    def _candidates(self):
        names = utils.glob_with_braces(os.path.join(glob.escape(self.path), self.pattern))
        return sorted({n for n in names if get_pid_from_filename(n) is None and not n.endswith(_DONE)})

    def _claim(self):
        """Rename one free shard to this process's claimed name; None when there is none."""
        while True:
            candidates = self._candidates()
            if not candidates:
                return None
            if self.select == "oldest":
                candidate = min(candidates, key=_mtime)
            else:
                candidate = random.choice(candidates)
            activename = f"{candidate}._{os.getpid()}_"
            try:
                os.rename(candidate, activename)
            except FileNotFoundError:  # another reader claimed it first: list again
                continue
            return activename

    def __iter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            activename = self._claim()
            if activename is None:
                self.cleanup_files_without_processes()
                activename = self._claim()
            if activename is None:
                remaining = deadline - time.monotonic()
                if self.poll is None or remaining <= 0:
                    return
                time.sleep(min(self.poll, remaining))
                continue
            try:
                yield {"url": activename}
            except BaseException:  # closed early (GeneratorExit) or an error thrown in
                self._release(activename)
                raise
            self.recycle(activename)
            self.cleanup_files_without_processes()
            deadline = time.monotonic() + self.timeout
