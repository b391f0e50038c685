"""An epoch's tasks on their way to the workers: who starts at once, who waits for the first
batch, and the messages of an epoch that began while the one before it was still delivered.

NOTE [next epoch ahead]
    With known sample counts the loader knows which batch is an epoch's last.
    When that batch is taken off the ready queue, every worker has its whole
    part of the epoch made or under way, and the loader sends the next epoch's
    tasks right behind (``FastLoader`` predicts it: epoch + 1, from its start).
    Each worker takes its task as it finishes the epoch before, so the next
    epoch's first batches are made while the training loop works on the last
    ones, as DataLoader's prefetching does within an epoch. The iterator still
    reading the earlier epoch keeps the later one's messages aside (``early``)
    for the next ``iter()``. If that ``iter()`` asks for another epoch (after
    ``set_epoch`` to another number, ``load_state_dict``, or an epoch left
    unfinished), the workers that went ahead are stopped and new ones start,
    as for any epoch left unfinished. The next epoch's first batch is made
    together too (NOTE [first batch together] in ``worker.py``), its other
    tasks held back as at any epoch's start.
"""

import threading
import time

from .messages import BatchReady, EpochTask, WorkerDone, WorkerFailed

__all__ = ["FIRST_BATCH_HOLD", "EpochStart", "release_after"]

FIRST_BATCH_HOLD = 1.0  # seconds the other workers wait for an epoch's first batch (NOTE [first batch together])


class EpochStart:
    """The tasks of ``plan`` (an ``EpochPlan``) for ``workers`` (``resources.Workers``), where
    ``streams[w]`` are the streams worker w runs. The worker of the first batch gets its task
    now, to make that batch with ``threads`` threads; the others get theirs when it is announced
    (``note``) or ``FIRST_BATCH_HOLD`` seconds have passed (``tick``). ``make_first(worker,
    stream plan, threads)``, where given, may make that batch here instead (a
    ``worker.FirstBatch``, or None), and then the epoch's next batch is the one its worker makes
    with ``threads`` threads as the others wait; ``release_after`` then bounds their wait by
    the time this batch took (``made_in``), as only the loop's next request would end it, and a
    loop's first step may be long. ``release`` is safe from any thread.
    ``early``: this epoch's messages taken off the ready queue by the iterator of the epoch
    before (NOTE [next epoch ahead]), or the batch made here."""

    def __init__(self, workers, plan, streams, threads, make_first=None):
        self.workers, self.plan, self.streams = workers, plan, streams
        self.early = []
        plans = list(plan.streams)
        first = _first_stream(plans)
        self.first_worker = self._owner(first)
        # NOTE [first batch here] in worker.py: made by ``make_first``, nobody waits for it; the
        # next batch is then the one made together.
        began = time.monotonic()
        made = None if make_first is None or first is None else make_first(self.first_worker, plans[first], threads)
        self.made_here, self.made_in = made is not None, time.monotonic() - began
        last_rows, made_by = None, None
        if made is not None:
            self.early, plans[first], made_by = list(made.messages), made.rest, self.first_worker
            if made.last_row is not None:
                last_rows = {first: made.last_row}
            self.first_worker = self._owner(_first_stream(plans))
        self.deferred = {}  # worker -> its EpochTask, not sent yet
        self._releasing = threading.Lock()
        self.release_at = time.monotonic() + FIRST_BATCH_HOLD
        for w, mine in enumerate(streams):
            task = EpochTask(tuple(plans[s] for s in mine), threads if w == self.first_worker else 1,
                             last_rows if w == made_by else None)
            if w == self.first_worker or threads == 1:
                workers.tasks[w].put(task)
            else:
                self.deferred[w] = task

    def _owner(self, stream):
        """The worker that runs ``stream`` (None for None)."""
        return next((w for w, mine in enumerate(self.streams) if stream in mine), None)

    @property
    def epoch(self):
        return self.plan.epoch

    def note(self, message):
        """A message of this epoch arrived: the first batch's announcement (or its worker's end or
        failure) sends the tasks held back."""
        if self.deferred and message.worker == self.first_worker and isinstance(
                message, (BatchReady, WorkerDone, WorkerFailed)):
            self.release()

    def tick(self):
        """Send the tasks held back once ``FIRST_BATCH_HOLD`` seconds have passed."""
        if self.deferred and time.monotonic() >= self.release_at:
            self.release()

    def wait(self, longest):
        """How long a wait for messages may last, at most ``longest`` seconds, before ``tick``."""
        return longest if not self.deferred else max(0.0, min(longest, self.release_at - time.monotonic()))

    def release(self):
        """Send the tasks held back for the first batch (NOTE [first batch together])."""
        with self._releasing:
            deferred, self.deferred = self.deferred, {}
        if not self.workers.broken:
            for w, task in deferred.items():
                self.workers.tasks[w].put(task)


def release_after(start, stop):
    """Send the tasks ``start`` held back once the batch made here would have been made again
    (``start.made_in`` seconds), unless ``stop`` (an Event) is set first: called as the workers
    have started (NOTE [first batch here] in worker.py)."""
    if not stop.wait(start.made_in):
        start.release()


def _first_stream(plans):
    """The stream whose batch comes next at an epoch's start: the one with the fewest batches made
    (the lowest number first); None without streams."""
    return min(range(len(plans)), key=lambda s: (plans[s].skip_batches, s), default=None)
