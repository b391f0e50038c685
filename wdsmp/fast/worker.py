"""The loader's worker process: shards in, decoded batches written into ring slots.

``worker_main`` runs the reference path's stages (gopen, the tar splitter,
``group_by_keys``, then the user's own stages) over the worker's streams of
the epoch plan, and writes each sample into a row of a slot: the image decoded,
cropped, resized and flipped natively in place, the label, the key and any
declared fixed-shape field. Only slot indices and small messages travel, over
the worker's two pipes (``messages.py``); see NOTE [loader protocol] in
``delivery.py``.

NOTE [full batches]
    When sample counts are known (samples and resampled modes) every worker
    delivers exactly the batches the plan gives it, all full, whatever the
    data does: rows it cannot fill (samples skipped by ``handler``, dropped
    by a filtering stage, or lost with a broken shard) repeat its last good
    sample and are counted as ``padded``. Every rank therefore yields the
    same number of equally shaped batches, and DDP never waits on a rank
    that ran short. When counts are unknown (shards mode) a worker's last
    batch is short instead.

NOTE [inherited objects]
    A forked worker (``start_method="fork"``) shares its parent's memory until
    it writes to a page, and Python's cyclic garbage collector writes to every
    object it scans. Its first full collection would therefore copy every page
    the worker inherited: the whole training process (torch, the model), some
    hundreds of MB whose copying took about 0.25 s of CPU before the first
    batch on 2 cores (``benchmarks/RESULTS.md``). ``worker_main`` first moves
    what it inherited out of the collector's reach (``gc.freeze()``, a few
    pointer swaps): those objects outlive the worker anyway, and what the
    worker allocates itself is collected as usual.
"""

import collections
import gc
import io
import threading
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from time import perf_counter_ns
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Iterator, Optional, Tuple, Type, Union, cast

import numpy as np

from .._internal.seeding import SampleDraws
from ..epochs.plan import EpochPlanner, PlanPosition, ShardRange, StreamPlan
from ..errors import SampleError, WdsmpError
from ..epochs.spans import SpanReader
from ..epochs.stream import stream_samples, stream_start
from ..utils import make_seed
from .imagedecode import ImageInfo, decode_with_options
from .layout import ArraySpec, BatchLayout
from .messages import BatchReady, EpochTask, Reading, Stop, WorkerDone, WorkerFailed, WorkerWarning
from .options import DecodeOptions
from .ring import Ring
from .stats import WorkerClock
from .values import fitted, integer_from_text, numbers_from_text

__all__ = ["DecodeOptions", "WorkerConfig", "worker_main"]

IMAGES, LABELS, KEYS = "images", "labels", "__key__"
_LABEL = np.dtype(np.int64)
_END = object()  # the end of a stream's samples (None is a value a stage may yield, wrongly)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides its tasks; picklable (workers may be spawned).

    ``label``: the extension holding the class number (``.cls`` text), a
    function ``sample -> int``, or None. ``fields``: ``(name, source)`` pairs
    of extra fixed-shape fields, the shapes and dtypes in ``layout``; a source
    is an extension (``.npy`` bytes or text numbers) or a function
    ``sample -> array``. Labels and fields are written only when their dtype
    holds them unchanged (``values.py``). ``stages``: iterator -> iterator
    functions run on the sample dicts before the native step, as in
    ``DataPipeline``. ``cache_dir``: shards are read through the shard cache
    there. ``planner``: the loader's ``EpochPlanner``, which turns each task's
    position into the epoch's plan; the shards' sample counts in it are
    checked as the shards are read (NOTE [stale counts] in ``wdsmp/epochs/ranges.py``). In global order
    (``planner.order``), ``paths``, ``spans`` and ``files`` are each shard's local file, its
    samples' byte spans and what identifies the version of the file they were found in
    (``samplespans.SpanReader``), by shard number.
    """

    ring: str
    layout: BatchLayout
    image_keys: Tuple[str, ...]
    label: Union[str, Callable, None]
    fields: Tuple[Tuple[str, Union[str, Callable]], ...]
    keys: bool
    stages: Tuple[Callable, ...]
    handler: Callable
    decode: DecodeOptions
    shuffle_buffer: int
    planner: EpochPlanner
    cache_dir: Optional[str] = None
    paths: Tuple[str, ...] = ()
    spans: Tuple[np.ndarray, ...] = ()
    files: Tuple[Tuple[int, ...], ...] = ()

    @property
    def counts(self) -> Tuple[Optional[int], ...]:
        """Each shard's sample count (None: unknown), by shard number."""
        return tuple(count for _, count in self.planner.shards)


class _Stopped(Exception):
    """The loader asked this worker to stop (or went away)."""


class _Inbox:
    """What the loader sends this worker (NOTE [loader protocol] in ``delivery.py``): free slots
    (ints), ``EpochTask``s and ``Stop``, each kept until asked for."""

    def __init__(self, connection: Connection, slots: Iterable[int]) -> None:
        self.connection = connection
        self.slots = collections.deque(slots)
        self.tasks: Deque[EpochTask] = collections.deque()

    def _receive(self) -> None:
        try:
            message = self.connection.recv()
        except (EOFError, OSError):  # the loader's end is gone
            raise _Stopped() from None
        if isinstance(message, Stop):
            raise _Stopped()
        (self.tasks if isinstance(message, EpochTask) else self.slots).append(message)

    def slot(self) -> int:
        """A free slot, waiting for the loader to give one back if none is."""
        while not self.slots:
            self._receive()
        return self.slots.popleft()

    def give_back(self, slot: int) -> None:
        """A slot taken but not filled after all."""
        self.slots.appendleft(slot)

    def task(self) -> EpochTask:
        """The next epoch's task, waiting for it."""
        while not self.tasks:
            self._receive()
        return self.tasks.popleft()


class _Outbox:
    """What this worker tells the loader: one message at a time, from any thread (a stage's
    thread may warn)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def put(self, message: Union[BatchReady, Reading, WorkerDone, WorkerFailed, WorkerWarning]) -> None:
        try:
            with self._lock:
                self.connection.send(message)
        except (OSError, ValueError):  # the loader closed its end: it is done with this worker
            raise _Stopped() from None


def worker_main(inbox: Connection, outbox: Connection, worker: int, config: WorkerConfig,
                slots: Iterable[int]) -> None:
    """Serve epochs: take each ``EpochTask`` from ``inbox`` (a connection, with the slots the
    loader gives back and ``Stop``), fill slots (``slots``: this worker's, all free at first),
    announce them on ``outbox``; until ``Stop``, or the loader's end of either pipe closes."""
    gc.freeze()  # NOTE [inherited objects]
    from_loader, to_loader = _Inbox(inbox, slots), _Outbox(outbox)

    def forward(message: Union[Warning, str], category: Type[Warning], *_: object) -> None:
        to_loader.put(WorkerWarning.from_warning(worker, message, category))

    # warnings go to the main process, where the user sees them
    warnings.showwarning = cast(Callable[..., None], forward)
    where, clock = _Where(), WorkerClock()
    try:
        try:
            ring = Ring.attach(config.ring, config.layout)
        except Exception as exn:
            to_loader.put(WorkerFailed.from_exception(worker, exn))
            return
        try:
            _serve(worker, config, ring, from_loader, to_loader, where, clock)
        finally:
            ring.close()
    except _Stopped:
        return


def _serve(worker: int, config: WorkerConfig, ring: Ring, inbox: _Inbox, outbox: _Outbox, where: "_Where",
           clock: WorkerClock) -> None:
    """Make the batches of each task; a failure goes to the loader as a ``WorkerFailed`` and ends
    the worker."""
    try:
        while True:
            task = inbox.task()
            clock.restart()  # the time spent waiting for this epoch is nobody's
            plan = config.planner.plan(cast(Union[int, PlanPosition], task.position))
            spans = SpanReader(config.paths, config.spans, clock.reads, config.files) if config.paths else None
            try:
                streams = [_WorkerStream(worker, config, plan.streams[s], ring, inbox, outbox, where, clock, spans)
                           for s in task.streams]
                _run_streams(streams, outbox)
            finally:
                if spans is not None:
                    spans.close()
    except _Stopped:
        raise
    except BaseException as exn:
        # The error's own place first: with a shuffle buffer the last sample read is another one.
        # The member read last only where it is in the error's shard (not a shard that failed to open).
        shard = getattr(exn, "url", None) or where.url
        member = getattr(exn, "member", None)
        if member is None and shard == where.url:
            member = where.member
        outbox.put(WorkerFailed.from_exception(worker, exn, shard, member))


def _run_streams(streams: Iterable["_WorkerStream"], outbox: _Outbox) -> None:
    """Make the batches of ``streams`` interleaved as the loader delivers them: next, the
    unfinished stream with the fewest batches (the lowest number first). A worker running
    several streams (a resume with fewer workers) so makes them in the order a run with one
    worker per stream delivers them, and holds no slot the loader is not about to take."""
    runs = [(stream, stream.run()) for stream in streams]
    while runs:
        stream, run = min(runs, key=lambda entry: _turn(entry[0]))
        try:
            next(run)
        except StopIteration as done:
            outbox.put(done.value)
            runs.remove((stream, run))


def _turn(stream: "_WorkerStream") -> Tuple[int, int]:
    """Which of a worker's streams makes its next batch first: the fewest batches, then the lowest number."""
    return stream.index, stream.plan.stream


class _Where:
    """The shard and member the worker read last, for error messages."""

    url: Optional[str] = None
    member: Optional[str] = None


def _located(exn: BaseException, sample: Dict[str, Any]) -> BaseException:
    """``exn`` as an error naming the sample's shard and key when it names nothing itself."""
    if getattr(exn, "url", None) is None and isinstance(exn, Exception) and not isinstance(exn, WdsmpError):
        error = SampleError(f"{type(exn).__name__}: {exn}", sample.get("__url__"), sample.get("__key__"))
        error.__cause__ = exn
        return error
    return exn


class _WorkerStream:
    """One stream of an epoch, run by one worker (NOTE [full batches])."""

    def __init__(self, worker: int, config: WorkerConfig, plan: StreamPlan, ring: Ring, inbox: _Inbox,
                 outbox: _Outbox, where: _Where, clock: WorkerClock, spans: Optional[SpanReader] = None) -> None:
        self.worker, self.config, self.plan = worker, config, plan
        self.spans = spans  # the worker's SpanReader, shared by its streams (global order)
        self.ring, self.inbox, self.outbox, self.where = ring, inbox, outbox, where
        self.clock = clock  # the worker's: where its time went since its last batch (NOTE [stage times])
        self.batch_size = config.layout.batch_size
        self.specs = {spec.name: spec for spec in config.layout.arrays}
        self.samples = self.skipped = self.padded = self.taken = self.read = 0
        self.index = plan.skip_batches  # the number of the stream's next batch
        # a copy of the last row of the last full batch: {field: array}
        self.last_good: Optional[Dict[str, np.ndarray]] = None
        self.augment_seed = make_seed(plan.seed, "augment")  # each sample's draws come from it and its number

    def _handle(self, exn: BaseException) -> bool:
        """The user's handler on a bad sample or shard: True to go on (counted as skipped, and as a
        sample read: a stream that skipped one no longer says by its counts which it delivered)."""
        if self.config.handler(exn):
            self.skipped += 1
            self.read += 1
            return True
        return False

    def _source(self) -> Iterator[Dict[str, Any]]:
        """Samples of the plan, through the user's stages, the shuffle buffer and the resume skip
        (``epochs.stream``, as ExactSamples reads them)."""
        plan, config = self.plan, self.config
        start = stream_start(plan, config.shuffle_buffer)
        self.taken, self.read = start.taken, start.read
        return stream_samples(plan, start, shuffle_buffer=config.shuffle_buffer, stages=config.stages,
                              spans=self.spans, handler=self._handle, cache_dir=config.cache_dir,
                              clock=self.clock.reads, counts=config.counts if config.counts else None,
                              shards=self._entered, positions=self._announced, watch=self._timed)

    def _timed(self, samples: Iterator[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
        """``samples``, their reading timed and each noted in ``where``."""
        clock = self.clock
        while True:
            start = perf_counter_ns()
            sample = next(samples, None)
            clock.read_ns += perf_counter_ns() - start
            if sample is None:
                return
            self.read += 1
            self.where.url, self.where.member = sample.get("__url__"), sample.get("__key__")
            yield sample

    def _entered(self, ranges: Iterable[ShardRange]) -> Iterator[ShardRange]:
        """``ranges``, noting each shard in ``where`` as its reading starts (no member read yet) and
        announcing it to the loader before it is opened (``Reading``)."""
        for shard in ranges:
            self.where.url, self.where.member = shard.url, None
            self.outbox.put(Reading(self.worker, shard.url))
            yield shard

    def _announced(self, refs: Iterable[Tuple[int, int, str, bool]]) -> Iterator[Tuple[int, int, str]]:
        """``refs`` (``StreamPlan.samples``) as ``(shard, index, url)``, each noted in ``where``; the
        shard is announced to the loader (``Reading``) at most once per batch of samples, where it
        changed: consecutive samples come from different shards."""
        since = self.batch_size
        for shard, index, url, _ in refs:
            if url != self.where.url:
                self.where.url, self.where.member = url, None
                if since >= self.batch_size:
                    self.outbox.put(Reading(self.worker, url))
                    since = 0
            since += 1
            yield shard, index, url

    def run(self) -> Generator[None, None, WorkerDone]:
        """Fill and announce this stream's batches, pausing after each (``self.index`` is the next
        one's number); its value at the end is the ``WorkerDone`` to send."""
        plan, size, clock = self.plan, self.batch_size, self.clock
        slot: Optional[int]
        slot, rows = None, 0
        source = self._source()
        while plan.num_batches is None or self.index < plan.num_batches:
            sample = self._next_sample(source)
            if sample is _END:
                break
            sample = cast(Dict[str, Any], sample)
            if slot is None:
                slot, arrays = self._take_slot()
            try:
                start = perf_counter_ns()
                info = self._fill(arrays, rows, sample, self.taken, clock)
            except Exception as exn:
                if self._handle(_located(exn, sample)):
                    continue
                break
            finally:
                clock.fill_ns += perf_counter_ns() - start
            clock.count_image(info)
            self.samples += 1
            rows += 1
            if rows == size:
                self._publish(slot, arrays, size)
                slot, rows = None, 0
                yield
        if hasattr(source, "close"):
            source.close()
        if plan.num_batches is None:
            if rows:
                assert slot is not None  # taken for the first of the rows
                self._publish(slot, arrays, rows)
                yield
            elif slot is not None:  # taken for a sample that was then skipped
                self.inbox.give_back(slot)
        else:
            while self.index < plan.num_batches:  # NOTE [full batches]
                if slot is None:
                    slot, arrays = self._take_slot()
                self._pad(arrays, rows)
                self._publish(slot, arrays, size)
                slot, rows = None, 0
                yield
        return WorkerDone(self.worker, plan.epoch, self.index, self.samples, self.skipped, self.padded, plan.stream)

    def _next_sample(self, source: Iterator[Dict[str, Any]]) -> object:
        """The stream's next item, counted in ``taken``; ``_END`` at its end, and when a stage
        raised: a generator that raised has ended, and the rest of this stream with it."""
        try:
            start = perf_counter_ns()
            sample = next(source, _END)
            self.clock.source_ns += perf_counter_ns() - start
        except Exception as exn:
            if self._handle(exn):
                warnings.warn(f"a stage raised {type(exn).__name__}: {exn}; the rest of stream "
                              f"{self.plan.stream} of epoch {self.plan.epoch} in worker {self.worker} is lost (after "
                              f"{self.taken} of its items): a stage must handle its own errors to skip single samples")
            return _END
        if sample is not _END:
            self.taken += 1
        return sample

    def _check_sample(self, sample: object) -> None:
        """A SampleError unless ``sample`` is a sample dict: a stage that yields None (or anything
        else) neither ends the stream nor passes unnoticed."""
        if not isinstance(sample, dict):
            stages = self.config.stages
            name = (getattr(stages[-1], "__name__", None) or repr(stages[-1])) if stages else "the reader"
            raise SampleError(f"the stages (the last: {name}) yielded {repr(sample)[:60]}, not a sample dict, "
                              f"after the sample named here was read; a stage drops a sample by not yielding it",
                              self.where.url, self.where.member)

    def _take_slot(self) -> Tuple[int, Dict[str, np.ndarray]]:
        start = perf_counter_ns()
        slot = self.inbox.slot()
        self.clock.slot_ns += perf_counter_ns() - start
        return slot, self.ring.views(slot)

    def _publish(self, slot: int, arrays: Dict[str, np.ndarray], count: int) -> None:
        """Announce the slot as batch ``self.index`` and count it; None (no slot in hand)."""
        if count == self.batch_size:  # what _pad repeats once no row of the next slot is filled
            self.last_good = {name: array[-1].copy() for name, array in arrays.items()}
        self.outbox.put(BatchReady(slot, self.worker, self.plan.epoch, self.index, count, self.taken,
                                   self.plan.stream, self.clock.batch_times(), self.read))
        self.index += 1

    def _pad(self, arrays: Dict[str, np.ndarray], rows: int) -> None:
        """Fill rows ``rows:`` with the last good sample: in this slot if it has one, else the
        copy kept from the last full batch (padded or not)."""
        if rows:
            for array in arrays.values():
                array[rows:] = array[rows - 1]
            self.padded += self.batch_size - rows
            return
        if self.last_good is None:
            assert self.plan.num_batches is not None  # padding is for known counts only
            raise WdsmpError(f"worker {self.worker} read no usable sample in stream {self.plan.stream} of epoch "
                             f"{self.plan.epoch}, so it cannot fill its "
                             f"{self.plan.num_batches - self.plan.skip_batches} batches ({self.skipped} samples "
                             f"skipped by the handler)")
        for name, row in self.last_good.items():
            arrays[name][rows:] = row
        self.padded += self.batch_size - rows

    def _fill(self, arrays: Dict[str, np.ndarray], row: int, sample: Dict[str, Any], number: int,
              clock: WorkerClock) -> ImageInfo:
        """Write one sample, the stream's ``number``-th item, into row ``row`` of a slot, its
        decoding timed on ``clock``; its ``ImageInfo``. Raises on anything missing or malformed."""
        self._check_sample(sample)
        config = self.config
        url, key = sample.get("__url__"), sample.get("__key__")
        ext = next((e for e in config.image_keys if e in sample), None)
        if ext is None:
            raise SampleError(f"no image field (one of {', '.join(config.image_keys)}) in the sample; "
                              f"it has {_fields(sample)}", url, key)
        # Each sample's own draws, seeded by its place in the stream: a resumed stream draws the
        # crops of an uninterrupted one.
        augment = SampleDraws(self.augment_seed, number) if config.decode.train else None
        info = decode_with_options(sample[ext], arrays[IMAGES][row], config.decode, augment, url=url,
                                   member=ext if key is None else f"{key}.{ext}", clock=clock)
        if config.label is not None:
            arrays[LABELS][row] = _label(sample, config.label, url, key)
        for name, source in config.fields:
            spec = self.specs[name]
            value = source(sample) if callable(source) else _field_value(sample, source, spec, url, key)
            try:
                value = fitted(value, spec.dtype)
            except ValueError as exn:
                raise SampleError(f"field {name!r}: {exn}", url, key) from exn
            if np.shape(value) != spec.shape:
                raise SampleError(f"field {name!r} has shape {np.shape(value)}, the layout declares {spec.shape}",
                                  url, key)
            arrays[name][row] = value
        if config.keys:
            encoded = str(key).encode()
            width = np.dtype(self.specs[KEYS].dtype).itemsize
            if len(encoded) > width:
                raise SampleError(f"key is {len(encoded)} bytes long, more than key_length={width}", url, key)
            arrays[KEYS][row] = encoded
        return info


def _fields(sample: Dict[str, Any]) -> str:
    return ", ".join(sorted(k for k in sample if not k.startswith("__"))) or "no fields"


def _label(sample: Dict[str, Any], source: Union[str, Callable[[Dict[str, Any]], Any]], url: Optional[str],
           key: Optional[str]) -> Union[int, np.ndarray]:
    """The sample's label: an integer that int64 holds, from the label function or field (its text
    read strictly: ``values.integer_from_text``); SampleError otherwise, never a cast."""
    if callable(source):
        value, what = source(sample), f"label function {getattr(source, '__name__', source)!r}:"
    elif source not in sample:
        raise SampleError(f"no label field {source!r} in the sample; it has {_fields(sample)}", url, key)
    else:
        value, what = sample[source], f"label field {source!r}:"
    try:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = integer_from_text(value)
        label = fitted(value, _LABEL)
    except ValueError as exn:
        raise SampleError(f"{what} {exn}", url, key) from exn
    if type(label) is not int and np.ndim(label):
        raise SampleError(f"{what} an array of shape {np.shape(label)}, not one integer", url, key)
    return label


def _field_value(sample: Dict[str, Any], ext: str, spec: ArraySpec, url: Optional[str], key: Optional[str]) -> Any:
    """The array of extension ``ext``: ``.npy`` bytes, or text numbers (``"1 2 3"``; words for a
    bytes dtype)."""
    if ext not in sample:
        raise SampleError(f"no field {ext!r} in the sample; it has {_fields(sample)}", url, key)
    value = sample[ext]
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return value
    data = bytes(value)
    if data.startswith(b"\x93NUMPY"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    try:
        words = np.array(data.split()) if np.dtype(spec.dtype).kind == "S" else numbers_from_text(data)
        return words.reshape(spec.shape)
    except ValueError as exn:
        raise SampleError(f"field {ext!r} is neither .npy data nor numbers of shape {spec.shape} ({exn})",
                          url, key) from exn
