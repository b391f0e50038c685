"""What a FastLoader holds and ``close()`` releases: the ring, the current generation of workers
with their pipes, and clean-ups such as pinned-memory registrations (NOTE [shutdown order] in
``loader.py``). Kept apart from the loader object, so that the loader's finalizer holds no
reference to the loader."""

from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from .messages import EpochTask, Stop
from .pool import WorkerPool
from .worker import worker_main

if TYPE_CHECKING:
    from ..epochs.plan import EpochPlan
    from .ring import Ring
    from .transfer import PinnedRing
    from .worker import WorkerConfig

__all__ = ["LoaderResources", "Workers"]


class Workers:
    """One generation of worker processes (NOTE [loader protocol] in ``delivery.py``): worker w
    owns slots ``w * prefetch`` to ``(w + 1) * prefetch - 1`` of the ring. ``main``: spawned
    workers import the user's script first (``pool.WorkerPool``). ``ahead``: the plan of the
    epoch these workers were sent ahead (NOTE [next epoch ahead] there), if any."""

    def __init__(self, config: "WorkerConfig", num_workers: int, prefetch: int, start_method: str,
                 main: bool = False) -> None:
        self.prefetch = prefetch
        self.pool = WorkerPool(worker_main, [(w, config, range(w * prefetch, (w + 1) * prefetch))
                                             for w in range(num_workers)], start_method, main=main)
        self.broken = False
        self.ahead: Optional["EpochPlan"] = None

    @property
    def count(self) -> int:
        return len(self.pool.processes)

    def start_epoch(self, position: object, streams: Sequence[Sequence[int]]) -> None:
        """Send each worker its ``EpochTask``: ``streams[w]`` are the streams of the epoch at
        ``position`` that worker w runs."""
        for worker, mine in enumerate(streams):
            self.pool.send(worker, EpochTask(position, tuple(mine)))

    def release(self, slot: int) -> None:
        """Give ``slot`` back to the worker that owns it."""
        if not self.broken:
            self.pool.send(slot // self.prefetch, slot)

    def pids(self) -> List[Optional[int]]:
        return self.pool.pids()

    def shutdown(self, timeout: float = 5.0) -> None:
        """NOTE [shutdown order], the workers' part. Idempotent; done even when interrupted."""
        if self.broken:
            return
        self.broken, self.ahead = True, None
        try:
            for worker in range(self.count):
                self.pool.send(worker, Stop())
            self.pool.stop(timeout)
        except BaseException:
            self.pool.stop(0.0)  # an interrupted join: terminate and kill at once
            raise


class LoaderResources:
    """The ring (``ring``), the current ``Workers`` (``workers``), and callables run at
    ``close()`` before the ring goes (``on_close``). ``pinned``: the ring's registration with
    CUDA (a ``transfer.PinnedRing``; None: not tried yet)."""

    def __init__(self, ring: "Ring") -> None:
        self.ring = ring
        self.workers: Optional[Workers] = None
        self.pinned: Optional["PinnedRing"] = None
        self.cleanups: List[Callable[[], object]] = []
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise ValueError("this FastLoader is closed")

    def new_workers(self, config: "WorkerConfig", num_workers: int, prefetch: int, start_method: str,
                    main: bool = False) -> Workers:
        """A new generation of workers (``Workers``' arguments), after the current one (if any) is
        shut down."""
        if self.workers is not None:
            self.workers.shutdown()
        self.workers = None
        if self.pinned is not None:
            self.pinned.wait()  # no copy still reads a slot the new workers will write
        self.workers = Workers(config, num_workers, prefetch, start_method, main)
        return self.workers

    def on_close(self, cleanup: Callable[[], object]) -> None:
        """Call ``cleanup()`` at ``close()``, after the workers stopped and before the ring goes."""
        self.cleanups.append(cleanup)

    def close(self) -> None:
        """NOTE [shutdown order]."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.workers is not None:
                self.workers.shutdown()
                self.workers = None
        finally:
            try:
                self._run_cleanups()
            finally:
                self.ring.close()

    def _run_cleanups(self) -> None:
        """Run every clean-up, also when one fails; then raise the first failure."""
        failure: Optional[Exception] = None
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception as exn:  # noqa: BLE001 - the others still run
                failure = failure or exn
        if failure is not None:
            raise failure
