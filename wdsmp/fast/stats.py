"""The loader's throughput figures (``FastLoader.stats``), and their report to stderr every
``report_every`` seconds (``progress=``)."""

import sys
import time

__all__ = ["LoaderStats"]


class LoaderStats:
    """Counters since the loader's first epoch began: batches and samples handed out,
    seconds spent waiting for workers, samples skipped by the handler, rows padded, and what
    the epochs' plans left out or read twice (``add_plan``)."""

    def __init__(self, report_every=None):
        self.report_every = report_every  # seconds between reports; None: no reports
        self.batches = self.samples = self.skipped = self.padded = 0
        self.dropped = self.dropped_shards = self.repeated = self.repeated_shards = 0
        self.wait_s = 0.0
        self.started = None  # time.monotonic() of the first epoch's start
        self.reported = 0.0  # ... of the last report

    def start(self):
        """The clock runs from the first call on."""
        if self.started is None:
            self.started = time.monotonic()

    def add_batch(self, count, waited, epoch):
        """A batch of ``count`` samples of epoch ``epoch``, after ``waited`` seconds of waiting."""
        self.batches += 1
        self.samples += count
        self.wait_s += waited
        if self.report_every is not None and time.monotonic() - self.reported >= self.report_every:
            self.reported = time.monotonic()
            print(f"wdsmp FastLoader: {self.describe(epoch)}", file=sys.stderr, flush=True)

    def add_stream_end(self, skipped, padded):
        """A worker's stream ended, having skipped ``skipped`` samples and padded ``padded`` rows."""
        self.skipped += skipped
        self.padded += padded

    def add_plan(self, dropped, repeated, whole_shards):
        """An epoch's plan: ``dropped``, the ``ShardRange``s no rank reads, and ``repeated``, those
        this rank reads twice (policy "pad"); samples counted where known, shards where the
        plan deals out ``whole_shards``."""
        self.dropped += sum(r.count for r in dropped if r.count is not None)
        self.repeated += sum(r.count for r in repeated if r.count is not None)
        if whole_shards:
            self.dropped_shards += len(dropped)
            self.repeated_shards += len(repeated)

    def snapshot(self, epoch):
        """The figures as a dict, with rates over the time since ``start()``."""
        elapsed = time.monotonic() - self.started if self.started is not None else 0.0
        return {"batches": self.batches, "samples": self.samples, "skipped": self.skipped, "padded": self.padded,
                "dropped": self.dropped, "dropped_shards": self.dropped_shards, "repeated": self.repeated,
                "repeated_shards": self.repeated_shards,
                "wait_s": self.wait_s, "epoch": epoch, "elapsed_s": elapsed,
                "images_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
                "wait_fraction": self.wait_s / elapsed if elapsed > 0 else 0.0}

    def describe(self, epoch):
        stats = self.snapshot(epoch)
        return (f"epoch {epoch}, {stats['batches']:,} batches, {stats['images_per_s']:,.0f} images/s, "
                f"waiting for data {stats['wait_fraction']:.0%} of the time, {stats['skipped']} skipped")
