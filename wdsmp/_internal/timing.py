"""Where a loader's time goes: wall-clock accounting cheap enough to leave on, for both paths.

Both loaders time whole steps (a read call on a shard stream, a stage's next
item), never bytes, with ``time.perf_counter_ns`` into plain ints: well under a
microsecond per item, against the milliseconds an image takes to decode.

- :class:`ReadClock` counts the time spent opening and reading shard bytes, and
  the shard cache's hits and misses, for ``ranges.read_ranges(clock=...)``, which
  FastLoader's workers use: the rest of reading (splitting the tar, grouping
  members into samples) is what the caller timed around it, less this.
- :class:`StageClock` times each stage of a ``DataPipeline``
  (``with_stage_times()``), summed over every process that iterates a copy of
  the pipeline (the workers of a DataLoader included), NOTE [stage clock].

NOTE [stage clock]: each stage's iterator is wrapped in a generator that times
its ``next()``. That time includes the upstream stages' work, done lazily
inside it, so a stage's own time is its total less its upstream neighbour's. The
figures go into a shared ``multiprocessing`` array, added from each process's
own ints at most every ``FLUSH_NS`` and when an iterator ends, under the array's
lock; a forked or spawned copy of the clock starts with its own ints at zero.
The array travels only to processes being started (DataLoader workers); a
pipeline pickled for anything else gets a clock of its own.
"""

import io
import multiprocessing
import os
from multiprocessing.context import get_spawning_popen
from time import perf_counter_ns
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, TypeVar

__all__ = ["FLUSH_NS", "ReadClock", "StageClock", "stage_name"]

_T = TypeVar("_T")

FLUSH_NS = 500_000_000  # a process adds its stage figures to the shared ones at least this often


class _TimedReader(io.RawIOBase):
    """``stream``, with the time spent in its read calls added to ``clock.ns``."""

    def __init__(self, stream: Any, clock: "ReadClock") -> None:
        super().__init__()
        self.stream, self.clock = stream, clock

    def readable(self) -> bool:
        return True

    def _timed(self, method: Callable[[Any], _T], argument: Any) -> _T:
        start = perf_counter_ns()
        try:
            return method(argument)
        finally:
            self.clock.ns += perf_counter_ns() - start

    def readinto(self, buffer: Any) -> Optional[int]:
        return self._timed(self.stream.readinto, buffer)

    def readinto1(self, buffer: Any) -> Optional[int]:
        return self._timed(getattr(self.stream, "readinto1", self.stream.readinto), buffer)

    def read(self, size: int = -1) -> Optional[bytes]:
        return self._timed(self.stream.read, size)

    def peek(self, size: int = 0) -> bytes:
        """The stream's ``peek``; nothing where it has none (readers then read and put back)."""
        peek = getattr(self.stream, "peek", None)
        return self._timed(peek, size) if peek is not None else b""

    def close(self) -> None:
        if not self.closed:
            try:
                self.stream.close()  # a pipe's exit status raises here
            finally:
                super().close()


class ReadClock:
    """Nanoseconds spent opening and reading shards (``ns``), shards opened, and the shard
    cache's hits and misses; plain ints, reset by whoever reports them."""

    __slots__ = ("ns", "shards", "cache_hits", "cache_misses")

    def __init__(self) -> None:
        self.ns = self.shards = self.cache_hits = self.cache_misses = 0

    def timed_opener(self, open_url: Callable[..., Any]) -> Callable[..., "_TimedReader"]:
        """``open_url(url, **kw)`` with the opening and every later read of the stream timed."""

        def opened(url: str, **kw: Any) -> _TimedReader:
            start = perf_counter_ns()
            try:
                stream = open_url(url, **kw)
            finally:
                self.ns += perf_counter_ns() - start
            self.shards += 1
            return _TimedReader(stream, self)

        return opened

    def cache_fetch(self, fetch: Callable[[str], _T], url: str, cached: bool) -> _T:
        """``fetch(url)`` (the shard made whole in the cache), timed, counted as a hit when
        ``cached`` (it was there already) and a miss otherwise."""
        start = perf_counter_ns()
        try:
            return fetch(url)
        finally:
            self.ns += perf_counter_ns() - start
            if cached:
                self.cache_hits += 1
            else:
                self.cache_misses += 1


def _shared_ints(count: int) -> Any:
    """``count`` int64 in shared memory, with a lock. Made in the spawn context: a lock made in
    the fork context cannot go to a spawned process, this one goes to forked ones too."""
    return multiprocessing.get_context("spawn").Array("q", count)


def stage_name(stage: object) -> str:
    """A pipeline stage's name for people: the function a curried stage runs, a function's
    name, else the type's."""
    function = getattr(stage, "f", None)  # wdsmp's curried stages (_stages.Curried)
    name = getattr(function if callable(function) else stage, "__name__", None)
    return (name or type(stage).__name__).lstrip("_") or type(stage).__name__


class StageClock:
    """Time inside each stage's ``next()`` and items out of each, for a pipeline of the stages
    ``names``, summed over processes; NOTE [stage clock]."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self._shared = _shared_ints(2 * len(self.names))  # ns, then items, per stage
        self._reset_local()

    def _reset_local(self) -> None:
        self._local = [0] * (2 * len(self.names))
        self._pid = os.getpid()
        self._flushed = perf_counter_ns()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        if get_spawning_popen() is None:  # not a process being started
            state["_shared"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._shared is None:
            self._shared = _shared_ints(2 * len(self.names))
        self._reset_local()

    def timed(self, iterator: Iterator[_T], stage: int) -> Iterator[_T]:
        """``iterator`` (the output of stage number ``stage``), its ``next()`` calls timed."""
        self.flush()  # in a forked copy, this drops what the parent had not added yet: the parent's
        local, items = self._local, len(self.names) + stage
        try:
            while True:
                start = perf_counter_ns()
                try:
                    item = next(iterator)
                except StopIteration:
                    local[stage] += perf_counter_ns() - start
                    return
                end = perf_counter_ns()
                local[stage] += end - start
                local[items] += 1
                if end - self._flushed > FLUSH_NS:
                    self.flush()
                yield item
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            self.flush()

    def flush(self) -> None:
        """Add this process's figures to the shared ones."""
        if self._pid != os.getpid():
            self._reset_local()
        local = self._local
        with self._shared.get_lock():
            for i, value in enumerate(local):
                if value:
                    self._shared[i] += value
                    local[i] = 0
        self._flushed = perf_counter_ns()

    def figures(self) -> List[Dict[str, Any]]:
        """``[{"stage", "seconds", "items"}, ...]``: each stage's own time (its ``next()`` less
        its upstream neighbour's) and the items it yielded, over every process so far."""
        self.flush()
        with self._shared.get_lock():
            totals = list(self._shared)
        count = len(self.names)
        result: List[Dict[str, Any]] = []
        upstream = 0
        for i, name in enumerate(self.names):
            inclusive = totals[i]
            result.append({"stage": name, "seconds": max(inclusive - upstream, 0) / 1e9, "items": totals[count + i]})
            upstream = inclusive
        return result
