"""Dataset specifications: several shard collections, mixed, described in YAML or JSON.

A spec names the collections a training set is made of, so that a training
script can be pointed at other data without changing code::

    dataset:
      - shards: gs://bucket/ia1-{000000..000033}.tar
        scaleprob: 0.3
      - shards: gs://bucket/cdipsub-{000000..000022}.tar
        scale: [1.0, 3.0]
      - shards: gs://bucket/bin-gsub-{000000..000167}.tar
        extensions: nrm.jpg
        scale: [0.3, 1.0]

The document is a mapping with one key, ``dataset``: a non-empty list of
collections. Each collection is a mapping with these keys:

``shards`` (required)
    A shard spec as everywhere in wdsmp: a string (brace-expanded, ``::``
    separated, ``${name}`` from ``WDS_name``, local globs) or a list of them.
    Relative paths are relative to the working directory, as for any shard spec.
    A spec read from a URL in secure mode (``WDS_SECURE=1``) is the data's,
    not the program's: a ``${name}`` in its shard specs is a SpecError (the
    environment's values would leave the machine in the URLs fetched); and
    secure mode globs no local patterns (it refuses local files anyway). Out of
    secure mode a spec, like a shard index, may name ``pipe:`` commands, which run.
``scaleprob`` (default 1.0)
    The collection's mixing weight, a number >= 0. Weights are relative: each
    sample comes from a collection with probability weight / sum of weights.
    They count samples, not shards: a small collection with a large weight is
    read more often, so to mix in proportion to size, give weights that are.
``scale`` (default 1.0)
    A factor on the weight, fixed (``2.0``) or drawn anew for every epoch,
    uniformly from a range (``[lo, hi]``, ``0 <= lo <= hi``). The draw depends
    only on the seed, the epoch and the collection, so every node and worker
    mixes in the same proportions in an epoch, and every run repeats them,
    while the blend still varies from epoch to epoch. The weight of a
    collection in an epoch is ``scaleprob * scale``.
``extensions``
    The fields to keep, separated by spaces or ``;`` (``"nrm.jpg txt"``) or
    as a list (a leading dot is dropped: ``.jpg`` is ``jpg``): other tar members are skipped before they are read into
    samples, and a sample with none of the fields is dropped. Metadata
    (``__key__``, ``__url__``, ...) is always kept.

Unknown keys, a missing ``shards``, negative or non-numeric weights and bad
ranges are ``SpecError``s (a ValueError) naming the collection's index and
the key. ``load_spec`` reads a spec from a dict, a local file or any URL
``gopen`` opens: ``.json`` files with ``json``, anything else with
``yaml.safe_load`` (YAML being a superset of JSON; PyYAML is needed only for
YAML). ``spec_dataset`` turns it into a ``DataPipeline`` over a ``RandomMix``
of one ``tarfile_to_samples`` pipeline per collection.
"""

import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .._internal import env
from ..errors import WdsmpError
from ..filters import pipelinefilter
from ..gopen import gopen, local_path
from ..handlers import _Handler, reraise_exception
from ..mix import RandomMix
from ..pipeline import DataPipeline
from ..shardlists import (
    ResampledShards,
    SimpleShardList,
    expand_urls,
    split_by_node,
    split_by_worker,
)
from ..tariterators import base_plus_ext, tarfile_to_samples
from ..utils import make_seed

__all__ = [
    "CollectionSpec",
    "DatasetSpec",
    "SpecError",
    "SpecMix",
    "load_spec",
    "spec_dataset",
]

_TOP_KEYS = ("dataset",)
_COLLECTION_KEYS = ("extensions", "scale", "scaleprob", "shards")


class SpecError(WdsmpError, ValueError):
    """A dataset spec is malformed; the message names the collection and the key."""


@dataclass(frozen=True)
class CollectionSpec:
    """One collection of a spec, validated: URLs expanded, weights and ranges checked."""

    urls: Tuple[str, ...]
    scaleprob: float = 1.0
    scale: Tuple[float, float] = (1.0, 1.0)
    extensions: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class DatasetSpec:
    """A validated spec: its collections, in the order given."""

    collections: Tuple[CollectionSpec, ...]

    def weights(self, seed: Any, epoch: int) -> List[float]:
        """Each collection's mixing weight in ``epoch``: ``scaleprob`` times its scale draw."""
        result = []
        for index, c in enumerate(self.collections):
            lo, hi = c.scale
            if lo == hi:
                factor = lo
            else:
                factor = random.Random(make_seed(seed, epoch, index)).uniform(lo, hi)
            result.append(c.scaleprob * factor)
        return result


def _error(index: Optional[int], key: object, problem: str) -> SpecError:
    where = "dataset spec" if index is None else f"dataset spec collection {index}"
    return SpecError(f"{where}: {key!r} {problem}")


def _number(value: object, index: Optional[int], key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _error(index, key, f"must be a finite number, not {value!r}")
    if value < 0:
        raise _error(index, key, f"must not be negative, not {value!r}")
    return float(value)


def _scale(value: object, index: int) -> Tuple[float, float]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise _error(index, "scale", f"must be a number or a [lo, hi] pair, not {value!r}")
        lo, hi = (_number(v, index, "scale") for v in value)
        if lo > hi:
            raise _error(index, "scale", f"range [{lo}, {hi}] has lo > hi")
        return lo, hi
    factor = _number(value, index, "scale")
    return factor, factor


def _extensions(value: object, index: int) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _error(index, "extensions", f"must be a string or a list of strings, not {value!r}")
    # ".jpg" is the field "jpg": no field name starts with a dot, and none would match
    names = tuple(sorted({e.lower().lstrip(".") for v in value for e in v.replace(";", " ").split()} - {""}))
    if not names:
        raise _error(index, "extensions", "names no fields")
    return names


def _urls(value: object, index: int, trusted: bool) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or \
            not all(isinstance(v, str) for v in value):
        raise _error(index, "shards", f"must be a shard spec or a non-empty list of them, "
                                      f"not {value!r}")
    try:
        urls = [url for spec in value for url in expand_urls(spec, trusted)]
    except ValueError as exn:
        raise _error(index, "shards", str(exn)) from exn
    if not urls:
        raise _error(index, "shards", "names no shards")
    if "" in urls:  # "" or a stray "::", which would fail only when the mix reaches it
        raise _error(index, "shards", f"names an empty URL: {value!r}")
    return tuple(urls)


def _mapping(value: object, index: Optional[int], needs: str, known: Tuple[str, ...]) -> Dict[str, Any]:
    """``value``, a mapping of ``known`` keys only; a SpecError saying what it ``needs`` otherwise."""
    if not isinstance(value, dict):
        raise SpecError(f"{needs}, not {type(value).__name__}")
    for key in value:
        if key not in known:
            raise _error(index, key, f"is not a known key (known: {', '.join(known)})")
    return value


def _collection(entry: Any, index: int, trusted: bool) -> CollectionSpec:
    _mapping(entry, index, f"dataset spec collection {index} must be a mapping", _COLLECTION_KEYS)
    if "shards" not in entry:
        raise _error(index, "shards", "is missing")
    extensions = entry.get("extensions")
    return CollectionSpec(
        urls=_urls(entry["shards"], index, trusted),
        scaleprob=_number(entry.get("scaleprob", 1.0), index, "scaleprob"),
        scale=_scale(entry.get("scale", 1.0), index),
        extensions=None if extensions is None else _extensions(extensions, index),
    )


def _validated(document: Any, trusted: bool = True) -> DatasetSpec:
    _mapping(document, None, "a dataset spec must be a mapping with a 'dataset' list", _TOP_KEYS)
    entries = document.get("dataset")
    if not isinstance(entries, (list, tuple)) or not entries:
        raise _error(None, "dataset", f"must be a non-empty list of collections, not {entries!r}")
    spec = DatasetSpec(tuple(_collection(entry, i, trusted) for i, entry in enumerate(entries)))
    if sum(c.scaleprob * c.scale[1] for c in spec.collections) <= 0:
        raise SpecError("dataset spec: every collection has weight 0 (scaleprob * scale)")
    return spec


def _parse(text: str, name: str) -> Any:
    if name.lower().endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as exn:
            raise SpecError(f"dataset spec {name!r} is not valid JSON: {exn}") from exn
    try:
        import yaml
    except ImportError as exn:
        raise ImportError(f"reading the YAML dataset spec {name!r} needs PyYAML "
                          f"(pip install pyyaml), or write the spec as .json") from exn
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exn:
        raise SpecError(f"dataset spec {name!r} is not valid YAML: {exn}") from exn


# What ``load_spec`` takes: a spec, the dict of one, or the path or URL of a YAML/JSON document.
_SpecSource = Union["DatasetSpec", Dict[str, Any], str, "os.PathLike[str]"]


def load_spec(source: _SpecSource) -> DatasetSpec:
    """A validated ``DatasetSpec`` from a dict, a ``DatasetSpec``, a file path or a URL."""
    if isinstance(source, DatasetSpec):
        return source
    if isinstance(source, dict):
        return _validated(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"a dataset spec is a dict, a path or a URL, not {type(source).__name__}")
    name = os.fspath(source)
    with gopen(name) as stream:
        data = stream.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exn:
        raise SpecError(f"dataset spec {name!r} is not UTF-8 text") from exn
    document = _parse(text, name)
    remote = local_path(name) is None and name != "-"
    try:
        return _validated(document, trusted=not (remote and env.secure()))
    except SpecError as exn:
        raise SpecError(f"{exn} (in {name!r})") from exn


class _FieldSelector:
    """``select_files`` for tar members: keep those with one of the listed extensions."""

    def __init__(self, extensions: Iterable[str]) -> None:
        self.extensions = frozenset(extensions)

    def __call__(self, fname: str) -> bool:
        _, extension = base_plus_ext(fname)
        return extension is not None and extension.lower() in self.extensions


def _has_fields(data: Iterable[Dict[str, Any]], extensions: Tuple[str, ...]) -> Iterator[Dict[str, Any]]:
    """Drop samples that kept none of the listed fields."""
    for sample in data:
        if any(extension in sample for extension in extensions):
            yield sample


_keep_with_fields = pipelinefilter(_has_fields)


def _collection_pipeline(c: CollectionSpec, index: int, seed: Any, resampled: bool,
                         handler: _Handler) -> DataPipeline:
    if resampled:
        stages: List[Any] = [ResampledShards(list(c.urls), seed=make_seed(seed, index), deterministic=True)]
    else:
        stages = [SimpleShardList(list(c.urls)), split_by_node, split_by_worker]
    select = None if c.extensions is None else _FieldSelector(c.extensions)
    stages.append(tarfile_to_samples(handler=handler, select_files=select))
    if c.extensions is not None:
        stages.append(_keep_with_fields(c.extensions))
    return DataPipeline(*stages)


class SpecMix(RandomMix):
    """A ``RandomMix`` of a spec's collections, weighted by ``spec.weights`` in each epoch."""

    def __init__(self, datasets: Sequence[Iterable[Any]], spec: DatasetSpec, longest: bool = False,
                 seed: Any = 0) -> None:
        if len(datasets) != len(spec.collections):
            raise ValueError(f"got {len(datasets)} datasets for "
                             f"{len(spec.collections)} collections")
        super().__init__(datasets, longest=longest, seed=seed)
        self.spec = spec

    def epoch_probs(self, epoch: int) -> List[float]:
        """The spec's weights for ``epoch``: the same in every node and worker."""
        return self.spec.weights(self.seed, epoch)


def spec_dataset(spec: _SpecSource, seed: Any = 0, resampled: bool = False, longest: bool = False,
                 handler: _Handler = reraise_exception) -> DataPipeline:
    """A ``DataPipeline`` of the samples of a spec's collections, mixed by their weights.

    ``spec`` is anything ``load_spec`` takes. Each collection is read with
    ``tarfile_to_samples``: once through, its shards split between nodes and
    DataLoader workers (the mix ends when a collection runs out, or all with
    ``longest=True``), or with ``resampled=True`` from shards drawn with
    replacement for as long as the mix is read (bound the epoch with
    ``.with_epoch(n)``). ``seed`` fixes the picks, shard draws and scale draws.
    """
    spec = load_spec(spec)
    collections = [_collection_pipeline(c, i, seed, resampled, handler)
                   for i, c in enumerate(spec.collections)]
    return DataPipeline(SpecMix(collections, spec, longest=longest, seed=seed))
