"""What travels on the loader's pipes: small frozen dataclasses, never pixels.

To a worker: an ``EpochTask``, a free slot (an int) or ``Stop``. From a
worker: a slot index inside ``BatchReady``, the shard it starts reading, its
end of a stream, a failure as data (type, message, traceback text, where), or
a warning. They are plain data, so they pickle small and the same under every
start method.
"""

import traceback as _traceback
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Type

from .._internal.redact import redacted
from ..errors import WorkerError

__all__ = ["BatchReady", "EpochTask", "Reading", "Stop", "WorkerDone", "WorkerFailed", "WorkerWarning"]


@dataclass(frozen=True)
class EpochTask:
    """A worker's part of an epoch: the streams it runs of the epoch at ``position`` (a
    ``PlanPosition``), which it plans itself (``WorkerConfig.planner``), as the loader does."""

    position: object
    streams: Tuple[int, ...]


@dataclass(frozen=True)
class BatchReady:
    """Worker ``worker`` filled ring slot ``slot`` with batch number ``index`` of its stream
    ``stream`` (the plan's part it is reading) of ``epoch``.

    ``index`` counts the stream's batches (0, 1, ...; those delivered before
    a resume included), so the loader can deliver in the plan's round robin
    order in every mode (NOTE [plan: exactly once, equal batches]; with known
    counts and one stream per worker it is the rank's batch ``stream + index
    * num_workers``).
    ``count`` is how many rows of the slot hold samples (a worker's last batch
    may be short when sample counts are unknown). ``consumed`` is how many
    items the worker had taken from its sample stream when the batch was
    done, skipped ones included: what a resume after this batch must drop.
    ``times``: where the worker's time on this batch went, ints in the order of
    ``stats.BATCH_FIELDS`` (NOTE [stage times] in stats.py); empty if untimed.
    ``read`` is how many samples of the plan the stream had read (before the
    stages) when the batch was done, counted from the stream's start: equal to
    ``consumed`` and to the batches times the batch size when nothing was
    dropped, which an elastic resume needs (NOTE [elastic resume]).
    """

    slot: int
    worker: int
    epoch: int
    index: int
    count: int
    consumed: int = 0
    stream: int = 0
    times: Tuple[int, ...] = ()
    read: Optional[int] = None


@dataclass(frozen=True)
class Reading:
    """Worker ``worker`` starts reading shard ``shard``: where it is, should it stall there."""

    worker: int
    shard: str


@dataclass(frozen=True)
class WorkerDone:
    """Worker ``worker`` finished its stream ``stream`` of ``epoch``: the stream's batch count
    (those delivered before a resume included), the samples it wrote, those its handler
    skipped, and the rows it padded."""

    worker: int
    epoch: int
    batches: int
    samples: int
    skipped: int
    padded: int = 0
    stream: int = 0


def _type_name(exn_type: type) -> str:
    module = exn_type.__module__
    return exn_type.__qualname__ if module == "builtins" else f"{module}.{exn_type.__qualname__}"


@dataclass(frozen=True)
class WorkerFailed:
    """Worker ``worker`` failed: the exception as text, and the shard and member it was reading.

    Exceptions travel as data because they may not pickle (or unpickle in the
    main process); ``to_error()`` rebuilds a ``WorkerError`` to raise there.
    """

    worker: int
    exc_type: str
    message: str
    traceback: str
    shard: Optional[str] = None
    member: Optional[str] = None

    @classmethod
    def from_exception(cls, worker: int, exn: BaseException, shard: Optional[str] = None,
                       member: Optional[str] = None) -> "WorkerFailed":
        """The message for ``exn`` raised in ``worker``; shard and member default to the error's own
        (wdsmp's data errors carry ``url`` and ``member``)."""
        data: Any = exn  # wdsmp's data errors carry ``url`` and ``member``
        if shard is None and isinstance(getattr(exn, "url", None), str):
            shard = data.url
        if member is None and isinstance(getattr(exn, "member", None), str):
            member = data.member
        text = "".join(_traceback.format_exception(type(exn), exn, exn.__traceback__))
        return cls(worker, _type_name(type(exn)), str(exn), text, shard, member)

    def to_error(self) -> WorkerError:
        """A ``WorkerError`` naming the worker, shard and member, with the worker's traceback."""
        where = "".join([f", shard {self.shard!r}" if self.shard is not None else "",
                         f", member {self.member!r}" if self.member is not None else ""])
        error: Any = WorkerError(redacted(
            f"loader worker {self.worker} failed{where}: {self.exc_type}: {self.message}\n"
            f"--- traceback in worker {self.worker} ---\n{self.traceback.rstrip()}"))
        error.worker, error.shard, error.member, error.exc_type = self.worker, self.shard, self.member, self.exc_type
        return error


@dataclass(frozen=True)
class WorkerWarning:
    """A warning issued in worker ``worker`` (``warn_and_continue`` on a bad sample, say), to be
    issued again in the main process, where the user sees and filters warnings."""

    worker: int
    category: str
    message: str

    @classmethod
    def from_warning(cls, worker: int, message: object, category: Type[Warning]) -> "WorkerWarning":
        return cls(worker, _type_name(category), str(message))

    def reissue(self) -> None:
        """``warnings.warn`` it here: the same category when it is a builtin one, else UserWarning."""
        import builtins
        import warnings

        category = getattr(builtins, self.category, None)
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn(f"in loader worker {self.worker}: {self.message}", category, stacklevel=3)


@dataclass(frozen=True)
class Stop:
    """Sentinel: the receiving worker stops now."""
