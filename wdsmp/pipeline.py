"""DataPipeline: a source followed by iterator -> iterator stages, as an IterableDataset.

The first stage is the source: an IterableDataset, a DataLoader, any
iterable, or a callable returning an iterator. Every later stage is a
callable taking the upstream iterator: a plain generator function, a curried
stage (``wds.tarfile_to_samples()``), a ``functools.partial``. Lists of stages
are flattened. The pipeline holds only its stages and a few numbers, so it
pickles whenever its stages do, as spawned DataLoader workers need.

NOTE [epoch iterator]: ``with_epoch(n)`` makes every ``__iter__`` yield
exactly ``n`` items. As in webdataset, each ``__iter__`` starts the stages
afresh (and again whenever they run dry), so a stage that reads the epoch
when it starts -- a shard shuffle keyed on a shared epoch value in a
persistent DataLoader worker -- reads the new epoch's value. With
``with_epoch(n, continuous=True)`` one iterator is kept between calls
instead, so that successive epochs continue through the data rather than
reread its first ``n`` items. The kept iterator belongs to the process that
made it: it is dropped on pickling and ignored after a fork, so a DataLoader
worker starts its own. ``set_epoch`` drops it too, so that the new epoch's
seeds take effect at once.

NOTE [pipeline length]: as in webdataset, a pipeline has no ``__len__`` at
all until its length is known (``hasattr(dataset, "__len__")`` is how
training code, and torch's DataLoader, tell a sized dataset), from
``with_length(n)`` or a counted source. Then its class is switched to a
subclass that has one (``add_length_method``), made at run time and
pickled as "rebuild as the original class, then add the length again".

Stage times (NOTE [stage clock] in timing.py): ``with_stage_times()`` times
every stage's items, in this process and in DataLoader workers alike, and
``stage_times()`` reports them, so that a pipeline's stages can be compared
with FastLoader's (``FastLoader.stats``). Off, the stages run unwrapped.

NOTE [counted source]: a pipeline whose source is a ``CountedSource``
(stage 0, or the dataset of a DataLoader at stage 0, itself read from one)
hands out the epoch's batches through the source's ``hand_out``, which counts
them into ``pipeline.position``; ``state_dict()`` and ``load_state_dict()``
go to the source, and so does every stage appended (``check_stage``), which
it may refuse. ``wdsmp.ExactSamples`` is the one such source (NOTE [exact
epochs in the reference path] in exact.py); the pipeline knows only this
protocol.
"""

import copy
import functools
import os
import sys
import warnings
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Type, TypeVar, cast

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._internal.timing import StageClock, stage_name
from ._internal.validation import non_negative_int
from .utils import PipelineStage

__all__ = ["CountedSource", "DataPipeline", "add_length_method"]

_P = TypeVar("_P", bound="DataPipeline")  # the pipeline a chaining method returns: itself
_O = TypeVar("_O")


class CountedSource(IterableDataset):
    """A source whose epochs are a planned number of batches, counted as the pipeline hands
    them out so that an epoch can be saved and resumed; NOTE [counted source]."""

    epoch = 0

    def check_stage(self, pipeline: "DataPipeline", stage: Any) -> None:
        """Raise ValueError if ``stage`` may not be appended to ``pipeline``, which reads from
        this source."""

    def hand_out(self, pipeline: "DataPipeline", batches: Callable[[], Any]) -> Iterator[Any]:
        """The epoch's batches from ``batches()``, counted into ``pipeline.position`` as
        ``(epoch, batches handed out, streams)``."""
        raise NotImplementedError(f"{type(self).__name__}.hand_out")

    def __len__(self) -> int:
        """The batches of an epoch."""
        raise NotImplementedError(f"{type(self).__name__}.__len__")

    def start(self, num_workers: int) -> Tuple[int, Any]:
        """``(batches handed out, streams)`` where the current epoch starts."""
        raise NotImplementedError(f"{type(self).__name__}.start")

    def state(self, epoch: int, batches_done: int, streams: Any) -> Dict[str, Any]:
        """The state ``state_dict()`` saves after ``batches_done`` batches of ``epoch``."""
        raise NotImplementedError(f"{type(self).__name__}.state")

    def load_state_dict(self, state: Any) -> None:
        """Make the next iteration go on from ``state``."""
        raise NotImplementedError(f"{type(self).__name__}.load_state_dict")


def counted_source(pipeline: Any) -> Optional[CountedSource]:
    """The ``CountedSource`` a pipeline reads from (directly, or through the DataLoader a
    ``WebLoader`` wraps), or None; NOTE [counted source]."""
    stages = getattr(pipeline, "pipeline", None)
    if not stages:
        return None
    first = stages[0]
    if isinstance(first, DataLoader):
        first = first.dataset
        return first if isinstance(first, CountedSource) else counted_source(first)
    return first if isinstance(first, CountedSource) else None


def _size_len(self: Any) -> int:
    return self.size


def _pipeline_len(self: Any) -> int:
    """A pipeline's length: ``size`` (which ``with_length`` sets), else its counted source's."""
    size = getattr(self, "size", None)
    if size is not None:
        return size
    return len(cast(CountedSource, counted_source(self)))


def _rebuild_with_length(base: Any, state: Any, length: Callable[[Any], int] = _size_len) -> Any:
    """Unpickle an object given a length by ``add_length_method``: rebuild as ``base``, then add it."""
    obj = base.__new__(base)
    if hasattr(obj, "__setstate__"):
        obj.__setstate__(state)
    else:
        obj.__dict__.update(state or {})
    return _with_len(obj, length)


def _reduce_with_length(self: Any, protocol: int) -> Tuple[Any, ...]:
    cls = type(self)
    getstate = getattr(self, "__getstate__", None)  # object has one only from Python 3.11
    state = getstate() if getstate is not None else dict(self.__dict__)
    return _rebuild_with_length, (cls._length_base, state, cls.__len__)


@functools.lru_cache(maxsize=None)
def _length_class(base: Type[Any], length: Callable[[Any], int]) -> Type[Any]:
    """``base`` with ``__len__`` = ``length``; one class per pair, made once."""
    namespace = {"__len__": length, "__reduce_ex__": _reduce_with_length, "_length_base": base,
                 "__module__": base.__module__, "__qualname__": base.__qualname__ + "_Length"}
    bases = (base,) if issubclass(base, IterableDataset) else (base, IterableDataset)
    return type(base.__name__ + "_Length", bases, namespace)


def _with_len(obj: _O, length: Callable[[Any], int]) -> _O:
    """``obj``, its class switched to one whose ``__len__`` is ``length``: NOTE [pipeline length]."""
    cls: Any = type(obj)
    base = cls.__dict__.get("_length_base", cls)
    if base is cls or cls.__len__ is not length:
        obj.__class__ = _length_class(base, length)
    return obj


def add_length_method(obj: _O) -> _O:
    """Give ``obj`` a ``__len__`` returning ``obj.size`` (webdataset's way to fake a length).

    As in webdataset, ``obj``'s class is switched to a subclass that has the
    method (and is an IterableDataset). That subclass is made at run time, so
    it pickles as "rebuild as the original class, then add the length again",
    and the object still travels to spawned DataLoader workers.
    """
    return _with_len(obj, _size_len)


def _flatten(stages: Iterable[Any]) -> Iterator[Any]:
    """Stages with None dropped and lists spliced in, one level deep (as webdataset)."""
    for stage in stages:
        if isinstance(stage, list):
            yield from (s for s in stage if s is not None)
        elif stage is not None:
            yield stage


def _is_source(stage: Any) -> bool:
    return isinstance(stage, (IterableDataset, DataLoader, PipelineStage)) or callable(stage) \
        or hasattr(stage, "__iter__")


def _is_filter(stage: Any) -> bool:
    return isinstance(stage, PipelineStage) or callable(stage)


class DataPipeline(IterableDataset):
    """A source and a series of stages, iterated like webdataset's ``DataPipeline``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__()
        self.pipeline: List[Any] = []
        self.repetitions = 1
        self.nsamples = -1
        self._keep = False  # with_epoch mode, NOTE [epoch iterator]
        self._source: Any = None  # the generator kept across epochs
        self._source_pid: Optional[int] = None
        self.position = None  # (epoch, batches handed out, streams) with a counted source
        self._clock: Optional[StageClock] = None  # a StageClock while stage times are on
        for stage in _flatten(args):
            self.append(stage)

    # -- building

    def append(self, f: Any) -> None:
        """Add a stage at the end (modifies the pipeline)."""
        where = len(self.pipeline)
        if where == 0 and not _is_source(f):
            raise ValueError(f"stage 0 ({f!r}) is not a source: it must be an IterableDataset, "
                             f"an iterable or a callable returning an iterator")
        if where > 0 and not _is_filter(f):
            raise ValueError(f"stage {where} ({f!r}) is not callable: only the first stage may "
                             f"be an iterable source; later stages take the upstream iterator")
        source = counted_source(self) if where > 0 else None
        if source is not None:
            source.check_stage(self, f)
        self.pipeline.append(f)
        if where == 0 and counted_source(self) is not None:
            _with_len(self, _pipeline_len)  # NOTE [pipeline length]
        if self._clock is not None:  # a clock for the stages as they are now; the figures start again
            self._clock = StageClock(map(stage_name, self.pipeline))

    def compose(self, *args: Any, **kw: Any) -> Any:
        """A copy of the pipeline with ``args`` appended; the original is unchanged.

        The older form ``compose(cls, *args, **kw)``, with a class first, wraps
        the pipeline instead: it returns ``cls(self, *args, **kw)`` (as in
        ``dataset.compose(wds.DBCache, "cache.db", 1000)``).
        """
        if args and isinstance(args[0], type):
            return args[0](self, *args[1:], **kw)
        if kw:
            raise TypeError(f"compose() takes keyword arguments only with a class first, "
                            f"not with {args[0]!r}" if args else "compose() got no stages")
        result = copy.copy(self)
        result.pipeline = list(self.pipeline)
        result._drop_source()
        for stage in _flatten(args):
            result.append(stage)
        return result

    def stage(self, i: int) -> Any:
        """Stage ``i`` (0 is the source)."""
        return self.pipeline[i]

    # -- running

    def invoke(self, f: Any, *args: Any, **kw: Any) -> Any:
        """Run one stage: a source with no arguments, a filter on the upstream iterator."""
        if isinstance(f, (IterableDataset, DataLoader)) and not args:
            return iter(f)
        if isinstance(f, PipelineStage):
            return f.run(*args, **kw)
        if isinstance(f, list):
            return iter(f)
        if callable(f):
            return f(*args, **kw)
        if not args and hasattr(f, "__iter__"):
            return iter(f)
        raise ValueError(f"{f!r}: not a valid pipeline stage")

    def iterator1(self) -> Iterable[Any]:
        """An iterator through one pass of the pipeline."""
        if not self.pipeline:
            raise ValueError("DataPipeline has no stages")
        clock = self._clock
        source = self.invoke(self.pipeline[0])
        if clock is not None:
            source = clock.timed(source, 0)
        for i, step in enumerate(self.pipeline[1:], 1):
            source = self.invoke(step, source)
            if clock is not None:
                source = clock.timed(source, i)
        return source

    def iterator(self) -> Iterator[Any]:
        """Passes through the pipeline, ``repetitions`` times; stops early at an empty pass."""
        for _ in range(self.repetitions):
            count = 0
            for sample in self.iterator1():
                count += 1
                yield sample
            if count == 0:
                break

    def _drop_source(self) -> None:
        source, pid = self._source, self._source_pid
        self._source = self._source_pid = None
        if source is not None and pid == os.getpid():
            source.close()  # runs the stages' cleanup (open shards); a fork's copy is left alone

    def _kept(self) -> Iterator[Any]:
        """The iterator kept across epochs; see NOTE [epoch iterator]."""
        if self._source is None or self._source_pid != os.getpid():
            self._source = self.iterator()
            self._source_pid = os.getpid()
        return self._source

    def _epoch(self, n: int) -> Iterator[Any]:
        """``n`` items from the kept iterator; fewer only if the data is empty."""
        for _ in range(n):
            source = self._kept()
            try:
                sample = next(source)
            except StopIteration:
                self._source = None
                return
            yield sample

    def __iter__(self) -> Iterator[Any]:
        source = counted_source(self)
        if source is not None and get_worker_info() is None and not getattr(self, "counted_outside", False):
            if self._keep or self.repetitions != 1 or self.nsamples > 0:
                raise ValueError(f"with_epoch() and repeat() do not combine with {type(source).__name__}, whose "
                                 "epochs are the plan's batches")
            return source.hand_out(self, self.iterator1)
        if self._keep:
            if self.nsamples > 0:
                return self._epoch(self.nsamples)
            return self._kept()
        if self.nsamples > 0:  # webdataset ignores it for repeat(1, n); wdsmp does not
            return islice(self.iterator(), self.nsamples)
        return self.iterator()

    # -- epochs and lengths

    def with_epoch(self: _P, nsamples: int = -1, nbatches: int = -1, *, continuous: bool = False) -> _P:
        """Make each epoch exactly ``max(nsamples, nbatches)`` items, passing through the
        stages as often as needed. Each epoch starts them afresh, as in webdataset;
        ``continuous=True`` goes on where the last epoch stopped instead (NOTE [epoch iterator])."""
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        self._keep = bool(continuous)
        self._drop_source()
        return self

    def repeat(self: _P, nepochs: int = -1, nbatches: int = -1) -> _P:
        """Iterate ``nepochs`` passes (forever if not positive), at most ``nbatches`` items."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        self._keep = False
        self._drop_source()
        return self

    def with_length(self: _P, n: int, silent: bool = False) -> _P:
        """Give the pipeline a ``__len__`` returning ``n``, for training loops that insist on one.

        It changes nothing about how many items an epoch yields. The pipeline
        still pickles (NOTE [pipeline length]).
        """
        non_negative_int(n, "length")
        if not silent:
            warnings.warn(".with_length() only sets the value of __len__ for compatibility with "
                          "some training environments; it does not change the number of samples "
                          "in an epoch", UserWarning, stacklevel=2)
        self.size = n  # webdataset's attribute, which code may read or set
        return _with_len(self, _pipeline_len)

    def __bool__(self) -> bool:
        return True  # a length of 0 does not make a pipeline false

    def set_epoch(self, epoch: int) -> None:
        """Tell every stage that has ``set_epoch`` the epoch (and a DataLoader stage's dataset);
        restart the kept iterator."""
        for step in self.pipeline:
            if isinstance(step, DataLoader):
                step = step.dataset
            if hasattr(step, "set_epoch"):
                step.set_epoch(epoch)
        if self.position is not None and self.position[0] != epoch:
            self.position = None
        self._drop_source()

    # -- stage times

    def with_stage_times(self: _P, enabled: bool = True) -> _P:
        """Time every stage from now on (``enabled=False``: stop, and run the stages unwrapped
        again); the figures are ``stage_times()``. The stages of the dataset of a DataLoader at
        stage 0 (a ``WebLoader``'s) are timed too, in its workers: turn it on before they start."""
        self._clock = StageClock(map(stage_name, self.pipeline)) if enabled else None
        first = self.pipeline[0] if self.pipeline else None
        if isinstance(first, DataLoader) and isinstance(first.dataset, DataPipeline):
            first.dataset.with_stage_times(enabled)
        return self

    def stage_times(self) -> List[Dict[str, Any]]:
        """Each stage's time since ``with_stage_times()``, summed over the processes that ran
        it: ``[{"stage", "where", "seconds", "items", "ms_per_item"}, ...]`` in pipeline order.
        A stage's time is its own, the work of the stages before it taken out. With a
        DataLoader at stage 0, its dataset's stages come first (``where``: "DataLoader
        workers"), then this pipeline's, whose first is the time spent waiting for the
        DataLoader's batches."""
        if self._clock is None:
            raise ValueError("stage times are off: call with_stage_times() before iterating")
        figures = []
        first = self.pipeline[0]
        if isinstance(first, DataLoader) and isinstance(first.dataset, DataPipeline) \
                and first.dataset._clock is not None:
            figures = [dict(f, where="DataLoader workers") for f in first.dataset.stage_times()]
        figures += [dict(f, where="this process") for f in self._clock.figures()]
        for figure in figures:
            figure["ms_per_item"] = figure["seconds"] * 1e3 / figure["items"] if figure["items"] else 0.0
        return figures

    # -- counted epochs: NOTE [counted source]

    def _state_source(self) -> CountedSource:
        source = counted_source(self)
        if source is None:
            raise ValueError("state_dict() and load_state_dict() need a pipeline that reads from "
                             "wds.ExactSamples (directly, or through the DataLoader of a WebLoader)")
        return source

    def state_dict(self) -> Dict[str, Any]:
        """Where the epoch stands: the batches this pipeline handed out (an ``ExactSamples``
        pipeline, iterated in this process, or a ``WebLoader`` around one)."""
        source = self._state_source()
        if self.position is not None:
            return source.state(*self.position)
        loader = self.pipeline[0]
        done, streams = source.start(loader.num_workers if isinstance(loader, DataLoader) else 0)
        return source.state(source.epoch, done, streams)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration go on from ``state`` (from ``state_dict()``) with exactly the
        batches not yet handed out, in the order they would have come."""
        self._state_source().load_state_dict(state)
        self.position = None

    def close(self) -> None:
        """Close the kept iterator and every stage that has ``close``; safe to call twice."""
        self._drop_source()
        for step in self.pipeline:
            if hasattr(step, "close"):
                step.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None  # a live generator: see NOTE [epoch iterator]
        state["_source_pid"] = None
        return state
