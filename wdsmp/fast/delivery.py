"""Delivering one epoch's batches in order, from the workers' messages; see NOTE [loader protocol]
in ``loader.py``, whose ``FastLoader`` creates an ``EpochIterator`` for each ``iter()``."""

import time
from queue import Empty

from ..errors import WorkerError
from . import pool as _pool
from .messages import BatchReady, WorkerDone, WorkerFailed, WorkerWarning

__all__ = ["EpochIterator", "Progress"]

_POLL = 0.5  # seconds between liveness checks while waiting for a batch


class Progress:
    """An epoch's delivery counts and state, shared by its iterator and the loader. The loader
    must not hold the iterator (which holds the loader): a ``for`` loop left with ``break``
    drops its iterator, and the loader must still know that the epoch was left unfinished."""

    def __init__(self, plan, workers):
        self.epoch, self.workers = plan.epoch, workers
        # Per stream of the plan (NOTE [plan: exactly once, equal batches]):
        self.delivered = [stream.skip_batches for stream in plan.streams]  # taken off the queue
        self.handed = list(self.delivered)  # given to the user (``.cuda()`` takes some ahead)
        # Items of each sample stream behind the handed batches (BatchReady.consumed).
        self.consumed = [stream.consumed if stream.consumed is not None else stream.skip_batches * plan.batch_size
                         for stream in plan.streams]
        self.finished = False  # no more batches will come
        self.complete = False  # ... and all were handed out: ``state_dict`` moves to the next epoch

    def hand(self, message):
        self.handed[message.stream] += 1
        self.consumed[message.stream] = message.consumed
        self.complete = self.finished and self.handed == self.delivered

    def abandon(self):
        """End the epoch before its end: its workers stop, and the next epoch starts new ones."""
        if not self.finished:
            self.finished = True
            self.workers.shutdown()


class EpochIterator:
    """Delivers one epoch's batches in order (NOTE [loader protocol]); ``streams[w]`` are the
    streams worker w runs (interleaved in this same order)."""

    def __init__(self, loader, workers, plan, streams):
        self.loader, self.workers, self.plan, self.streams = loader, workers, plan, streams
        self.owner = {s: w for w, mine in enumerate(streams) for s in mine}
        self.progress = Progress(plan, workers)
        self.delivered = self.progress.delivered
        self.total = [None] * plan.num_streams  # each stream's batch count, once it is done
        self.pending = {}
        self.held = None

    @property
    def finished(self):
        return self.progress.finished

    def __iter__(self):
        return self

    def __len__(self):
        if self.plan.remaining is None:
            raise TypeError("the batch count of an epoch with unknown sample counts is unknown")
        return self.plan.batches_per_rank - sum(self.delivered)

    def __next__(self):
        if self.held is not None:
            self.release(self.held)
            self.held = None
        message = self.next_message()
        self.progress.hand(message)
        batch = self.loader._tensors(message)
        if self.loader.copy:
            self.release(message)
        else:
            self.held = message
        return batch

    def next_message(self):
        """The next ``BatchReady`` in delivery order; the caller must ``release`` it."""
        if self.finished:
            raise StopIteration
        self.loader._check_open()
        started = time.monotonic()
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
        self.loader._delivered(message, time.monotonic() - started)
        return message

    def release(self, message):
        """Give the slot of ``message`` back to the worker that filled it."""
        if not self.workers.broken:
            self.workers.free[message.worker].put(message.slot)

    def _next_stream(self):
        """The unfinished stream that delivered the fewest batches (the lowest number first);
        None when all are done."""
        candidates = [s for s, n in enumerate(self.delivered) if self.total[s] is None or n < self.total[s]]
        return min(candidates, key=lambda s: (self.delivered[s], s), default=None)

    def _next_worker(self):
        """The worker that makes the next batch; None when all are done."""
        stream = self._next_stream()
        return None if stream is None else self.owner[stream]

    def _receive(self, waiting_for, started):
        """Take one message off the ready queue; raise when a worker failed, died or timed out."""
        try:
            message = self.workers.ready.get(timeout=_POLL)
        except Empty:
            self._check_workers(waiting_for, started)
            return
        self._dispatch(message)

    def _dispatch(self, message):
        if isinstance(message, BatchReady):
            self.pending[(message.stream, message.index)] = message
        elif isinstance(message, WorkerDone):
            self.total[message.stream] = message.batches
            self.loader._stats["skipped"] += message.skipped
            self.loader._stats["padded"] += message.padded
        elif isinstance(message, WorkerWarning):
            message.reissue()
        elif isinstance(message, WorkerFailed):
            self._fail(message.to_error())

    def _check_workers(self, waiting_for, started):
        dead = self.workers.pool.dead()
        if dead:
            while True:  # a worker that failed has sent why before it exited
                try:
                    self._dispatch(self.workers.ready.get(timeout=_POLL))
                except Empty:
                    break
            worker, code = dead[0]
            pid = self.workers.pool.pids()[worker]
            self._fail(WorkerError(f"loader worker {worker} (pid {pid}) died with {_pool.describe_exit(code)} "
                                   f"during epoch {self.plan.epoch}, after delivering "
                                   f"{sum(self.delivered[s] for s in self.streams[worker])} batches; "
                                   f"the epoch cannot be completed"))
        timeout = self.loader.timeout
        if timeout is not None and time.monotonic() - started > timeout:
            stream = self._next_stream()
            self._fail(TimeoutError(f"no batch from loader worker {waiting_for} for {timeout} s "
                                    f"(epoch {self.plan.epoch}, batch {self.delivered[stream]} of its stream {stream})"))

    def _fail(self, error):
        self.held = None
        self.progress.abandon()
        raise error

    def _finish(self):
        self.progress.finished = True
        self.progress.complete = self.progress.handed == self.progress.delivered
        if self.held is not None:
            self.release(self.held)
            self.held = None
