"""What a FastLoader holds and ``close()`` releases: the ring, the current generation of workers
and their queues, and clean-ups such as pinned-memory registrations (NOTE [shutdown order] and
NOTE [loader protocol] in ``loader.py``). Kept apart from the loader object, so that the
loader's finalizer holds no reference cycle."""

import errno
import threading
from queue import Empty

from . import pool as _pool
from .messages import Stop
from .worker import worker_main

__all__ = ["LoaderResources", "Workers"]


class Workers:
    """One generation of worker processes and their queues (NOTE [loader protocol]); the queues
    are made here, the processes by ``start()``: tasks may be queued before."""

    def __init__(self, config, num_workers, prefetch, start_method):
        self.config = config
        ctx = self.ctx = _pool.context(start_method)
        try:
            with _pool.named_semaphores():  # NOTE [semaphore names] in pool.py
                self.stop_event = ctx.Event()
                self.ready = ctx.Queue()
                self.tasks = [ctx.Queue() for _ in range(num_workers)]
                self.free = [ctx.Queue() for _ in range(num_workers)]
        except OSError as exn:
            if exn.errno != errno.ENOSPC:
                raise
            raise _pool.no_room_for_semaphores(num_workers) from exn
        for w, queue in enumerate(self.free):
            for slot in range(w * prefetch, (w + 1) * prefetch):
                queue.put(slot)
        self.broken = False
        self.ahead = None  # the EpochStart of the epoch these workers went on with (NOTE [next epoch ahead])
        self.pool = None  # the WorkerPool, once started
        self.start_failure = None  # what ended a start in the background
        self._starter = None  # the thread of that start

    def start(self, background=False, then=None):
        """Start the worker processes (once), and the fork server first where it is not running;
        ``background``: in a thread, returning at once, which then calls ``then()`` (NOTE [first
        batch here] in ``worker.py``): ``pool`` is None until they started, ``start_failure``
        what went wrong, if anything."""
        if self.pool is not None or self._starter is not None:
            return
        if not background:
            self._start()
            return
        self._starter = threading.Thread(target=self._start_in_background, args=(then,), name="wdsmp-start-workers",
                                         daemon=True)
        self._starter.start()

    def _start(self):
        main = _pool.refers_to_main(self.config)
        _pool.start_server(self.ctx, main)
        if self.stop_event.is_set():  # shut down meanwhile: nobody would stop them
            return
        self.pool = _pool.WorkerPool(worker_main, [(w, self.config, self.tasks[w], self.free[w], self.ready,
                                                    self.stop_event) for w in range(len(self.tasks))],
                                     self.ctx, main=main)

    def _start_in_background(self, then):
        try:
            self._start()
        except BaseException as exn:
            self.start_failure = exn
            return
        if then is not None:
            then()

    def pids(self, timeout=60.0):
        """The workers' process ids, once started (waiting up to ``timeout`` seconds for a start in
        the background)."""
        if self._starter is not None:
            self._starter.join(timeout)
        if self.start_failure is not None:
            raise self.start_failure
        if self.pool is None:
            raise TimeoutError(f"the loader workers did not start in {timeout} s")
        return self.pool.pids()

    def shutdown(self, timeout=5.0):
        """NOTE [shutdown order], the workers' part. Idempotent; done even when interrupted."""
        if self.broken:
            return
        self.broken, self.ahead = True, None
        try:
            self.stop_event.set()
            for queue in self.tasks:
                queue.put(Stop())
            if self._starter is not None and self._starter is not threading.current_thread():
                # (a collection in that thread may finalize the loader.) What it starts after the
                # stop event exits at once; a start that hangs leaves processes that exit with us.
                self._starter.join(timeout)
            if self.pool is not None:
                self.pool.stop(timeout)
        finally:
            if self.pool is not None:
                self.pool.stop(0.0)  # after an interrupted join: terminate and kill at once
            for queue in self.tasks:
                _drain(queue)
            for queue in [self.ready, *self.tasks, *self.free]:
                queue.cancel_join_thread()
                queue.close()


def _drain(queue):
    """Take what no worker took off ``queue``: a task larger than a pipe holds (one carrying a
    row, NOTE [first batch here] in ``worker.py``) would keep its feeder thread blocked for ever."""
    while not queue.empty():
        try:
            queue.get(timeout=0.1)
        except Empty:
            return


class LoaderResources:
    """The ring (``ring``), the current ``Workers`` (``workers``, None before the first epoch),
    and callables run at ``close()`` before the ring goes (``on_close``). ``pinned``: whether
    the ring is registered with CUDA as pinned memory (None: not tried yet; ``transfer.py``)."""

    def __init__(self, ring):
        self.ring = ring
        self.workers = None
        # The current epoch's DeliveryState: one whose batches were all handed out holds its
        # iterator (and so the workers' queues) until settled; close() lets go of it.
        self.delivery = None
        self.pinned = None
        self.cleanups = []
        self.closed = False

    def check_open(self):
        if self.closed:
            raise ValueError("this FastLoader is closed")

    def new_workers(self, config, num_workers, prefetch, start_method):
        """A new generation of workers, after the current one (if any) is shut down; its processes
        start at its ``start()``."""
        if self.workers is not None:
            self.workers.shutdown()
        self.workers = Workers(config, num_workers, prefetch, start_method)
        return self.workers

    def on_close(self, cleanup):
        """Call ``cleanup()`` at ``close()``, after the workers stopped and before the ring goes."""
        self.cleanups.append(cleanup)

    def close(self):
        """NOTE [shutdown order]."""
        if self.closed:
            return
        self.closed = True
        if self.delivery is not None:
            self.delivery.settle = None
        try:
            if self.workers is not None:
                self.workers.shutdown()
                self.workers = None
        finally:
            try:
                while self.cleanups:
                    self.cleanups.pop()()
            finally:
                self.ring.close()
