"""Pipeline stages: iterator -> iterator functions, curried so they pickle.

A stage is written as a plain generator ``_stage(data, *args)`` and exposed as
``stage = pipelinefilter(_stage)``: ``stage(*args)`` returns a picklable
callable that takes the upstream iterator. Workers are spawned, so stages must
never be lambdas or closures. The names are those of ``webdataset.filters``;
currying lives in :mod:`wdsmp.stages.base`, the stages that address fields by
name in :mod:`wdsmp.stages.fields`, collation and batching in :mod:`wdsmp.stages.batching`;
their public names are re-exported here. Stages that run user
code take ``handler=`` and name the sample in their errors: NOTE [stage
errors] in :mod:`wdsmp.stages.base`.
"""

import itertools
import random
import sys
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from .stages.base import (
    Curried,
    FilterFunction,
    RestCurried,
    handle_each,
    missing_field,
    need_dict,
    pipelinefilter,
)
from .autodecode import Decoder
from .stages.batching import (
    batched,
    combine_values,
    default_collation_fn,
    dict2tuple,
    tuple2dict,
    unbatched,
    unlisted,
)
from .stages.fields import (
    decode_bin,
    decode_pickle,
    decode_text,
    default_decoders,
    extract_keys,
    find_decoder,
    getfirst,
    parse_field_spec,
    rename,
    rename_keys,
    to_tuple,
    transform_with,
    xdecode,
)
from ._internal.sharedint import SharedInt
from .handlers import reraise_exception
from .formats.samplecodec import SampleCodec
from . import utils
from .utils import PipelineStage, identity, make_seed

__all__ = [
    "Cached",
    "Curried",
    "FilterFunction",
    "LMDBCached",
    "RestCurried",
    "associate",
    "batched",
    "combine_values",
    "compose",
    "compose2",
    "decode",
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_collation_fn",
    "default_decoders",
    "detshuffle",
    "dict2tuple",
    "extract_keys",
    "find_decoder",
    "getfirst",
    "identity",
    "info",
    "log_keys",
    "map",
    "map_dict",
    "map_stream",
    "map_tuple",
    "parse_field_spec",
    "pick",
    "pipe",
    "pipeline",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "reraise_exception",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "tuple2dict",
    "unbatched",
    "unlisted",
    "xdecode",
]

_T = TypeVar("_T")


# -- composing


class _Composed:
    """Functions applied left to right; a class, not a lambda, so that it pickles."""

    def __init__(self, fns: Sequence[Callable[[Any], Any]]) -> None:
        self.fns = fns

    def __call__(self, x: Any) -> Any:
        for f in self.fns:
            x = f(x)
        return x


def compose(*fns: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``compose(f, g, h)(x) == h(g(f(x)))``, picklable when the functions are."""
    if not fns:
        raise ValueError("compose needs at least one function")
    return _Composed(fns)


def compose2(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``g(f(x))``."""
    return _Composed((f, g))


def pipeline(source: Any, *stages: Callable[[Any], Any]) -> Any:
    """Run ``source`` through ``stages`` in order."""
    return compose(*stages)(source) if stages else source


def _pipe(data: Iterable[Any], f: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``f(data, *args, **kw)``: a whole-stream function as a stage."""
    return f(data, *args, **kw)


pipe = pipelinefilter(_pipe)
map_stream = pipe  # the same stage under the name some pipelines use


# -- looking at the stream


def _info(data: Iterable[Any], fmt: Optional[str] = None, n: int = 3, every: int = -1, width: int = 50,
          stream: Optional[IO[str]] = None, name: str = "") -> Iterator[Any]:
    """Print the first ``n`` samples (and every ``every``-th) to ``stream`` (stderr)."""
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            out = sys.stderr if stream is None else stream  # looked up late: it may be replaced
            if fmt is not None:
                text = fmt.format(**sample) if isinstance(sample, dict) else fmt.format(*sample)
                print(text, file=out)
            else:
                print("---", name, file=out)
                items = sample.items() if isinstance(sample, dict) else enumerate(sample)
                for k, v in items:
                    print(k, repr(v)[:width], file=out)
        yield sample


info = pipelinefilter(_info)


def _log_keys(data: Iterable[Dict[str, Any]], logfile: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """Append ``index, __worker__, __rank__, __key__`` of each sample to ``logfile``.

    The file is locked per line, so that every worker can log to the same file.
    """
    if not logfile:
        yield from data
        return
    import fcntl

    with open(logfile, "a") as stream:
        for i, sample in enumerate(data):
            line = (f"{i}\t{sample.get('__worker__')}\t{sample.get('__rank__')}\t"
                    f"{sample.get('__key__')}\n")
            fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
            try:
                stream.write(line)
                stream.flush()
            finally:
                fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
            yield sample


log_keys = pipelinefilter(_log_keys)


# -- shuffling and sampling


def pick(buf: List[_T], rng: random.Random) -> _T:
    """Remove and return a random item of ``buf`` in O(1) (the order of ``buf`` changes)."""
    k = rng.randint(0, len(buf) - 1)
    sample = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return sample


def _shuffle(data: Iterable[_T], bufsize: int = 1000, initial: int = 100, rng: Optional[random.Random] = None,
             seed: Any = None, handler: Optional[Callable[[Exception], Any]] = None) -> Iterator[_T]:
    """Shuffle through a buffer of ``bufsize`` items.

    The first item comes out once ``initial`` are buffered, so startup is quick;
    until the buffer is full it takes two items for each one it gives. With
    ``seed`` the order is the same on every run and differs between nodes and
    workers (the seed is mixed with rank and worker here, at iteration time,
    inside the worker); without ``seed`` or ``rng`` it differs on every run.
    ``handler`` is accepted as webdataset does: shuffling runs no user code.
    """
    if seed is not None:
        if rng is not None:
            raise ValueError("shuffle takes rng or seed, not both")
        rank, _, worker, _ = utils.pytorch_worker_info()
        rng = random.Random(make_seed(seed, rank, worker))
    elif rng is None:
        rng = random.Random()
    initial = min(initial, bufsize)
    source = iter(data)
    buf = []
    for sample in source:
        buf.append(sample)
        if len(buf) < bufsize:
            buf.extend(itertools.islice(source, 1))
        if len(buf) >= initial:
            yield pick(buf, rng)
    while buf:
        yield pick(buf, rng)


shuffle = pipelinefilter(_shuffle)


def _epoch_seed(seed: Any, epoch: int) -> int:
    """webdataset's ``seed + epoch`` for an integer seed, so that the orders are its own; a
    stable hash of both for any other seed."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed + epoch
    return make_seed(seed, epoch)


class detshuffle(PipelineStage):
    """A shuffle whose order follows from ``seed`` and the epoch alone.

    The order is the same in every worker and on every node, so the stage may
    come before ``split_by_node`` / ``split_by_worker``, which then still
    partition the shards (as in webdataset, whose orders these are: its random
    generator is seeded with ``seed + epoch``). The epoch advances by one each
    time the stage is iterated, from ``epoch + 1`` (0 first by default), as
    webdataset's does. ``set_epoch(n)`` pins it to ``n`` instead; the pinned
    epoch reaches DataLoader workers, persistent ones included, started after
    the first ``set_epoch`` (NOTE [shared epoch] in :mod:`wdsmp._internal.sharedint`).
    """

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: Any = 0, epoch: int = -1) -> None:
        self.bufsize = bufsize
        self.initial = initial
        self.seed = seed
        self._epoch = epoch
        self._pinned: Optional[SharedInt] = None  # a SharedInt once set_epoch was called

    @property
    def epoch(self) -> int:
        """The epoch of the latest (or, when pinned, every) iteration."""
        return self._epoch if self._pinned is None else self._pinned.value

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        if self._pinned is None:
            self._epoch = epoch
        else:
            self._pinned.value = epoch

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch`` from the next iteration on, in this process and its workers."""
        if self._pinned is None:
            self._pinned = SharedInt(epoch)
        self._pinned.value = epoch

    def run(self, src: Iterable[_T]) -> Iterator[_T]:
        if self._pinned is None:
            self._epoch += 1
        rng = random.Random(_epoch_seed(self.seed, self.epoch))
        return _shuffle(src, self.bufsize, self.initial, rng=rng)


def _rsample(data: Iterable[_T], p: float = 0.5) -> Iterator[_T]:
    """Keep each item with probability ``p``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rsample: p must be in [0, 1], not {p!r}")
    for sample in data:
        if random.random() < p:
            yield sample


rsample = pipelinefilter(_rsample)


def _slice(data: Iterable[_T], *args: Optional[int]) -> Iterator[_T]:
    """``itertools.islice(data, *args)``."""
    return itertools.islice(data, *args)


slice = pipelinefilter(_slice)


# -- user functions


def _select(data: Iterable[_T], predicate: Callable[[_T], Any],
            handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[_T]:
    """Keep the items for which ``predicate(item)`` is true."""

    def keep(sample: _T) -> Iterator[_T]:
        if predicate(sample):
            yield sample

    yield from handle_each(data, keep, handler, "select")


select = pipelinefilter(_select)


def _map(data: Iterable[Any], f: Callable[[Any], Any],
         handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[Any]:
    """``f(item)`` for each item; None drops it. A dict result keeps the sample's ``__key__``."""

    def apply(sample: Any) -> Iterator[Any]:
        result = f(sample)
        if result is None:
            return
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        yield result

    yield from handle_each(data, apply, handler, "map")


map = pipelinefilter(_map)


def _map_dict(data: Iterable[Dict[str, Any]], handler: Callable[[Exception], Any] = reraise_exception,
              **kw: Callable[[Any], Any]) -> Iterator[Dict[str, Any]]:
    """Replace ``sample[field]`` by ``kw[field](sample[field])``, in a copy of the sample."""
    if not kw:
        raise ValueError("map_dict needs at least one field=function")
    field: Optional[str]  # the field being mapped, for where()
    for field, f in kw.items():
        if not callable(f):
            raise TypeError(f"map_dict: {field}={f!r} is not callable")
    field = None

    def apply(sample: Any) -> Iterator[Dict[str, Any]]:
        nonlocal field
        field = None
        result = dict(need_dict("map_dict", sample))
        for field, f in kw.items():
            if field not in result:
                raise missing_field("map_dict", f"no field {field!r}", result)
            result[field] = f(result[field])
        yield result

    def where() -> Optional[str]:
        return field and f"field {field!r}"

    yield from handle_each(data, apply, handler, "map_dict", where)


map_dict = pipelinefilter(_map_dict)


def _map_tuple(data: Iterable[Sequence[Any]], *args: Optional[Callable[[Any], Any]],
               handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[Tuple[Any, ...]]:
    """Replace ``sample[i]`` by ``args[i](sample[i])``; None leaves a value as it is."""
    fns = [identity if f is None else f for f in args]
    i: Optional[int]  # the position being mapped, for where()
    for i, f in enumerate(fns):
        if not callable(f):
            raise TypeError(f"map_tuple: function {i} ({f!r}) is not callable")
    i = None

    def apply(sample: Any) -> Iterator[Tuple[Any, ...]]:
        nonlocal i
        i = None
        if not isinstance(sample, (list, tuple)):
            raise TypeError(f"map_tuple needs tuple or list samples, "
                            f"not {type(sample).__name__}")
        result = list(sample)
        for i, f in zip(range(len(result)), fns):
            result[i] = f(result[i])
        yield tuple(result)

    def where() -> Optional[str]:
        return None if i is None else f"position {i}"

    yield from handle_each(data, apply, handler, "map_tuple", where)


map_tuple = pipelinefilter(_map_tuple)


def _associate(data: Iterable[Dict[str, Any]],
               associator: Union[Callable[[Any], Mapping[str, Any]], Mapping[Any, Mapping[str, Any]]],
               handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[Dict[str, Any]]:
    """Add ``associator(key)`` (or ``associator.get(key, {})`` for a dict) to each sample."""

    def add(sample: Any) -> Iterator[Dict[str, Any]]:
        if "__key__" not in need_dict("associate", sample):
            raise missing_field("associate", "no field '__key__'", sample)
        key = sample["__key__"]
        yield {**sample, **(associator(key) if callable(associator) else associator.get(key, {}))}

    yield from handle_each(data, add, handler, "associate")


associate = pipelinefilter(_associate)


# -- decoding


def _decode(data: Iterable[Dict[str, Any]], *args: Any, handler: Callable[[Exception], Any] = reraise_exception,
            keep_key: bool = False, **kw: Any) -> Iterator[Dict[str, Any]]:
    """Decode each sample with ``wdsmp.autodecode.Decoder``.

    ``args`` are handlers ``f(".ext", data)`` or image specs such as "rgb";
    ``kw`` goes to the Decoder (``pre``, ``post``, ``only``, ``partial``,
    ``unsafe``). ``keep_key=True`` gives each decoded sample its source's
    ``__key__`` (None where a renaming dropped it), as ``map`` does: the fluid
    ``.decode()`` is a ``map`` in webdataset.
    """
    decoder = Decoder(list(args), **kw)

    def apply(sample: Any) -> Iterator[Dict[str, Any]]:
        result = decoder.decode(need_dict("decode", sample))
        if keep_key:
            result["__key__"] = sample.get("__key__")
        yield result

    yield from handle_each(data, apply, handler, "decode")


decode = pipelinefilter(_decode)


# -- caching


class Cached(PipelineStage):
    """Keep what one complete pass yields in memory and replay it on later passes."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: Optional[List[Any]] = None

    def run(self, source: Iterable[_T]) -> Iterator[_T]:
        if self.cached is not None:
            yield from self.cached
            return
        samples = []
        for sample in source:
            samples.append(sample)
            yield sample
        self.cached = samples  # only a pass that ran to its end is kept


class LMDBCached(PipelineStage):
    """Keep what one complete pass yields in an LMDB database ``fname`` and replay it later.

    The database is opened when first iterated, not here, so the stage can be
    built in the main process and pickled to workers. ``pickler`` has ``dumps``
    and ``loads``; the default, :class:`wdsmp.formats.samplecodec.SampleCodec`, stores
    plain samples without pickle and refuses pickles under ``WDS_SECURE=1``, as
    DBCache does.
    """

    def __init__(self, fname: str, map_size: float = 1e12, pickler: Any = None, chunksize: int = 500) -> None:
        self.fname = fname
        self.map_size = int(map_size)
        self.pickler = pickler
        self.chunksize = chunksize
        self.db: Any = None  # the lmdb environment, opened on first use

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__, db=None)  # an open database belongs to its process

    def _open(self) -> Tuple[Any, Any]:
        if self.db is None:
            try:
                import lmdb
            except ImportError as exn:
                raise ImportError("LMDBCached needs the lmdb package (pip install lmdb)") from exn
            self.db = lmdb.open(self.fname, readonly=False, map_size=self.map_size)
        return self.db, self.pickler or SampleCodec(f"LMDBCached {self.fname!r}")

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        db, pickler = self._open()
        with db.begin(write=False) as txn:
            complete = txn.get(b"_") is not None
        if complete:
            with db.begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != b"_":
                        yield pickler.loads(value)
            return
        chunk = []
        for i, sample in enumerate(source):
            key = (isinstance(sample, dict) and sample.get("__key__")) or str(i)
            chunk.append((key.encode(), pickler.dumps(sample)))
            if len(chunk) >= self.chunksize:
                self._put(db, chunk)
                chunk = []
            yield sample
        chunk.append((b"_", b"1"))  # the mark of a complete pass
        self._put(db, chunk)

    @staticmethod
    def _put(db: Any, items: Iterable[Tuple[bytes, bytes]]) -> None:
        with db.begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value)


# -- the generators behind the stages, under webdataset's names: user code imports them
# (``from webdataset.filters import _shuffle``) to build stages of its own.

_batched = batched.f
_extract_keys = extract_keys.f
_rename = rename.f
_rename_keys = rename_keys.f
_to_tuple = to_tuple.f
_unbatched = unbatched.f
_unlisted = unlisted.f
_xdecode = xdecode.f
