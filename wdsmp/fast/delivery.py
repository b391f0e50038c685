"""Delivering one epoch's batches in order, from the workers' messages; see NOTE [loader protocol]
in ``loader.py``, whose ``FastLoader`` creates an ``EpochIterator`` for each ``iter()`` and
``transfer.CudaLoader`` drives it batch by batch.

NOTE [stalled workers]
    A worker that is stopped (SIGSTOP), blocked in a read that never returns
    (a hung NFS mount) or deadlocked (a stage waiting for ever) makes no batch
    and does not die, so neither the dead-worker check nor a batch timeout
    (``timeout=None`` by default) ends the wait. While the loader waits for
    a worker's batch it therefore samples that worker's activity as the
    kernel counts it (``WorkerPool.activity``: CPU time, bytes read and
    written through any file, socket or pipe, and its main thread's context
    switches, one for every sleep, wait or blocking read that returned). Any
    change, or any message from the worker, is a sign of life; a snapshot
    unchanged for ``stall_timeout`` seconds (120 by default) is a stall: the
    worker is killed and the loader raises a WorkerError naming it and the
    shard it announced last. A slow worker is alive: a stage that sleeps 2 s
    per sample wakes up, a slow download delivers bytes, a long computation
    uses CPU. Nothing of this runs in the workers, nor while batches are
    ready: the hot path does not change. A busy loop in a stage looks alive
    (it is indistinguishable from a long computation): ``timeout`` bounds that.
"""

import time
import warnings
import weakref
from queue import Empty
from time import perf_counter_ns

from .._redact import redacted
from ..errors import WorkerError
from . import pool as _pool
from .messages import BatchReady, Reading, WorkerDone, WorkerFailed, WorkerWarning

__all__ = ["DeliveryState", "EpochIterator"]

_POLL = 0.5  # seconds between liveness checks while waiting for a batch


class DeliveryState:
    """How far an epoch's delivery got, shared by its iterator and the loader. The loader keeps
    this, not the iterator, which a ``for`` loop left with ``break`` drops: the loader must
    still know that the epoch was left unfinished (``abandon``) and where it stood (``state_dict``)."""

    def __init__(self, plan, workers):
        self.epoch = plan.epoch
        # Weak: the loader keeps this state after close(), and the workers' queues (named
        # semaphores in /dev/shm) should go with the loader's own reference.
        self.workers = weakref.ref(workers)
        # Per stream of the plan (NOTE [plan: exactly once, equal batches]):
        self.delivered = [stream.skip_batches for stream in plan.streams]  # taken off the queue
        self.handed = list(self.delivered)  # given to the user (``.cuda()`` takes some ahead)
        # Items of each sample stream behind the handed batches (BatchReady.consumed).
        self.consumed = [stream.consumed if stream.consumed is not None else stream.skip_batches * plan.batch_size
                         for stream in plan.streams]
        self.finished = False  # no more batches will come
        self.complete = False  # ... and all were handed out: ``state_dict`` moves to the next epoch
        # Set while every batch is off the queue but the end was not asked for: takes the
        # workers' end-of-epoch messages as the end would have (``leave``).
        self.settle = None

    def hand(self, message):
        self.handed[message.stream] += 1
        self.consumed[message.stream] = message.consumed
        self.complete = self.finished and self.handed == self.delivered

    @property
    def handed_out(self):
        """Whether every batch of the epoch went to the user: it ended, or its end was never
        asked for after its last batch (``settle`` is set): ``state_dict`` moves to the next epoch."""
        return self.complete or (self.settle is not None and self.handed == self.delivered)

    def leave(self):
        """The next ``iter()`` comes: an epoch whose batches were all handed out, its end never
        asked for (``zip(range(len(loader)), loader)``), is ended as its end would have ended
        it, and its workers go on with the next epoch; any other is abandoned."""
        settle, ready = self.settle, self.handed_out and not self.finished
        self.settle = None
        if ready:
            try:
                settle()
            except Exception as exn:  # every batch was handed out: the next epoch gets new workers
                warnings.warn(f"epoch {self.epoch} failed after its last batch ({exn}); the next epoch "
                              f"starts new workers", RuntimeWarning, stacklevel=3)
        self.abandon()

    def abandon(self):
        """End the epoch before its end: its workers stop, and the next epoch starts new ones."""
        self.settle = None
        if not self.finished:
            self.finished = True
            workers = self.workers()
            if workers is not None:  # else shut down and gone already
                workers.shutdown()


class EpochIterator:
    """Delivers one epoch's batches in order (NOTE [loader protocol]); ``start`` (an
    ``epochstart.EpochStart``) sent the workers their tasks, and holds some back until the
    first batch is announced; ``start.streams[w]`` are the streams worker w runs (interleaved
    in this same order). ``ahead``: a weak reference (``weakref.WeakMethod``) to the loader's
    function that, called with this epoch's number once its last batch is taken off the queue,
    sends the next epoch's tasks and returns their ``EpochStart``, or None (NOTE [next epoch
    ahead] in ``epochstart.py``).

    Its collaborators, all the loader's: ``resources`` (``resources.LoaderResources``: the ring
    and whether the loader is still open), ``slots`` (``batches.SlotTensors``: a message's slot
    as a ``Batch``), ``stats`` (``stats.LoaderStats``), ``timeout`` (seconds without a batch
    before a ``TimeoutError``; None waits as long as the workers live) and ``stall_timeout``
    (seconds the awaited worker may show no sign of life before a ``WorkerError``; NOTE
    [stalled workers])."""

    def __init__(self, start, *, resources, slots, stats, timeout=None, stall_timeout=None, ahead=None):
        self.start, self.workers, self.plan, self.streams = start, start.workers, start.plan, start.streams
        self.resources, self.slots, self.stats, self.timeout = resources, slots, stats, timeout
        self.stall_timeout = stall_timeout
        self.reading = {}  # worker -> the shard it said it reads
        self.activity = {}  # worker -> (its last activity snapshot, when that was first seen)
        self.checked = time.monotonic()  # the last liveness check
        self.owner = {s: w for w, mine in enumerate(self.streams) for s in mine}
        self.state = DeliveryState(self.plan, self.workers)
        self.delivered = self.state.delivered
        self.total = [None] * self.plan.num_streams  # each stream's batch count, once it is done
        self.pending = {}
        self.held = None
        self.ahead = ahead  # until called; then the next epoch's EpochStart, or None
        self.next_start = None
        # Taken before the ready queue, at the first ``next()``: a failure among them is raised
        # there, as any failure of the epoch, once the loader holds this epoch's state.
        self.early, start.early = start.early, []

    @property
    def finished(self):
        return self.state.finished

    def __iter__(self):
        return self

    def __len__(self):
        if self.plan.remaining is None:
            raise TypeError("the batch count of an epoch with unknown sample counts is unknown")
        return self.plan.batches_per_rank - sum(self.delivered)

    def __next__(self):
        self.stats.returned()
        if self.held is not None:
            self.release(self.held)
            self.held = None
        message = self.next_message()
        self.hand(message)
        batch = self.slots.batch(message)
        if self.slots.copy:
            self.release(message)
        else:
            self.held = message
        self.stats.handed()
        return batch

    def next_message(self):
        """The next ``BatchReady`` in delivery order; the caller must ``release`` it, and
        ``hand`` it when its batch goes to the user."""
        if self.finished:
            raise StopIteration
        self.resources.check_open()
        started, waiting = time.monotonic(), perf_counter_ns()
        while True:
            stream = self._next_stream()
            if stream is None:
                self._finish()
                raise StopIteration
            worker = self.owner[stream]
            message = self.pending.pop((stream, self.delivered[stream]), None)
            if message is not None:
                break
            self._receive(worker, started)
        self.delivered[stream] += 1
        self.stats.add_batch(message, perf_counter_ns() - waiting, self.plan.epoch)
        if self.ahead is not None and self._last_batch_delivered():
            method, self.ahead = self.ahead(), None  # NOTE [next epoch ahead] in epochstart.py
            self.next_start = None if method is None else method(self.plan.epoch)
            self.state.settle = self._settle
        return message

    def _settle(self):
        """Take the rest of this epoch's messages, its batches all delivered (``DeliveryState.leave``)."""
        try:
            self.next_message()
        except StopIteration:
            return
        raise RuntimeError("a batch beyond the epoch's planned count")  # the plan says none can come

    def _last_batch_delivered(self):
        """Whether every stream's planned batches are off the queue (known counts only)."""
        return all(stream.num_batches is not None and self.delivered[s] >= stream.num_batches
                   for s, stream in enumerate(self.plan.streams))

    def hand(self, message):
        """The batch of ``message`` goes to the user now: ``state_dict`` counts it as seen."""
        self.state.hand(message)

    def release(self, message):
        """Give the slot of ``message`` back to the worker that filled it."""
        if not self.workers.broken:
            self.workers.free[message.worker].put(message.slot)

    def _next_stream(self):
        """The unfinished stream that delivered the fewest batches (the lowest number first);
        None when all are done."""
        candidates = [s for s, n in enumerate(self.delivered) if self.total[s] is None or n < self.total[s]]
        return min(candidates, key=lambda s: (self.delivered[s], s), default=None)

    def next_worker(self):
        """The worker that makes the next batch; None when all are done."""
        stream = self._next_stream()
        return None if stream is None else self.owner[stream]

    def _receive(self, waiting_for, started):
        """Take one message (this epoch's early ones first, then off the ready queue); raise when a
        worker failed, died, stalled or timed out (checked at least every ``_POLL`` seconds, also
        while other workers' messages keep coming)."""
        if self.early:  # they came off the ready queue first
            self._dispatch(self.early.pop(0))
            return
        starts = [start for start in (self.start, self.next_start) if start is not None]
        wait = min(start.wait(_POLL) for start in starts)
        try:
            message = self.workers.ready.get(timeout=wait)
        except Empty:
            message = None
        if message is not None:
            self._dispatch(message)
        for start in starts:
            start.tick()
        if message is None or time.monotonic() - self.checked >= _POLL:
            self.checked = time.monotonic()
            self._check_workers(waiting_for, started)

    def _worker_done(self, worker):
        """Whether ``worker`` has ended all its streams of this epoch (its later messages and its
        exit belong to the next epoch)."""
        return all(self.total[s] is not None for s in self.streams[worker])

    def _dispatch(self, message):
        self.activity.pop(message.worker, None)  # a message is a sign of life
        later = self.next_start is not None and not isinstance(message, WorkerWarning) and (
            getattr(message, "epoch", None) == self.next_start.epoch
            or (not hasattr(message, "epoch") and self._worker_done(message.worker)))
        if later:  # NOTE [next epoch ahead] in epochstart.py
            self.next_start.early.append(message)
            self.next_start.note(message)
            return
        self.start.note(message)
        if isinstance(message, Reading):
            self.reading[message.worker] = message.shard
        elif isinstance(message, BatchReady):
            self.pending[(message.stream, message.index)] = message
        elif isinstance(message, WorkerDone):
            self.total[message.stream] = message.batches
            self.stats.add_stream_end(message.skipped, message.padded)
        elif isinstance(message, WorkerWarning):
            message.reissue()
        elif isinstance(message, WorkerFailed):
            self._fail(message.to_error())

    def _check_workers(self, waiting_for, started):
        if self.workers.start_failure is not None:
            failure = self.workers.start_failure
            error = WorkerError(f"the loader workers failed to start, after a first batch made in this process: "
                                f"{type(failure).__name__}: {failure}; epoch {self.plan.epoch} cannot be completed")
            error.__cause__ = failure
            self._fail(error)
        if self.workers.pool is not None:  # None while they start (NOTE [first batch here] in worker.py)
            self._check_processes(waiting_for)
        timeout = self.timeout
        if timeout is not None and time.monotonic() - started > timeout:
            stream = self._next_stream()
            self._fail(TimeoutError(f"no batch from loader worker {waiting_for} for {timeout} s "
                                    f"(epoch {self.plan.epoch}, batch {self.delivered[stream]} of its stream {stream})"))

    def _check_processes(self, waiting_for):
        # A worker that ended its part of this epoch and died after is the next epoch's to report.
        if any(not self._worker_done(w) for w, _ in self.workers.pool.dead()):
            while True:  # a worker that failed has sent why before it exited
                try:
                    self._dispatch(self.workers.ready.get(timeout=_POLL))
                except Empty:
                    break
        dead = [(w, code) for w, code in self.workers.pool.dead() if not self._worker_done(w)]
        if dead:
            worker, code = dead[0]
            pid = self.workers.pool.pids()[worker]
            self._fail(WorkerError(f"loader worker {worker} (pid {pid}) died with {_pool.describe_exit(code)} "
                                   f"during epoch {self.plan.epoch}, after delivering "
                                   f"{sum(self.delivered[s] for s in self.streams[worker])} batches; "
                                   f"the epoch cannot be completed"))
        if self.stall_timeout is not None:
            self._check_progress(waiting_for)

    def _check_progress(self, worker):
        """NOTE [stalled workers]: a WorkerError once ``worker`` has shown no sign of life for
        ``stall_timeout`` seconds of waiting for it."""
        now, pool = time.monotonic(), self.workers.pool
        snapshot = pool.activity(worker)
        last = self.activity.get(worker)
        if snapshot is None or last is None or snapshot != last[0]:
            self.activity[worker] = (snapshot, now)
            return
        if now - last[1] < self.stall_timeout:
            return
        state, pid = pool.state(worker), pool.pids()[worker]
        pool.kill(worker)
        shard = self.reading.get(worker)
        where = f" while reading shard {redacted(shard)!r}" if shard is not None else ""
        self._fail(WorkerError(
            f"loader worker {worker} (pid {pid}) made no progress for {now - last[1]:.0f} s{where} during epoch "
            f"{self.plan.epoch} (no CPU time, no bytes read or written, no wake-up; its state was {state!r}): "
            f"stopped (SIGSTOP), blocked in a read that does not return (a hung network file system) or "
            f"deadlocked (a stage waiting forever). It was killed; the epoch cannot be completed. A slow worker "
            f"that still shows signs of life is never stopped: set stall_timeout (now {self.stall_timeout:g} s) "
            f"higher, or None to wait for ever"))

    def _fail(self, error):
        self.held = None
        self.state.abandon()
        raise error

    def _finish(self):
        self.state.settle = None
        self.state.finished = True
        self.state.complete = self.state.handed == self.state.delivered
        if self.held is not None:
            self.release(self.held)
            self.held = None
