"""Delivering one epoch's batches in order, from the workers' messages: ``Delivery`` owns an
epoch's state, ``EpochIterator`` is what ``iter(loader)`` returns (``transfer.CudaLoader`` drives
the same ``Delivery`` batch by batch).

NOTE [loader protocol]
    * Pipes: each worker has a pipe from the loader (its ``EpochTask`` of each
      epoch, the slots given back, ``Stop``) and one to the loader
      (``Reading``, ``BatchReady``, ``WorkerDone``, ``WorkerFailed``,
      ``WorkerWarning``: warnings are issued again in the main process). Each
      pipe keeps its messages in order; the loader waits on all the pipes at
      once (``multiprocessing.connection.wait``). What the loader sends is a
      few bytes and never more than a worker's slots and two tasks, so its
      sends never block.
    * Slots belong to workers: worker w owns ``prefetch`` slots, and a slot
      the loader is done with goes back to its owner. Batches are delivered
      in a fixed order (below), so with one shared free list the fast
      workers could take every slot while the loader waits for a slow
      worker's batch, which then has nowhere to go: a deadlock. Owned slots
      rule it out; the ring has ``prefetch * num_workers`` slots.
    * Order: the next batch comes from the stream (a worker's part of the
      plan), among those not finished, that has delivered the fewest batches
      (the lowest index first). With known counts that is the plan's round
      robin, batch k from stream k % W (NOTE [plan: exactly once, equal
      batches]); with unknown counts it is round robin skipping finished
      streams. It depends only on the counts delivered, so a resumed epoch
      continues in the same order, also on another number of workers: a
      worker then runs several streams, making their batches in this order.
    * Waiting: every wait has a short timeout after which the workers'
      liveness is checked: a worker that died is reported within a second,
      naming its exit code or signal, and the awaited worker's signs of life
      are sampled (NOTE [stalled workers]).
    * Workers persist across epochs. An epoch left unfinished (``break``,
      an error, a new ``iter()``) stops them, and the next epoch starts new
      ones: their slots and pipes are in an unknown state. An epoch whose
      batches were all handed out is finished, also when its end was never
      asked for (``zip(range(len(loader)), loader)``): the next ``iter()``
      takes the workers' end-of-epoch messages first (``Delivery.leave``).

NOTE [next epoch ahead]
    Once every stream of the epoch has ended (each worker says so right after
    its last batch is made, and the loader reads what came at every
    ``next()``), the loader sends the next epoch's tasks (epoch + 1, unless
    ``set_epoch`` or ``load_state_dict`` asked for another). The batches of
    this epoch still to be handed out wait in their slots; each slot handed
    back then goes to the next epoch's first batches, which are made while
    the training loop works on this epoch's last ones, as DataLoader's
    prefetching does within an epoch. A worker's messages of the next epoch
    come after its end of this one in its pipe, so this epoch stops listening
    to a worker once it has ended its streams, and the next ``Delivery``
    reads on from there. If the next ``iter()`` asks for another epoch than
    the one sent ahead, the workers are stopped and new ones start, as for an
    epoch left unfinished.

NOTE [stalled workers]
    A worker that is stopped (SIGSTOP), blocked in a read that never returns
    (a hung NFS mount) or deadlocked (a stage waiting for ever) makes no batch
    and does not die, so neither the dead-worker check nor a batch timeout
    (``timeout=None`` by default) ends the wait. While the loader waits for
    a worker's batch it therefore samples that worker's activity as the
    kernel counts it, with that of the processes it started (a program a
    stage runs): ``WorkerPool.activity``, CPU time, bytes read and written
    through any file, socket or pipe, and context switches, one for every
    sleep, wait or blocking read that returned. Any change, or any message
    from the worker, is a sign of life; a snapshot unchanged for
    ``stall_timeout`` seconds (120 by default) is a stall: the worker is
    killed, with the processes it started, and the loader raises a
    WorkerError naming it and the shard it announced last. A slow worker is
    alive: a stage that sleeps 2 s per sample wakes up, a slow download
    delivers bytes, a long computation uses CPU, in the worker or in a
    program it waits for. Nothing of this runs in the workers, nor while batches are
    ready: the hot path does not change. A busy loop in a stage looks alive
    (it is indistinguishable from a long computation): ``timeout`` bounds that.
"""

import enum
import time
import warnings
from time import perf_counter_ns
from typing import TYPE_CHECKING, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from .._internal.redact import redacted
from ..errors import WorkerError
from .messages import BatchReady, Reading, WorkerDone, WorkerFailed, WorkerWarning
from .pool import EOF, StartFailed, describe_exit

if TYPE_CHECKING:
    import weakref

    from ..epochs.plan import EpochPlan
    from .batches import Batch, SlotTensors
    from .resources import LoaderResources, Workers
    from .stats import LoaderStats
    from .variety import LabelVariety

__all__ = ["Delivery", "EpochIterator"]

_POLL = 0.5  # seconds between liveness checks while waiting for a batch


_ENDS_WAIT = 1.0  # seconds the last batch waits for the streams' ends that follow it (milliseconds as a rule)


class Phase(enum.Enum):
    """Where an epoch's delivery stands. The transitions (``_NEXT_PHASES``)::

        READING --the last planned batch taken--> ALL_TAKEN
        READING, ALL_TAKEN --the end reached, with batches taken ahead not yet handed out (.cuda()),
                             or abandoned--> FINISHED
        READING, ALL_TAKEN --the end reached, every batch handed out--> COMPLETE
        FINISHED --the last batch taken ahead handed out--> COMPLETE

    Whether every stream's end has arrived (the next epoch may go ahead) is another matter, kept
    beside it in ``Delivery.streams_ended``."""

    READING = "batches still to come from the workers"
    ALL_TAKEN = "every planned batch taken from the workers (known counts only)"
    FINISHED = "no more batches will come"
    COMPLETE = "no more batches will come, and all went to the user: state_dict moves to the next epoch"

    @property
    def finished(self) -> bool:
        return self in (Phase.FINISHED, Phase.COMPLETE)


_NEXT_PHASES = {
    Phase.READING: {Phase.ALL_TAKEN, Phase.FINISHED, Phase.COMPLETE},
    Phase.ALL_TAKEN: {Phase.FINISHED, Phase.COMPLETE},
    Phase.FINISHED: {Phase.COMPLETE},
    Phase.COMPLETE: set(),
}


class Delivery:
    """One epoch's delivery (NOTE [loader protocol]): the batches of ``plan`` (an ``EpochPlan``),
    made by ``workers`` (``resources.Workers``, their tasks sent), where ``streams[w]`` are the
    streams worker w runs.

    Its collaborators, all the loader's: ``resources`` (``resources.LoaderResources``: the ring
    and whether the loader is still open), ``slots`` (``batches.SlotTensors``: a message's slot
    as a ``Batch``), ``stats`` (``stats.LoaderStats``), ``timeout`` (seconds without a batch
    before a ``TimeoutError``; None waits as long as the workers live), ``stall_timeout``
    (seconds the awaited worker may show no sign of life before a ``WorkerError``; NOTE
    [stalled workers]) and ``ahead``, a weak reference (``weakref.WeakMethod``) to the loader's
    function that sends the next epoch's tasks once every stream of this one has ended (NOTE
    [next epoch ahead]).

    Where the epoch stands, for ``state_dict``: ``handed`` (each stream's batches given to the
    user), ``consumed`` (each stream's items behind them), ``read`` (each stream's samples read
    behind them), ``handed_out`` (all of them)."""

    def __init__(self, plan: "EpochPlan", workers: "Workers", streams: Sequence[Sequence[int]], *,
                 resources: "LoaderResources", slots: "SlotTensors", stats: "LoaderStats",
                 timeout: Optional[float] = None, stall_timeout: Optional[float] = None,
                 ahead: Optional["weakref.WeakMethod[Callable[[int], None]]"] = None,
                 variety: Optional["LabelVariety"] = None, read: Optional[Sequence[Optional[int]]] = None) -> None:
        self.plan, self.workers, self.streams = plan, workers, streams
        self.variety = variety  # a variety.LabelVariety watching the labels, or None
        self.resources, self.slots, self.stats = resources, slots, stats
        self.timeout, self.stall_timeout, self.ahead = timeout, stall_timeout, ahead
        self.owner = {s: w for w, mine in enumerate(streams) for s in mine}
        # Per stream of the plan (NOTE [plan: exactly once, equal batches]):
        self.delivered = [stream.skip_batches for stream in plan.streams]  # taken from the workers
        self.handed = list(self.delivered)  # given to the user (``.cuda()`` takes some ahead)
        # Items of each sample stream behind the handed batches (BatchReady.consumed).
        self.consumed = [stream.consumed if stream.consumed is not None else stream.skip_batches * plan.batch_size
                         for stream in plan.streams]
        # Samples of each stream read behind them (BatchReady.read): ``read`` (a loaded state's), else
        # the delivered batches' when they were skipped by count; None: not known until its next batch.
        self.read = list(read) if read is not None and len(read) == plan.num_streams else [
            None if stream.consumed is not None else stream.skip_batches * plan.batch_size for stream in plan.streams]
        self.total: List[Optional[int]] = [None] * plan.num_streams  # each stream's batch count, once it is done
        # (stream, index) -> its BatchReady, arrived ahead of its turn
        self.pending: Dict[Tuple[int, int], BatchReady] = {}
        self.held: Optional[BatchReady] = None  # the BatchReady whose slot the user holds (NOTE [batch lifetime])
        self.phase = Phase.READING
        self.streams_ended = False  # every stream's end arrived: the next epoch may go (NOTE [next epoch ahead])
        self.reading: Dict[int, str] = {}  # worker -> the shard it said it reads
        # worker -> (its last activity snapshot, when that was first seen)
        self.activity: Dict[int, Tuple[object, float]] = {}
        self.checked = time.monotonic()  # the last liveness check

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def handed_out(self) -> bool:
        """Whether every batch of the epoch went to the user (its end asked for or not):
        ``state_dict`` moves to the next epoch."""
        return self.phase is Phase.COMPLETE or (self.phase is Phase.ALL_TAKEN and self.handed == self.delivered)

    def __len__(self) -> int:
        if self.plan.remaining is None:
            raise TypeError("the batch count of an epoch with unknown sample counts is unknown")
        assert self.plan.batches_per_rank is not None  # remaining is None exactly when it is
        return self.plan.batches_per_rank - sum(self.delivered)

    def next_batch(self) -> "Batch":
        """The next batch on the CPU (a ``Batch`` of views of its slot, NOTE [batch lifetime]); the
        slot of the one before goes back to its worker."""
        self.stats.returned()
        if self.held is not None:
            self.release(self.held)
            self.held = None
        message = self.next_message()
        assert message is not None  # wait=True: None never comes
        self.hand(message)
        batch = self.slots.batch(message)
        if self.slots.copy:
            self.release(message)
        else:
            self.held = message
        self.stats.handed()
        return batch

    def next_message(self, wait: bool = True) -> Optional[BatchReady]:
        """The next ``BatchReady`` in delivery order; the caller must ``release`` it, and ``hand``
        it when its batch goes to the user. ``wait=False``: None if it has not arrived yet."""
        if self.phase.finished:
            raise StopIteration
        self.resources.check_open()
        started, waiting = time.monotonic(), perf_counter_ns()
        try:
            if not self.streams_ended or not wait:  # read what came meanwhile: the epoch's end, as soon as it is made
                for worker, message in self.workers.pool.receive(self._listening(), 0.0):
                    self._dispatch(worker, message)
            while True:
                stream = self._next_stream()
                if stream is None:
                    self._finish()
                    raise StopIteration
                message = self.pending.pop((stream, self.delivered[stream]), None)
                if message is not None:
                    break
                if not wait:
                    return None
                self._receive(self.owner[stream], started)
        except KeyboardInterrupt:  # a message may be half taken: the epoch cannot go on
            self.abandon()
            raise
        self.delivered[stream] += 1
        self.stats.add_batch(message, perf_counter_ns() - waiting, self.plan.epoch)
        if self.phase is Phase.READING and self._last_batch_delivered():
            self._advance(Phase.ALL_TAKEN)
            self._await_ends()
        if self.variety is not None and not self.variety.done:
            labels = self.slots.labels(message)
            if labels is not None:
                self.variety.observe(labels)
        return message

    def _await_ends(self) -> None:
        """Every planned batch is made: read the streams' ends, which follow their last batches at
        once, so that the next epoch goes ahead now (NOTE [next epoch ahead]), not at the next
        ``next()``, which may never come before the training loop's last steps."""
        deadline = time.monotonic() + _ENDS_WAIT
        while not self.streams_ended and self._listening() and time.monotonic() < deadline:
            for worker, message in self.workers.pool.receive(self._listening(), deadline - time.monotonic()):
                self._dispatch(worker, message)

    def _last_batch_delivered(self) -> bool:
        """Whether every stream's planned batches are taken (known counts only)."""
        return all(stream.num_batches is not None and self.delivered[s] >= stream.num_batches
                   for s, stream in enumerate(self.plan.streams))

    def hand(self, message: BatchReady) -> None:
        """The batch of ``message`` goes to the user now: ``state_dict`` counts it as seen."""
        self.handed[message.stream] += 1
        self.consumed[message.stream] = message.consumed
        self.read[message.stream] = message.read
        if self.phase is Phase.FINISHED and self.handed == self.delivered:
            self._advance(Phase.COMPLETE)

    def release(self, message: BatchReady) -> None:
        """Give the slot of ``message`` back to the worker that filled it."""
        self.workers.release(message.slot)

    def leave(self) -> None:
        """The next ``iter()`` comes (or the loader closes): an epoch whose batches were all handed
        out, its end never asked for (``zip(range(len(loader)), loader)``), is ended as its end
        would have ended it, and its workers go on with the next epoch; any other is abandoned."""
        if not self.phase.finished and self.handed_out and not self.resources.closed:
            try:
                self.next_message()
            except StopIteration:
                return
            except Exception as exn:  # every batch was handed out: the next epoch gets new workers
                warnings.warn(f"epoch {self.plan.epoch} failed after its last batch ({exn}); the next epoch "
                              f"starts new workers", RuntimeWarning, stacklevel=3)
            else:  # the plan says none can come
                warnings.warn(f"epoch {self.plan.epoch} has a batch beyond its planned count; the next epoch "
                              f"starts new workers", RuntimeWarning, stacklevel=3)
        self.abandon()

    def abandon(self) -> None:
        """End the epoch before its end: its workers stop, and the next epoch starts new ones."""
        self.held = None
        if not self.phase.finished:
            self._advance(Phase.FINISHED)
            self.workers.shutdown()

    def _next_stream(self) -> Optional[int]:
        """The unfinished stream that delivered the fewest batches (the lowest number first);
        None when all are done."""
        candidates = [s for s, n in enumerate(self.delivered) if (total := self.total[s]) is None or n < total]
        return min(candidates, key=lambda s: (self.delivered[s], s), default=None)

    def _worker_done(self, worker: int) -> bool:
        """Whether ``worker`` has ended all its streams of this epoch (its later messages and its
        exit belong to the next epoch)."""
        return all(self.total[s] is not None for s in self.streams[worker])

    def _listening(self) -> List[int]:
        return [w for w in range(len(self.streams)) if not self._worker_done(w)]

    def _receive(self, waiting_for: int, started: float) -> None:
        """Take the messages waiting (for up to ``_POLL`` seconds, for the first); raise when a
        worker failed, died, stalled or timed out (checked at least every ``_POLL`` seconds, also
        while other workers' messages keep coming)."""
        received = self.workers.pool.receive(self._listening(), _POLL)
        for worker, message in received:
            self._dispatch(worker, message)
        if not received or time.monotonic() - self.checked >= _POLL:
            self.checked = time.monotonic()
            self._check_workers(waiting_for, started)

    def _dispatch(self, worker: int, message: object) -> None:
        self.activity.pop(worker, None)  # a message is a sign of life
        if message is EOF:  # it exited: its last words were read before
            self.workers.pool.join(worker, 1.0)
            self._check_processes(worker)
        elif isinstance(message, Reading):
            self.reading[worker] = message.shard
        elif isinstance(message, BatchReady):
            self.pending[(message.stream, message.index)] = message
        elif isinstance(message, WorkerDone):
            self.total[message.stream] = message.batches
            self.stats.add_stream_end(message.skipped, message.padded)
            if not self.streams_ended and all(total is not None for total in self.total):
                self.streams_ended = True
                send_ahead = None if self.ahead is None else self.ahead()  # NOTE [next epoch ahead]
                if send_ahead is not None:
                    send_ahead(self.plan.epoch)
        elif isinstance(message, WorkerWarning):
            message.reissue()
        elif isinstance(message, WorkerFailed):
            self._fail(message.to_error())
        elif isinstance(message, StartFailed):
            self._fail(WorkerError(f"loader worker {worker} failed to start: {message.exc_type}: {message.message}\n"
                                   f"--- traceback in worker {worker} ---\n{message.traceback.rstrip()}"))

    def _check_workers(self, waiting_for: int, started: float) -> None:
        self._check_processes(waiting_for)
        timeout = self.timeout
        if timeout is not None and time.monotonic() - started > timeout:
            stream = self._next_stream()
            if stream is None:  # the last stream's end came in as the time ran out: nothing is late
                return
            self._fail(TimeoutError(f"no batch from loader worker {waiting_for} for {timeout} s "
                                    f"(epoch {self.plan.epoch}, batch {self.delivered[stream]} of its stream "
                                    f"{stream})"))

    def _check_processes(self, waiting_for: int) -> None:
        # A worker that ended its part of this epoch and died after is the next epoch's to report.
        pool = self.workers.pool
        for worker, _ in pool.dead():  # a worker that failed said why before it exited: read that first
            while not self._worker_done(worker):  # (and no further: what follows is the next epoch's)
                received = pool.receive([worker], 0.0)
                if not received or received[0][1] is EOF:
                    break
                self._dispatch(worker, received[0][1])
        dead = [(w, code) for w, code in pool.dead() if not self._worker_done(w)]
        if dead:
            worker, code = dead[0]
            self._fail(WorkerError(f"loader worker {worker} (pid {pool.pids()[worker]}) died with "
                                   f"{describe_exit(code)} during epoch {self.plan.epoch}, after delivering "
                                   f"{sum(self.delivered[s] for s in self.streams[worker])} batches; "
                                   f"the epoch cannot be completed"))
        if self.stall_timeout is not None:
            self._check_progress(waiting_for)

    def _check_progress(self, worker: int) -> None:
        """NOTE [stalled workers]: a WorkerError once ``worker`` has shown no sign of life for
        ``stall_timeout`` seconds of waiting for it."""
        assert self.stall_timeout is not None  # _check_processes calls it only then
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

    def _fail(self, error: Exception) -> NoReturn:
        self.abandon()
        raise error

    def _advance(self, phase: Phase) -> None:
        """Move the epoch to ``phase``, along Phase's transitions only."""
        if phase not in _NEXT_PHASES[self.phase]:
            raise RuntimeError(f"an epoch cannot go from {self.phase.name} to {phase.name}")
        self.phase = phase

    def _finish(self) -> None:
        self._advance(Phase.COMPLETE if self.handed == self.delivered else Phase.FINISHED)
        if self.held is not None:
            self.release(self.held)
            self.held = None


class EpochIterator:
    """What ``iter(loader)`` returns: the batches of one epoch (``delivery``, a ``Delivery``).
    It holds the loader, so that ``for batch in FastLoader(...)`` keeps the loader, its workers
    and its memory alive until the loop lets go of its iterator (NOTE [shutdown order] in
    ``loader.py``)."""

    def __init__(self, loader: object, delivery: Delivery) -> None:
        self.loader, self.delivery = loader, delivery

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> "Batch":
        return self.delivery.next_batch()

    def __len__(self) -> int:
        """The batches still to come this epoch (TypeError where sample counts are unknown)."""
        return len(self.delivery)
