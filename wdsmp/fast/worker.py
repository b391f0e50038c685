"""The loader's worker process: shards in, decoded batches written into ring slots.

``worker_main`` runs the reference path's stages (gopen, the tar splitter,
``group_by_keys``, then the user's own stages) over the worker's streams of
the epoch plan, and writes each sample into a row of a slot: the image decoded,
cropped, resized and flipped natively in place, the label, the key and any
declared fixed-shape field. Only slot indices and small messages travel back
(``messages.py``); see NOTE [loader protocol] in ``loader.py``.

NOTE [full batches]
    When sample counts are known (samples and resampled modes) every worker
    delivers exactly the batches the plan gives it, all full, whatever the
    data does: rows it cannot fill (samples skipped by ``handler``, dropped
    by a filtering stage, or lost with a broken shard) repeat its last good
    sample and are counted as ``padded``. Every rank therefore yields the
    same number of equally shaped batches, and DDP never waits on a rank
    that ran short. When counts are unknown (shards mode) a worker's last
    batch is short instead.

NOTE [first batch together]
    An epoch's first batch is the one a training loop waits for with nothing
    to overlap it: made by one worker as the others make theirs, it takes a
    whole batch's decoding on one core. So the loader gives the other workers
    their plans only once that batch is announced (or after
    ``epochstart.FIRST_BATCH_HOLD`` seconds: a first batch slow for want of
    data, not of cores, holds nobody long), and the worker making it decodes it
    with one thread per worker (``EpochTask.threads``): on W cores it comes
    about W times sooner, and the cores do the same work in all. The worker
    reads the batch's samples in order and hands each row to the next free
    thread (decoding and resizing release the GIL); a row whose sample failed
    is left out and the rows after it move up, so the batch is the one a
    single thread makes, whatever the handler does, and errors come out in
    the order one thread meets them (a row's before a later read's). Crops
    and flips are drawn from each sample's own generator, seeded
    by the stream's seed and the sample's place in the stream, so threads
    draw the same boxes in any order, and a resumed stream the same boxes as
    an uninterrupted one. Label and field functions are the user's code, which
    may keep state or not be safe to call from two threads at once: with them,
    every batch is made by one thread, the first too, and nobody is held back.

NOTE [first batch here]
    A fresh generation of workers waits for the fork server to start (an
    interpreter, numpy and the worker's modules: about 0.2 s and 0.25 s of CPU
    on 2 cores), for its forks and the ring's attachment, while the loader's
    process waits with the decoder at hand. So when a fresh generation starts
    an epoch (the first ``iter()``, or after a failure), the loader makes the
    epoch's first batch itself (:func:`make_first_batch`), with the threads
    the first batch's worker would use, and hands it out as that worker's.
    Nothing else runs meanwhile: a loader that will make its first batch so
    (:func:`may_make_first_batch`) leaves the fork server unstarted at
    construction, as its start would take the cores the batch needs (unless
    the workers import the script, a slow start, or a loaded state resumes
    mid-epoch, whose first batch is the workers'), for
    ``loader.FORK_SERVER_DELAY`` (0.1 s): a script that calls ``iter()`` at
    once gets the batch alone, one that builds its model first gets the fork
    server started meanwhile. The workers start behind the batch, in a thread
    (``Workers.start``), fork server first, as ``iter()`` returns and the
    training loop takes the batch (under ``start_method="fork"`` from the
    loop's own thread, before ``iter()`` returns: a fork from another thread
    would copy locks the loop holds); the epoch's next batch is the one made
    together (NOTE [first batch together]), and the workers held back for it
    get their tasks from that thread once the batch made here would have been
    made again (``epochstart.release_after``): otherwise only the loop's next
    request would release them, and a loop's first step may be long. The
    worker goes on with the stream as a resumed one: it reads the stream from
    its start, drops the items the batch took (epochplan.py's replay), and
    pads, if it must, with the batch's last row, sent with its task (NOTE
    [full batches]). The epoch is the one the workers alone make, sample for
    sample and pixel for pixel. A start that fails in that thread ends the
    epoch at the next batch with a ``WorkerError`` that says why, as a worker
    dying would.

    Only where reading the stream twice changes nothing but time: local
    shards (a path or ``file:``); no stages, label or field functions (the
    user's code would run twice over those samples, or in another process);
    a stream at its start; a shuffle buffer of at most a batch or
    ``FIRST_BATCH_BUFFER`` samples (the script's process holds what it
    reads). And only a clean batch: at the first bad sample or shard (before
    the user's handler sees it) or stale sample count (before it is warned
    about), the batch is dropped and the worker makes it, so the handler, its
    warnings and the counts meet every sample once, as they always did.

    The collector waits while the batch is made: a script that has just
    imported torch owes a full collection of its hundreds of thousands of
    objects (about 0.1 s of the first batch on 2 cores,
    ``benchmarks/RESULTS.md``), which the objects the batch reads would set
    off; it runs after, in the training loop. What else differs: a warning
    Pillow raises as it decodes one of the batch's images is the script's
    own (its filters apply; no "in loader worker" prefix), and a mount that
    hangs (NFS, FUSE) holds up ``iter()`` itself, as counting such shards at
    construction already does, not a worker that ``stall_timeout`` catches.

NOTE [inherited objects]
    A forked worker shares its parent's memory until it writes to a page, and
    Python's cyclic garbage collector writes to every object it scans. Its
    first full collection would therefore copy every page the worker
    inherited: the fork server's modules, or under ``start_method="fork"`` the
    whole training process (torch, the model), some hundreds of MB whose
    copying took about 0.25 s of CPU before the first batch on 2 cores
    (``benchmarks/RESULTS.md``). ``worker_main`` first moves what it inherited
    out of the collector's reach (``gc.freeze()``, a few pointer swaps): those
    objects outlive the worker anyway, and what the worker allocates itself is
    collected as before.
"""

import gc
import io
import random
import signal
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from queue import Empty
from time import perf_counter_ns
from typing import Callable, Optional, Tuple, Union

import numpy as np

from ..errors import SampleError, WdsmpError
from ..gopen import local_path
from ..liveness import exit_with_parent
from ..ranges import buffer_shuffled, read_ranges
from ..utils import make_seed
from .imagedecode import decode_with_options
from .messages import BatchReady, EpochTask, Reading, Stop, WorkerDone, WorkerFailed, WorkerWarning
from .options import DecodeOptions
from .ring import Ring
from .stats import WorkerClock
from .values import fitted, integer_from_text, numbers_from_text

__all__ = ["FIRST_BATCH_BUFFER", "DecodeOptions", "FirstBatch", "WorkerConfig", "make_first_batch",
           "may_make_first_batch", "worker_main"]

IMAGES, LABELS, KEYS = "images", "labels", "__key__"
# A first batch is made here only with a shuffle buffer of at most this many samples, or a batch
# (NOTE [first batch here]).
FIRST_BATCH_BUFFER = 256
_LABEL = np.dtype(np.int64)
_POLL = 0.2  # seconds between checks of the stop event while waiting
_END = object()  # the end of a stream's samples (None is a value a stage may yield, wrongly)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides its plan; picklable (workers are spawned).

    ``label``: the extension holding the class number (``.cls`` text), a
    function ``sample -> int``, or None. ``fields``: ``(name, source)`` pairs
    of extra fixed-shape fields, the shapes and dtypes in ``layout``; a source
    is an extension (``.npy`` bytes or text numbers) or a function
    ``sample -> array``. Labels and fields are written only when their dtype
    holds them unchanged (``values.py``). ``stages``: iterator -> iterator
    functions run on the sample dicts before the native step, as in
    ``DataPipeline``. ``cache_dir``: shards are read through the shard cache
    there. ``counts``: the sample count of each shard (by number) the plan was
    made from, checked as the shards are read (NOTE [stale counts] in ``ranges.py``).
    """

    ring: str
    layout: object
    image_keys: Tuple[str, ...]
    label: Union[str, Callable, None]
    fields: Tuple[Tuple[str, Union[str, Callable]], ...]
    keys: bool
    stages: Tuple[Callable, ...]
    handler: Callable
    decode: DecodeOptions
    shuffle_buffer: int
    cache_dir: Optional[str] = None
    counts: Tuple[Optional[int], ...] = ()

    @property
    def rows_call_user_code(self):
        """Whether filling a row calls a label or field function (NOTE [first batch together])."""
        return callable(self.label) or any(callable(source) for _, source in self.fields)


@dataclass(frozen=True)
class FirstBatch:
    """An epoch's first batch made in the loader's process (NOTE [first batch here]): the
    messages its stream sent (``Reading``, ``BatchReady``), the stream's plan for the worker
    that goes on after it, and ``last_row``, a copy of its last row when it is full (``{field:
    array}``), which the worker pads with as if it had made it (NOTE [full batches])."""

    messages: Tuple[object, ...]
    rest: object
    last_row: Optional[dict]


class _Declined(Exception):
    """The first batch made in the loader's process met a bad sample or shard (NOTE [first batch here])."""


def _decline(problem):
    """A bad sample or shard (an exception), or a stale sample count (a message), met by the
    first batch made here: the worker makes the batch, and meets it there."""
    raise _Declined(problem)


class _Outbox(list):
    """Messages a stream sends, kept in order instead of sent."""

    put = list.append


class _SlotsTaken:
    """A free-slot queue that remembers the slots taken from it."""

    def __init__(self, queue):
        self.queue, self.taken = queue, []

    def get(self, timeout=None):
        slot = self.queue.get(timeout=timeout)
        self.taken.append(slot)
        return slot

    def put(self, slot):
        self.taken.remove(slot)
        self.queue.put(slot)


def may_make_first_batch(config, urls):
    """Whether the loader's process may make a first batch of ``urls`` read with ``config``, as far
    as these tell (NOTE [first batch here]; the stream must be at its start too)."""
    return (all(local_path(url) is not None for url in urls) and not config.stages
            and not config.rows_call_user_code
            and config.shuffle_buffer <= max(config.layout.batch_size, FIRST_BATCH_BUFFER))


def make_first_batch(worker, config, plan, ring, free, stop, threads):
    """Make the first batch of ``plan``'s stream here, for ``worker``, into a slot from its
    ``free`` queue of ``ring`` with ``threads`` threads (NOTE [first batch here]); a
    ``FirstBatch``, or None (the slot given back) where the worker must make it."""
    if (not may_make_first_batch(config, _stream_urls(plan)) or plan.skip_batches or plan.discard
            or plan.consumed is not None or plan.num_batches == 0):
        return None
    outbox, slots = _Outbox(), _SlotsTaken(free)
    stream = _Stream(worker, replace(config, handler=_decline), plan, ring, slots, outbox, stop, _Where(),
                     WorkerClock())
    stream.threads, stream.stale = threads, _decline
    run = stream.run()
    collecting = gc.isenabled()
    gc.disable()  # NOTE [first batch here]: the script's pending full collection comes after the batch
    try:
        next(run)
        if stream.padded:  # rows the stream lacked: not a clean batch either
            raise _Declined()
    except BaseException as exn:
        for slot in slots.taken:
            free.put(slot)
        if isinstance(exn, Exception):  # a bad sample, a stale count, an empty stream: the worker's to meet
            return None
        raise
    finally:
        run.close()
        if collecting:
            gc.enable()
    return FirstBatch(tuple(outbox), replace(plan, skip_batches=stream.index, consumed=stream.taken),
                      stream.last_good)


def _stream_urls(plan):
    """The URLs a stream may read."""
    return [url for url, _ in plan.pool] if plan.mode == "resampled" else [r.url for r in plan.ranges]


class _Stopped(Exception):
    """The loader asked this worker to stop (or went away)."""


def worker_main(worker, config, tasks, free, ready, stop):
    """Serve epochs: take each epoch's ``EpochTask`` from ``tasks``, fill slots taken from
    ``free``, announce them on ``ready``; until ``Stop``, the ``stop`` event, or the loader's
    death."""
    gc.freeze()  # NOTE [inherited objects]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    exit_with_parent()

    def forward(message, category, *_):
        ready.put(WorkerWarning.from_warning(worker, message, category))

    warnings.showwarning = forward  # warnings go to the main process, where the user sees them
    where, clock = _Where(), WorkerClock()
    try:
        ring = Ring.attach(config.ring, config.layout)
    except BaseException as exn:
        ready.put(WorkerFailed.from_exception(worker, exn))
        return
    try:
        while True:
            task = _wait(tasks, stop)
            if isinstance(task, Stop):
                return
            clock.restart()  # the time spent waiting for this epoch is nobody's
            streams = [_Stream(worker, config, plan, ring, free, ready, stop, where, clock) for plan in task.plans]
            for stream in streams:  # NOTE [first batch here]: a full batch of the stream made elsewhere
                stream.last_good = (task.last_rows or {}).get(stream.plan.stream)
            if streams:  # the first to make a batch makes it with the task's threads
                min(streams, key=_turn).threads = task.threads
            _run_streams(streams, ready)
    except _Stopped:
        return
    except BaseException as exn:
        # The error's own place first: with a shuffle buffer the last sample read is another one.
        # The member read last only where it is in the error's shard (not a shard that failed to open).
        shard = getattr(exn, "url", None) or where.url
        member = getattr(exn, "member", None)
        if member is None and shard == where.url:
            member = where.member
        ready.put(WorkerFailed.from_exception(worker, exn, shard, member))
    finally:
        ring.close()


def _run_streams(streams, ready):
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
            ready.put(done.value)
            runs.remove((stream, run))


def _turn(stream):
    """Which of a worker's streams makes its next batch first: the fewest batches, then the lowest number."""
    return stream.index, stream.plan.stream


def _wait(queue, stop):
    """The next item of ``queue``; ``_Stopped`` once ``stop`` is set."""
    while True:
        if stop.is_set():
            raise _Stopped()
        try:
            return queue.get(timeout=_POLL)
        except Empty:
            continue


class _Where:
    """The shard and member the worker read last, for error messages."""

    url = member = None


def _located(exn, sample):
    """``exn`` as an error naming the sample's shard and key when it names nothing itself."""
    if getattr(exn, "url", None) is None and isinstance(exn, Exception) and not isinstance(exn, WdsmpError):
        error = SampleError(f"{type(exn).__name__}: {exn}", sample.get("__url__"), sample.get("__key__"))
        error.__cause__ = exn
        return error
    return exn


class _Stream:
    """One stream of an epoch, run by one worker (NOTE [full batches])."""

    def __init__(self, worker, config, plan, ring, free, ready, stop, where, clock):
        self.worker, self.config, self.plan = worker, config, plan
        self.ring, self.free, self.ready, self.stop, self.where = ring, free, ready, stop, where
        self.clock = clock  # the worker's: where its time went since its last batch (NOTE [stage times])
        self.batch_size = config.layout.batch_size
        self.specs = {spec.name: spec for spec in config.layout.fields}
        self.threads = 1  # that decode its next batch (NOTE [first batch together])
        self.samples = self.skipped = self.padded = 0
        self.index = plan.skip_batches  # the number of the stream's next batch
        self.last_good = None  # a copy of the last row of the last full batch: {field: array}
        self.stale = None  # what a stale sample count is told to (None: a warning; NOTE [stale counts])

    def _handle(self, exn):
        """The user's handler on a bad sample or shard: True to go on (counted as skipped)."""
        if self.config.handler(exn):
            self.skipped += 1
            return True
        return False

    def _source(self):
        """Samples of the plan, through the user's stages, the shuffle buffer and the resume skip."""
        plan, config = self.plan, self.config
        # A buffer reorders, and a position may count what stages and the handler dropped: then
        # resume by replaying the stream and dropping what was consumed (epochplan.py's NOTE).
        replay = config.shuffle_buffer > 1 or plan.consumed is not None
        samples = self._read(plan.shards(resume=not replay))
        for stage in config.stages:
            samples = stage(samples)
        if config.shuffle_buffer > 1:
            samples = buffer_shuffled(samples, config.shuffle_buffer, random.Random(make_seed(plan.seed, "shuffle")))
        if plan.consumed is not None:
            drop = plan.consumed
        else:
            drop = plan.skip_batches * self.batch_size if replay else plan.discard
        # Items of the stream consumed so far, counted from the region's start (without a replay,
        # the skipped batches' samples were skipped by count: one item each).
        self.taken = drop if replay else plan.skip_batches * self.batch_size
        return islice(samples, drop, None)

    def _read(self, ranges):
        clock = self.clock
        counts = self.config.counts or None
        samples = read_ranges(self._entered(ranges), self._handle, self.config.cache_dir, clock.reads, counts,
                              self.stale)
        while True:
            start = perf_counter_ns()
            sample = next(samples, None)
            clock.read_ns += perf_counter_ns() - start
            if sample is None:
                return
            self.where.url, self.where.member = sample.get("__url__"), sample.get("__key__")
            yield sample

    def _entered(self, ranges):
        """``ranges``, noting each shard in ``where`` as its reading starts (no member read yet) and
        announcing it to the loader before it is opened (``Reading``)."""
        for shard in ranges:
            self.where.url, self.where.member = shard.url, None
            self.ready.put(Reading(self.worker, shard.url))
            yield shard

    def run(self):
        """Fill and announce this stream's batches, pausing after each (``self.index`` is the next
        one's number); its value at the end is the ``WorkerDone`` to send."""
        plan, size, clock = self.plan, self.batch_size, self.clock
        slot, rows, ended = None, 0, False
        source = self._source()
        while not ended and (plan.num_batches is None or self.index < plan.num_batches):
            if self.threads > 1:  # NOTE [first batch together]
                slot, arrays = self._take_slot()
                rows, ended = self._fill_together(source, arrays)
                self.threads = 1
            else:
                sample = self._next_sample(source)
                if sample is _END:
                    break
                if slot is None:
                    slot, arrays = self._take_slot()
                try:
                    start = perf_counter_ns()
                    info = self._fill(arrays, rows, sample, self.taken, self.where.url, self.where.member, clock)
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
                slot, rows = self._publish(slot, arrays, size), 0
                yield
        if hasattr(source, "close"):
            source.close()
        if plan.num_batches is None:
            if rows:
                self._publish(slot, arrays, rows)
                yield
            elif slot is not None:  # taken for a sample that was then skipped
                self.free.put(slot)
        else:
            while self.index < plan.num_batches:  # NOTE [full batches]
                if slot is None:
                    slot, arrays = self._take_slot()
                self._pad(arrays, rows)
                slot, rows = self._publish(slot, arrays, size), 0
                yield
        return WorkerDone(self.worker, plan.epoch, self.index, self.samples, self.skipped, self.padded, plan.stream)

    def _next_sample(self, source):
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

    def _fill_together(self, source, arrays):
        """Fill a slot's rows from ``self.threads`` threads (NOTE [first batch together]): each
        sample is read in order and its row filled by the next free thread, then the rows of
        failed samples (that the handler skips) are closed up; ``(rows filled, whether the
        stream ended)``. Errors come out in the order one thread meets them: those of the rows
        read before a read that failed, first."""
        items, clocks, jobs = [], [], []  # per row: (number in the stream, sample); its _FillClock; its future
        read_error = None  # that the handler raised on reading, after the rows read before it

        def fill(row, url, member):
            number, sample = items[row]
            start = perf_counter_ns()
            try:
                return self._fill(arrays, row, sample, number, url, member, clocks[row]), None
            except Exception as exn:
                return None, exn
            finally:
                clocks[row].total_ns = perf_counter_ns() - start

        start, reading = perf_counter_ns(), self.clock.source_ns
        with ThreadPoolExecutor(self.threads, thread_name_prefix="wdsmp-fill") as pool:
            while len(items) < self.batch_size:
                try:
                    sample = self._next_sample(source)
                except Exception as exn:
                    read_error = exn
                    break
                if sample is _END:
                    break
                items.append((self.taken, sample))
                clocks.append(_FillClock())
                jobs.append(pool.submit(fill, len(jobs), self.where.url, self.where.member))
            outcomes = [job.result() for job in jobs]
        reading = self.clock.source_ns - reading  # counted as the source's: the rest is filling
        _FillClock.add_to(self.clock, clocks, perf_counter_ns() - start - reading)
        rows = 0
        for row, ((number, sample), (info, exn)) in enumerate(zip(items, outcomes)):
            if exn is not None:
                if self._handle(_located(exn, sample)):
                    continue
                self.taken = number  # as far as one thread would have read
                return rows, True
            if row != rows:
                for array in arrays.values():
                    array[rows] = array[row]
            self.clock.count_image(info)
            self.samples += 1
            rows += 1
        if read_error is not None:
            raise read_error
        return rows, len(items) < self.batch_size

    def _check_sample(self, sample, url, member):
        """A SampleError unless ``sample`` is a sample dict: a stage that yields None (or anything
        else) neither ends the stream nor passes unnoticed. ``url`` and ``member``: what was read last."""
        if not isinstance(sample, dict):
            stages = self.config.stages
            name = (getattr(stages[-1], "__name__", None) or repr(stages[-1])) if stages else "the reader"
            raise SampleError(f"the stages (the last: {name}) yielded {repr(sample)[:60]}, not a sample dict, "
                              f"after the sample named here was read; a stage drops a sample by not yielding it",
                              url, member)

    def _take_slot(self):
        start = perf_counter_ns()
        slot = _wait(self.free, self.stop)
        self.clock.slot_ns += perf_counter_ns() - start
        return slot, self.ring.views(slot)

    def _publish(self, slot, arrays, count):
        """Announce the slot as batch ``self.index`` and count it; None (no slot in hand)."""
        if count == self.batch_size:  # what _pad repeats once no row of the next slot is filled
            self.last_good = {name: array[-1].copy() for name, array in arrays.items()}
        self.ready.put(BatchReady(slot, self.worker, self.plan.epoch, self.index, count, self.taken, self.plan.stream,
                                  self.clock.batch_times()))
        self.index += 1

    def _pad(self, arrays, rows):
        """Fill rows ``rows:`` with the last good sample: in this slot if it has one, else the
        copy kept from the last full batch (padded or not)."""
        if rows:
            for array in arrays.values():
                array[rows:] = array[rows - 1]
            self.padded += self.batch_size - rows
            return
        if self.last_good is None:
            raise WdsmpError(f"worker {self.worker} read no usable sample in stream {self.plan.stream} of epoch {self.plan.epoch}, "
                             f"so it cannot fill its {self.plan.num_batches - self.plan.skip_batches} batches "
                             f"({self.skipped} samples skipped by the handler)")
        for name, row in self.last_good.items():
            arrays[name][rows:] = row
        self.padded += self.batch_size - rows

    def _fill(self, arrays, row, sample, number, read_url, read_member, clock):
        """Write one sample, the stream's ``number``-th item, into row ``row`` of a slot, its
        decoding timed on ``clock``; its ``ImageInfo``. Raises on anything missing or malformed
        (``read_url`` and ``read_member``: what was read last, for a sample that is none)."""
        self._check_sample(sample, read_url, read_member)
        config = self.config
        url, key = sample.get("__url__"), sample.get("__key__")
        ext = next((e for e in config.image_keys if e in sample), None)
        if ext is None:
            raise SampleError(f"no image field (one of {', '.join(config.image_keys)}) in the sample; "
                              f"it has {_fields(sample)}", url, key)
        # Each sample's own draws: NOTE [first batch together].
        augment = random.Random(make_seed(self.plan.seed, "augment", number)) if config.decode.train else None
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


class _FillClock:
    """One row's decoding and resizing time, and its whole fill's, when rows are filled by threads."""

    __slots__ = ("decode_ns", "resize_ns", "total_ns")

    def __init__(self):
        self.decode_ns = self.resize_ns = self.total_ns = 0

    @staticmethod
    def add_to(clock, clocks, wall_ns):
        """Add rows filled together in ``wall_ns`` to the worker's ``clock``, their stages scaled to
        the wall-clock time, so that the stages still add up to the worker's busy time."""
        share = wall_ns / max(1, sum(c.total_ns for c in clocks))
        clock.decode_ns += int(sum(c.decode_ns for c in clocks) * share)
        clock.resize_ns += int(sum(c.resize_ns for c in clocks) * share)
        clock.fill_ns += wall_ns


def _fields(sample):
    return ", ".join(sorted(k for k in sample if not k.startswith("__"))) or "no fields"


def _label(sample, source, url, key):
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


def _field_value(sample, ext, spec, url, key):
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
