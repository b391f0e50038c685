"""Where the loader's time goes (``FastLoader.stats``), and its report on stderr every
``report_every`` seconds (``progress=``).

NOTE [stage times]
    * Workers: a ``WorkerClock`` per stream adds up, in plain ints with
      ``time.perf_counter_ns`` around whole steps (a read call, a sample from
      a stage, one image's decode), where each batch's wall time went:
      fetching shard bytes (opening, reading, filling the shard cache),
      splitting the tar and grouping samples, the user's stages (and the
      shuffle buffer), decoding, cropping/resizing/flipping, writing labels,
      keys and fields, and waiting for a free slot; what is left of the
      batch's time (publishing, padding, the loop itself) is ``other``. The
      figures of a batch travel in its ``BatchReady`` (``times``, in
      ``BATCH_FIELDS`` order), so timing adds no messages of its own.
    * The main process: waiting for a ready batch, the time the training loop
      holds each batch (from handing it out to the next ``next()``), and
      under ``.cuda()`` the time spent issuing copies and GPU transforms and
      waiting for their events. The first batch's wait is start-up, kept apart.
    * Rates: ``images_per_s`` counts from the first batch handed out to the
      last one (the steady rate); ``images_per_s_with_startup`` from the
      loader's construction, as a wall clock around the whole run sees it.
      ``workers_busy`` and the reports on stderr also start at the first
      batch: before it, starting the workers weighs more than anything else.
"""

import copy
import sys
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, cast

from .._internal.timing import ReadClock
from .bottleneck import diagnose

if TYPE_CHECKING:
    from ..epochs.plan import ShardRange
    from .imagedecode import ImageInfo
    from .messages import BatchReady

__all__ = ["BATCH_FIELDS", "STAGES", "LoaderStats", "WorkerClock"]

# What a BatchReady's ``times`` hold, in this order: nanoseconds, then counts.
BATCH_FIELDS = ("busy_ns", "fetch_ns", "split_ns", "stages_ns", "decode_ns", "resize_ns", "write_ns", "slot_ns",
                "images", "jpeg", "region", "scaled", "shards", "cache_hits", "cache_misses")
# The worker stages reported, each from its ``<name>_ns`` field (slot_wait from slot_ns); ``other`` is the rest.
STAGES = ("fetch", "split", "stages", "decode", "resize", "write", "slot_wait", "other")
_NS = {name: BATCH_FIELDS.index(f"{name}_ns") for name in STAGES[:6]}
_NS["slot_wait"] = BATCH_FIELDS.index("slot_ns")
_BUSY = BATCH_FIELDS.index("busy_ns")
_COUNT = {name: BATCH_FIELDS.index(name) for name in BATCH_FIELDS[8:]}


class WorkerClock:
    """A worker's time since its last batch, by stage; NOTE [stage times]. The worker adds to
    the ``*_ns`` ints, ``reads`` (the ``ReadClock`` of its shard reading) and the counts, and
    takes ``batch_times()`` for each batch it publishes (of whichever of its streams)."""

    __slots__ = ("started", "source_ns", "read_ns", "reads", "decode_ns", "resize_ns", "fill_ns", "slot_ns",
                 "images", "jpeg", "region", "scaled")

    def __init__(self) -> None:
        self.reads = ReadClock()
        self.restart()

    def restart(self, now: Optional[int] = None) -> None:
        """Count from ``now`` (default: now), all at zero."""
        now = perf_counter_ns() if now is None else now
        self.started = now
        self.source_ns = self.read_ns = self.decode_ns = self.resize_ns = self.fill_ns = self.slot_ns = 0
        self.images = self.jpeg = self.region = self.scaled = 0
        reads = self.reads
        reads.ns = reads.shards = reads.cache_hits = reads.cache_misses = 0

    def count_image(self, info: "ImageInfo") -> None:
        """One image written (an ``imagedecode.ImageInfo``)."""
        self.images += 1
        if info.kind == "jpeg":
            self.jpeg += 1
            self.region += info.region
            self.scaled += info.scale < 8

    def batch_times(self) -> Tuple[int, ...]:
        """The figures since the last batch (``BATCH_FIELDS`` order), and a new count from now."""
        now, reads = perf_counter_ns(), self.reads
        times = (now - self.started, reads.ns, self.read_ns - reads.ns, self.source_ns - self.read_ns,
                 self.decode_ns, self.resize_ns, self.fill_ns - self.decode_ns - self.resize_ns, self.slot_ns,
                 self.images, self.jpeg, self.region, self.scaled, reads.shards, reads.cache_hits, reads.cache_misses)
        self.restart(now)
        return times


class _Totals:
    """Sums over batches: the main process's ints and each worker's ``BATCH_FIELDS``."""

    def __init__(self, num_workers: int) -> None:
        self.batches = self.samples = self.skipped = self.padded = 0
        self.wait_ns = self.training_ns = self.transfer_ns = self.h2d_ns = self.copy_wait_ns = 0
        self.workers = [[0] * len(BATCH_FIELDS) for _ in range(num_workers)]

    def copy(self) -> "_Totals":
        other = copy.copy(self)
        other.workers = [list(w) for w in self.workers]
        return other

    def minus(self, earlier: "_Totals") -> "_Totals":
        """What was added since ``earlier`` (a ``copy()``)."""
        other = self.copy()
        for name in ("batches", "samples", "skipped", "padded", "wait_ns", "training_ns", "transfer_ns", "h2d_ns",
                     "copy_wait_ns"):
            setattr(other, name, getattr(self, name) - getattr(earlier, name))
        other.workers = [[a - b for a, b in zip(mine, theirs)] for mine, theirs in zip(self.workers, earlier.workers)]
        return other


def _stages(fields: Sequence[int], images: int) -> Dict[str, Dict[str, float]]:
    """``{stage: {"seconds", "ms_per_image"}}`` of one worker's (or all workers') summed fields."""
    seconds = {name: fields[i] / 1e9 for name, i in _NS.items()}
    seconds["other"] = max(fields[_BUSY] / 1e9 - sum(seconds.values()), 0.0)
    return {name: {"seconds": seconds[name], "ms_per_image": seconds[name] * 1e3 / images if images else 0.0}
            for name in STAGES}


def _rate(count: int, ns: int) -> float:
    return count * 1e9 / ns if ns > 0 else 0.0


class LoaderStats:
    """The loader's figures (NOTE [stage times]): counted as batches are handed out, with a
    line on stderr every ``report_every`` seconds (None: no reports). ``source`` describes
    where the shards are (``bottleneck.shard_source``), ``cache_dir`` the loader's. What the
    epochs' plans left out or read twice is counted too (``add_plan``)."""

    def __init__(self, report_every: Optional[float] = None, *, num_workers: int = 1, source: str = "local files",
                 cache_dir: Optional[str] = None) -> None:
        self.report_every = report_every
        self.num_workers, self.source, self.cache_dir = num_workers, source, cache_dir
        self.totals = _Totals(num_workers)
        self.constructed = perf_counter_ns()
        self.first: Optional[int] = None  # perf_counter_ns() of the first and the last batch handed out
        self.last: Optional[int] = None
        self.at_first: Optional[_Totals] = None  # a copy of ``totals`` with the first batch in: what start-up made
        self.first_samples = 0  # the first batch's
        self.startup_wait_ns = 0  # the wait for the first batch
        self.handed_at: Optional[int] = None  # when the batch the training loop holds now was handed out
        # ``totals`` and the time at the last report (or the first batch)
        self.reported: Optional[_Totals] = None
        self.reported_at: Optional[int] = None
        self.dropped = self.dropped_shards = self.repeated = self.repeated_shards = 0
        # under .cuda(): whether the ring is pinned, and CUDA's error if not
        self.pinned: Optional[bool] = None
        self.pin_error: Optional[str] = None

    def start(self) -> None:
        """An epoch begins (``iter()``): the time since the last one ended is nobody's."""
        self.handed_at = None

    def add_batch(self, message: "BatchReady", waited_ns: int, epoch: int) -> None:
        """The batch of ``message`` (a ``BatchReady``) taken from its worker after ``waited_ns``."""
        totals = self.totals
        if self.first is None:
            self.startup_wait_ns = waited_ns
        else:
            totals.wait_ns += waited_ns
        totals.batches += 1
        totals.samples += message.count
        if message.times:
            worker = totals.workers[message.worker]
            for i, value in enumerate(message.times):
                worker[i] += value
        now = perf_counter_ns()
        self.last = now
        if self.first is None:  # reports and rates start here: the rest is start-up
            self.first, self.first_samples = now, message.count
            self.at_first = self.reported = totals.copy()
            self.reported_at = now
        elif self.report_every is not None and (now - cast(int, self.reported_at)) / 1e9 >= self.report_every:
            window = totals.minus(cast(_Totals, self.reported))
            print(f"wdsmp FastLoader: {self.describe(epoch, window, now - cast(int, self.reported_at))}",
                  file=sys.stderr,
                  flush=True)
            self.reported, self.reported_at = totals.copy(), now

    def handed(self) -> None:
        """A batch goes to the training loop now."""
        self.handed_at = perf_counter_ns()

    def returned(self) -> None:
        """The training loop asks for the next batch: it held the last one until now."""
        if self.handed_at is not None:
            self.totals.training_ns += perf_counter_ns() - self.handed_at
            self.handed_at = None

    def add_transfer(self, ns: int) -> None:
        """``ns`` spent on ``.cuda()``'s copies and GPU transforms."""
        self.totals.transfer_ns += ns

    def add_h2d(self, ns: int) -> None:
        """A batch's copy to the GPU took ``ns`` on the device."""
        self.totals.h2d_ns += ns

    def add_copy_wait(self, ns: int) -> None:
        """The main process waited ``ns`` for a copy to the GPU to finish."""
        self.totals.copy_wait_ns += ns

    def pinning(self, ok: bool, error: Optional[str] = None) -> None:
        """``.cuda()`` pinned the ring (``ok``), or could not (CUDA's ``error``)."""
        self.pinned, self.pin_error = ok, error

    def add_stream_end(self, skipped: int, padded: int) -> None:
        """A worker's stream ended, having skipped ``skipped`` samples and padded ``padded`` rows."""
        self.totals.skipped += skipped
        self.totals.padded += padded

    def _busy(self, steady: _Totals, wall_ns: int) -> float:
        """The share of ``wall_ns`` the workers spent on batches (not waiting for slots), from
        ``steady``, totals that leave start-up out."""
        working = sum(w[_BUSY] - w[_NS["slot_wait"]] for w in steady.workers)
        return min(working / (wall_ns * self.num_workers), 1.0) if wall_ns > 0 else 0.0

    def _figures(self, totals: _Totals, busy: float) -> Dict[str, Any]:
        """The stage figures of ``totals``, the workers ``busy`` that share of the time."""
        main = totals.wait_ns + totals.training_ns + totals.transfer_ns
        overall = [sum(column) for column in zip(*totals.workers)] or [0] * len(BATCH_FIELDS)
        images = overall[_COUNT["images"]]
        workers = [{"worker": w, "images": fields[_COUNT["images"]], "busy_s": fields[_BUSY] / 1e9,
                    "stages": _stages(fields, fields[_COUNT["images"]])} for w, fields in enumerate(totals.workers)]
        return {
            "wait_s": totals.wait_ns / 1e9, "training_s": totals.training_ns / 1e9,
            "transfer_s": totals.transfer_ns / 1e9, "h2d_s": totals.h2d_ns / 1e9,
            "copy_wait_s": totals.copy_wait_ns / 1e9, "pinned": self.pinned, "pin_error": self.pin_error,
            "wait_fraction": totals.wait_ns / main if main else 0.0,
            "workers_busy": busy,
            "worker_busy_s": overall[_BUSY] / 1e9, "stages": _stages(overall, images), "workers": workers,
            "decode": {"jpeg": overall[_COUNT["jpeg"]], "region": overall[_COUNT["region"]],
                       "dct_scaled": overall[_COUNT["scaled"]]},
            "shards": {"opened": overall[_COUNT["shards"]], "cache_hits": overall[_COUNT["cache_hits"]],
                       "cache_misses": overall[_COUNT["cache_misses"]]},
        }

    def _bottleneck(self, totals: _Totals, figures: Dict[str, Any]) -> str:
        return diagnose(dict(figures, batches=totals.batches), num_workers=self.num_workers, source=self.source,
                        cache_dir=self.cache_dir)

    def add_plan(self, dropped: Sequence["ShardRange"], repeated: Sequence["ShardRange"], whole_shards: bool) -> None:
        """An epoch's plan: ``dropped``, the ``ShardRange``s no rank reads, and ``repeated``, those
        this rank reads twice (policy "pad"); samples counted where known, shards where the
        plan deals out ``whole_shards``."""
        self.dropped += sum(r.count for r in dropped if r.count is not None)
        self.repeated += sum(r.count for r in repeated if r.count is not None)
        if whole_shards:
            self.dropped_shards += len(dropped)
            self.repeated_shards += len(repeated)

    def snapshot(self, epoch: int) -> Dict[str, Any]:
        """The figures since the loader was made, as plain data (see ``FastLoader.stats``)."""
        totals = self.totals
        elapsed = cast(int, self.last) - self.first if self.first is not None else 0
        startup = self.first - self.constructed if self.first is not None else 0
        busy = self._busy(totals.minus(cast(_Totals, self.at_first)), elapsed) if self.first is not None else 0.0
        figures = self._figures(totals, busy)
        return dict(
            {"epoch": epoch, "batches": totals.batches, "samples": totals.samples, "skipped": totals.skipped,
             "padded": totals.padded, "dropped": self.dropped, "dropped_shards": self.dropped_shards,
             "repeated": self.repeated, "repeated_shards": self.repeated_shards, "startup_s": startup / 1e9,
             "elapsed_s": elapsed / 1e9,
             "images_per_s": _rate(totals.samples - self.first_samples, elapsed),
             "images_per_s_with_startup": _rate(totals.samples, elapsed + startup),
             "interval": "elapsed_s, images_per_s, workers_busy and the times in the main process run from the "
                         "first batch handed out to the last; startup_s from the loader's construction to the first "
                         "batch; images_per_s_with_startup over both"},
            **figures, bottleneck=self._bottleneck(totals, figures))

    def describe(self, epoch: int, window: _Totals, wall_ns: int) -> str:
        """One line: the rate and the bottleneck over ``window`` (totals over ``wall_ns``)."""
        figures = self._figures(window, self._busy(window, wall_ns))
        return (f"epoch {epoch}, {self.totals.batches:,} batches, {_rate(window.samples, wall_ns):,.0f} images/s; "
                f"{self._bottleneck(window, figures)}")
