"""MultiShardSample: the shards of several datasets, from a YAML (or dict) spec."""

import os
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Sequence, Union

from torch.utils.data import IterableDataset

from .._internal.braces import expand_braces
from .._internal.seeding import make_seed
from .._internal.validation import is_int

__all__ = ["MSSource", "MultiShardSample", "default_rng", "expand"]


@dataclass
class MSSource:
    """One dataset of a ``MultiShardSample`` spec; an epoch takes ``resample`` draws
    with replacement if positive, else ``perepoch`` distinct URLs if positive, else all."""

    name: str = ""
    perepoch: int = -1
    resample: int = -1
    urls: List[str] = field(default_factory=list)


default_rng = random.Random()  # shared by unseeded MultiShardSamples, as in webdataset


def expand(s: str) -> str:
    """``s`` with ``$VAR``/``${VAR}`` and a leading ``~`` expanded (for spec prefixes and buckets)."""
    return os.path.expanduser(os.path.expandvars(s))


_SPEC_KEYS = ("prefix", "datasets", "buckets")
_DATASET_KEYS = ("name", "shards", "buckets", "resample", "choose")


def _check_keys(mapping: Any, allowed: Sequence[str], where: str) -> None:
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(allowed)}, "
                         f"not {type(mapping).__name__}")
    unknown = sorted(set(mapping) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(allowed: {', '.join(allowed)})")


def _strings(value: Any, where: str, key: str) -> List[str]:
    """A str or a list of str, as a list."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: {key!r} must be a string or a list of strings, not {value!r}")
    return values


def _count(ds: Dict[str, Any], key: str, where: str) -> int:
    value = ds.get(key, -1)
    if not is_int(value):
        raise ValueError(f"{where}: {key!r} must be an int, not {value!r}")
    return value


def _parse_dataset(ds: Any, index: int, spec: Dict[str, Any], prefix: str, origin: str) -> MSSource:
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
    patterns = [expand(shards) for shards in _strings(ds["shards"], where, "shards")]
    try:
        urls = [prefix + os.path.join(bucket, url) for pattern in patterns for url in expand_braces(pattern)]
    except ValueError as exn:  # unbalanced braces
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

    def __init__(self, fname: Union[str, "os.PathLike[str]", Dict[str, Any]], seed: Any = None) -> None:
        super().__init__()
        self.seed = seed
        self.epoch = -1
        self.rng = default_rng if seed is None else random.Random(seed)
        self.parse_spec(fname)

    def parse_spec(self, fname: Union[str, "os.PathLike[str]", Dict[str, Any]]) -> None:
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

    def set_epoch(self, seed: int) -> None:
        """Reseed, so that every process that sets the epoch ``seed`` (webdataset's name for it)
        draws the same shards."""
        self.epoch = seed
        self.rng = random.Random(seed if self.seed is None else make_seed(self.seed, seed))

    def get_shards_for_epoch(self) -> List[str]:
        """One epoch's URLs: each dataset's share, shuffled together."""
        result: List[str] = []
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

    def __iter__(self) -> Iterator[Dict[str, str]]:
        for url in self.get_shards_for_epoch():
            yield {"url": url}
