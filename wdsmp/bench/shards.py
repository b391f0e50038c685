"""``wdsmp bench SHARDS...``: how fast FastLoader feeds your own shards, and what limits it.

FastLoader runs on the shards for a few seconds at 1, 2, 4, ... and all workers
(``benchmark.measure_loader``: a warm-up, then a timed window), each in train mode with its
defaults; for each worker count the images/s, the cores busy, the workers' time per image by
stage and the bottleneck line. From the scaling follow the images/s one worker adds at the
largest count and the cores a wanted rate needs. The CPU that other processes used during each
window is measured too: where it exceeds half a core, the figures say more about the machine
than about the loader, and the report says so.

The image and label fields are found in the first sample (the first of FastLoader's image
extensions present; ``cls`` as the label if present, else no label) unless given.
"""

import argparse
import math
import os
from typing import Dict, List, Optional, Sequence, TextIO, Tuple, Union, cast

from .loader import CROP_SIZE, Result, fastloader_stages, measure_loader
from ..fast.loader import FastLoader
from ..fast.options import IMAGE_KEYS, default_workers
from ..tariterators import tarfile_samples

__all__ = ["BUSY_MACHINE", "busy_counts", "cores_for", "find_fields", "report", "scaling", "worker_counts"]

BUSY_MACHINE = 0.5  # cores of other load during a window above which its figures are unreliable

Row = Tuple[int, Union[Result, Exception]]  # a worker count and its measurement, or the error it raised


def worker_counts(most: int) -> List[int]:
    """1, 2, 4, ... below ``most``, then ``most``."""
    counts, count = [], 1
    while count < most:
        counts.append(count)
        count *= 2
    return counts + [most]


def find_fields(urls: Sequence[str]) -> Tuple[str, Optional[str]]:
    """``(image extension, label extension or None)`` from the first sample of ``urls``;
    ValueError when it has no image FastLoader reads."""
    for sample in tarfile_samples([{"url": urls[0]}]):
        present = [key for key in sample if not key.startswith("__")]
        image = next((key for key in IMAGE_KEYS if key in present), None)
        if image is None:
            raise ValueError(f"the first sample of {urls[0]} ({sample['__key__']!r}: {', '.join(present)}) has no "
                             f"image FastLoader reads ({', '.join(IMAGE_KEYS)}); name it with --image")
        return image, "cls" if "cls" in present else None
    raise ValueError(f"{urls[0]} holds no samples")


def scaling(urls: Union[str, List[str]], args: argparse.Namespace, log: Optional[TextIO] = None) -> List[Row]:
    """``[(workers, benchmark.Result or the error it raised)]`` for each of
    ``worker_counts(args.max_workers)``, FastLoader reading ``urls`` (a list, or a shard index)
    with ``args.image``/``args.label``; a line per count on ``log``."""
    rows = []
    for workers in worker_counts(args.max_workers or default_workers()):
        def make(workers: int = workers) -> FastLoader:
            return FastLoader(urls, args.batch_size, num_workers=workers, image_size=CROP_SIZE,
                              image_keys=(args.image,), label=args.label, exact=False)
        result: Union[Result, Exception]
        try:
            result = measure_loader(make, args, fastloader_stages)
        except Exception as exn:  # noqa: BLE001 - reported in its row; the other counts still run
            result = exn
        rows.append((workers, result))
        if log is not None:
            print(f"  {_row(workers, result)}", file=log, flush=True)
    return rows


def _row(workers: int, result: Union[Result, Exception]) -> str:
    if isinstance(result, Exception):
        return f"{workers:>3} worker{'s' * (workers > 1)}: failed: {type(result).__name__}: {result}"
    return (f"{workers:>3} worker{'s' * (workers > 1)}: {result.images_per_s:8,.0f} images/s, "
            f"{cast(float, result.images_per_s) / workers:6,.0f} per "
            f"worker, {result.cpu_cores:.1f} cores busy, other load {result.other_cores:.1f} cores")


def cores_for(rate: float, rows: Sequence[Row]) -> Optional[int]:
    """The workers (one core each) that ``rate`` images/s needs, at the per-worker rate of the
    largest worker count measured; None without a measurement."""
    measured = [(workers, result) for workers, result in rows if not isinstance(result, Exception)]
    if not measured or cast(float, measured[-1][1].images_per_s) <= 0:
        return None
    workers, result = measured[-1]
    return math.ceil(rate * workers / cast(float, result.images_per_s))


def busy_counts(rows: Sequence[Row]) -> List[int]:
    """The worker counts whose window other processes loaded by more than ``BUSY_MACHINE`` cores."""
    return [workers for workers, result in rows
            if not isinstance(result, Exception) and cast(float, result.other_cores) > BUSY_MACHINE]


def report(rows: Sequence[Row], rate: float) -> str:
    """The scaling table, the largest count's stages and bottleneck, the cores ``rate`` needs,
    and a warning where other load made windows unreliable: text for the terminal."""
    lines = ["| workers | images/s | per worker | cores busy | other load (cores) |", "|---:|---:|---:|---:|---:|"]
    for workers, result in rows:
        if isinstance(result, Exception):
            lines.append(f"| {workers} | failed: {type(result).__name__}: {result} | | | |")
        else:
            lines.append(f"| {workers} | {result.images_per_s:,.0f} | "
                         f"{cast(float, result.images_per_s) / workers:,.0f} | "
                         f"{result.cpu_cores:.1f} | {result.other_cores:.1f} |")
    measured = [(workers, result) for workers, result in rows if not isinstance(result, Exception)]
    if measured:
        workers, result = measured[-1]
        stages = ", ".join(f"{name} {ms:.2f}" for name, ms in cast(Dict[str, float], result.stages).items())
        lines += ["", f"At {workers} worker{'s' * (workers > 1)}, worker time per image (ms): {stages}",
                  f"Bottleneck: {result.note}"]
        needed = cores_for(rate, rows)
        lines.append(f"To feed {rate:,.0f} images/s at this rate per worker: about {needed} cores for the loader "
                     f"(this machine has {os.cpu_count()})")
    busy = busy_counts(rows)
    if busy:
        lines += ["", f"WARNING: other processes kept the CPU busy while measuring (more than {BUSY_MACHINE} cores "
                      f"of other load at worker counts {', '.join(map(str, busy))}): these figures are not "
                      f"reliable; measure again on an idle machine"]
    return "\n".join(lines)
