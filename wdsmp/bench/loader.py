"""The loader benchmark: training-loader throughput on an ImageNet-like corpus, the contenders
side by side in one run.

It lives in the package so that ``wdsmp bench --corpus DIR`` measures an installed wdsmp;
``python benchmarks/bench_loader.py --corpus DIR`` runs the same code from a checkout and can
record the table in ``benchmarks/RESULTS.md``. The corpus is a directory written by
``benchmarks/make_corpus.py``: shards of photographic JPEGs and an ``index.json``.

The contenders (``CONTENDERS``), each run with the same worker count:

- "DataLoader pipeline": what users run today, ``wdsmp.DataPipeline(SimpleShardList,
  split_by_worker, tarfile_to_samples(), decode("pil"), to_tuple("jpg;ppm", "cls"),
  map_tuple(RandomResizedCrop(224) + random flip in PIL, None), batched(B))`` in
  ``torch.utils.data.DataLoader(num_workers=N, batch_size=None, persistent_workers=True)``;
  batches of (B, 224, 224, 3) uint8 and (B,) int64 tensors.
- "FastLoader": ``wdsmp.FastLoader(index.json, B, num_workers=N)``, train mode
  (RandomResizedCrop(224) + flip), batches as zero-copy tensors of the same shapes.
- "FastLoader, fresh process": no rate, the first batch of a new interpreter that has
  imported torch and wdsmp (from constructing the loader) and the first batch of its second
  epoch (``wdsmp.bench.coldstart``): what a restarted job or an evaluation script meets.
- "FastLoader, fresh process, fork": the same with ``start_method="fork"`` (workers forked
  from the script, no interpreters to start).
- "decode-only ceiling": libjpeg-turbo (simplejpeg) decoding the corpus's JPEGs
  (``.ppm`` members: parsed and copied) to full-size RGB on one core, timed
  call by call, times N workers: what N workers could reach if decoding were
  all they did, with no crop, resize, batching or transfer.

With ``--swap-import`` (``SWAP_CONTENDERS``), two more: "your WebDataset pipeline,
import swapped", the same user code ``wds.WebDataset(urls, shardshuffle=100)
.shuffle(1000).decode("pil").to_tuple("jpg;ppm", "cls").map_tuple(transform, int)
.batched(B)`` in ``DataLoader(num_workers=N, batch_size=None, persistent_workers=True)``,
once with ``import webdataset as wds`` (1.0.2, the ``bench`` extra; skipped with a
note when it is not installed) and once with ``import wdsmp as wds``. ``transform``
is torchvision's ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()`` and
``ToTensor()`` written with PIL, numpy and torch: batches of (B, 3, 224, 224)
float32 tensors.

The contenders run one after the other, ``--rounds`` times over (so that a
busy moment on a shared machine hits all of them alike); each one's best round
is reported, its ratio to the DataLoader pipeline's best round beside it.
Loaders are built afresh each round and iterated epoch after epoch (a new
``iter()`` at each end, as a training loop does; epoch ends are timed too, so
a small corpus weighs them more than ImageNet would); after the first batch
(its latency, from constructing the loader, reported on its own; so is the median time
from each later epoch's ``iter()`` to its first batch, "new epoch") and
``--warmup`` seconds, the images delivered in the next ``--seconds`` are
counted. CPU is the CPU time of this process and its descendants alive at the
end of the timed window, in cores busy over that window (psutil); peak PSS is
the largest sum of PSS over the same processes, sampled every 0.25 s from the
loader's construction on (``memory_full_info``); PSS growth is the change of
that sum from the start to the end of the timed window, over the epochs the
window held (a loader whose memory grows with epochs or data shows it); other load is the CPU the
rest of the machine used meanwhile (all cores busy, hypervisor steal
included, minus ours), so a figure taken while something else ran shows it.
The shards are read once first, so they come from the page cache.

Where the time goes: each loader round also records when each batch arrived
(``Result.series``) and the workers' time per image by stage
(``Result.stages``, in ``STAGE_GROUPS``): FastLoader's from ``loader.stats``, the
DataLoader pipeline's from ``DataPipeline.with_stage_times()`` (timing costs
well under a microsecond per stage and image), the ceiling's decode. The
FastLoader note names its bottleneck (``loader.stats["bottleneck"]``).
``plot.draw`` turns the best rounds into a picture.
"""

import argparse
import functools
import json
import math
import os
import platform
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple, TypeVar,
                    cast)

import numpy as np
import psutil
import simplejpeg
import torch
from PIL import Image

import wdsmp

from .. import (DataPipeline, FastLoader, SimpleShardList, batched, decode, map_tuple, split_by_worker,
               tarfile_to_samples, to_tuple)
from ..native import core as native
from .coldstart import first_batches

_T = TypeVar("_T")
_L = TypeVar("_L", bound=Iterable[Any])  # a loader: batches of (images, labels)

__all__ = ["BASELINE", "CONTENDERS", "CROP_SIZE", "FRESH", "STAGE_GROUPS", "SWAP_CONTENDERS", "Corpus", "Result",
           "as_json", "best", "contenders", "fastloader_stages", "header", "machine", "measure_loader", "open_corpus",
           "picture", "region_decoding", "run", "summary"]

BASELINE = "DataLoader pipeline"
FRESH = "FastLoader, fresh process"
CROP_SIZE = 224
CEILING_WARMUP_IMAGES = 50
CEILING_NOTE = ("The decode-only ceiling decodes every JPEG whole; FastLoader decodes only the part its crop needs, "
                "at a reduced scale where it can, so it may run above it.")
# The stages of the per-image time, in the picture's order, and what each holds.
STAGE_GROUPS = {
    "read shards": ("fetch", "split", "tarfile_samples"),
    "decode": ("decode",),
    "crop, resize, flip": ("resize", "map_tuple"),
    "batch": ("write", "batched"),
}


@dataclass
class Corpus:
    """A corpus written by ``make_corpus.py``: its directory, shard urls and index."""

    directory: str
    urls: List[str]
    index: Dict[str, Any]

    FIELDS = ("samples", "jpg", "ppm", "mean_bytes", "mean_width", "mean_height", "command")  # what describe() says

    @classmethod
    def load(cls, directory: str) -> "Corpus":
        """The corpus in ``directory``; ValueError when its ``index.json`` is not a corpus
        description (a manifest from ``wdsmp index`` lists shards, but not the images)."""
        with open(os.path.join(directory, "index.json")) as stream:
            index = json.load(stream)
        if not isinstance(index, dict):
            raise ValueError("not a JSON object")
        missing = [name for name in ("shards",) + cls.FIELDS if name not in index]
        if missing:
            raise ValueError(f"no {', '.join(map(repr, missing))} field{'s' * (len(missing) > 1)} (a manifest "
                             f"from wdsmp index lists shards, not the images make_corpus.py describes)")
        shards = index["shards"]
        if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("url"), str)
                                                   for s in shards):
            raise ValueError("'shards' is not a list of {\"url\": ...} entries")
        return cls(directory, [os.path.join(directory, s["url"]) for s in shards], index)

    def describe(self) -> str:
        i = self.index
        return (f"{i['samples']} images ({i['jpg']} .jpg, {i['ppm']} .ppm) in {len(self.urls)} shards, "
                f"mean {i['mean_bytes'] / 1e3:.1f} KB and {i['mean_width']}x{i['mean_height']} px "
                f"(`{i['command']}`)")


def open_corpus(directory: str, workers: int) -> Corpus:
    """The corpus in ``directory``, checked before any measuring starts: ValueError if it is not
    one, or has fewer shards than ``workers`` (a worker without a shard would measure nothing)."""
    try:
        corpus = Corpus.load(directory)
    except (OSError, ValueError, KeyError) as exn:
        raise ValueError(f"{directory} is not a corpus written by benchmarks/make_corpus.py "
                         f"(its index.json: {exn})") from exn
    if len(corpus.urls) < workers:
        raise ValueError(f"{len(corpus.urls)} shards cannot keep {workers} workers busy")
    return corpus


@dataclass
class Result:
    """One contender's figures; None where they do not apply."""

    images_per_s: Optional[float]
    first_batch_s: Optional[float] = None
    new_epoch_s: Optional[float] = None  # median seconds from a new iter() to its first batch, over the window's epochs
    cpu_cores: Optional[float] = None
    peak_pss: Optional[int] = None
    other_cores: Optional[float] = None
    pss_growth: Optional[int] = None
    images: Optional[int] = None
    note: Optional[str] = None
    # [(seconds since the loader was made, images delivered so far)], batch by batch
    series: Optional[List[Tuple[float, int]]] = None
    stages: Optional[Dict[str, float]] = None  # {STAGE_GROUPS name or "other": worker milliseconds per image}


class RandomResizedCropFlip:
    """torchvision's ``RandomResizedCrop(size)`` (area 8-100%, aspect 3/4-4/3, bilinear)
    then a horizontal flip half of the time, in PIL: PIL image -> (size, size, 3) uint8 array."""

    def __init__(self, size: int, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        self.size, self.scale = size, scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def box(self, width: int, height: int) -> Tuple[int, int, int, int]:
        """torchvision's ``RandomResizedCrop.get_params``, as a PIL box."""
        area = width * height
        for _ in range(10):
            target_area = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*self.log_ratio))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                x, y = random.randint(0, width - w), random.randint(0, height - h)
                return x, y, x + w, y + h
        ratio = width / height  # fall back to a central crop
        lowest, highest = math.exp(self.log_ratio[0]), math.exp(self.log_ratio[1])
        w, h = width, height
        if ratio < lowest:
            h = round(w / lowest)
        elif ratio > highest:
            w = round(h * highest)
        x, y = (width - w) // 2, (height - h) // 2
        return x, y, x + w, y + h

    def __call__(self, image: Image.Image) -> np.ndarray:
        image = image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=self.box(*image.size))
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(image)


class CropFlipToTensor(RandomResizedCropFlip):
    """torchvision's ``RandomResizedCrop(size)``, ``RandomHorizontalFlip()`` and ``ToTensor()``:
    PIL image -> (3, size, size) float32 tensor in [0, 1]."""

    def __call__(self, image: Image.Image) -> torch.Tensor:  # type: ignore[override]  # a tensor, not an array
        pixels = torch.from_numpy(np.array(super().__call__(image)))
        return pixels.permute(2, 0, 1).contiguous().float().div_(255)


class ProcessTree:
    """CPU time and peak PSS of this process and its descendants; PSS sampled by a thread."""

    def __init__(self, interval: float = 0.25) -> None:
        self.root = psutil.Process()
        self.interval = interval
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="pss-sampler", daemon=True)

    def processes(self) -> List[psutil.Process]:
        return [self.root, *self.root.children(recursive=True)]

    def pss(self) -> int:
        total = 0
        for process in self.processes():
            try:
                total += process.memory_full_info().pss
            except psutil.NoSuchProcess:
                pass
        return total

    def cpu_seconds(self) -> Dict[Tuple[int, float], float]:
        """{(pid, create time): user + system seconds} of the processes alive now."""
        seconds = {}
        for process in self.processes():
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    seconds[process.pid, process.create_time()] = times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return seconds

    def _sample(self) -> None:
        while True:
            self.peak_pss = max(self.peak_pss, self.pss())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "ProcessTree":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_pss = max(self.peak_pss, self.pss())


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy, all cores, hypervisor steal included."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def _endless(iterable: Iterable[_T], epoch_starts: Optional[List[float]] = None) -> Iterator[_T]:
    """Epoch after epoch: a new ``iter()`` each time one ends; the seconds from each ``iter()``
    to its first item appended to ``epoch_starts``."""
    while True:
        start = time.perf_counter()
        for seen, item in enumerate(iterable):
            if seen == 0 and epoch_starts is not None:
                epoch_starts.append(time.perf_counter() - start)
            yield item


def grouped(milliseconds: Mapping[str, float]) -> Dict[str, float]:
    """``{stage: ms per image}`` summed into ``STAGE_GROUPS`` (the rest as "other")."""
    groups = dict.fromkeys([*STAGE_GROUPS, "other"], 0.0)
    for stage, value in milliseconds.items():
        group = next((name for name, members in STAGE_GROUPS.items() if stage in members), "other")
        groups[group] += value
    return groups


def measure_loader(make_loader: Callable[[], _L], args: argparse.Namespace,
                   stages: Optional[Callable[[_L], Dict[str, float]]] = None) -> Result:
    """Run the loader ``make_loader()`` returns (batches of (images, labels)): images per second
    after warm-up, first-batch latency, CPU cores busy, peak PSS, when each batch came, and
    ``stages(loader)`` (``Result.stages``) at the end."""
    with ProcessTree() as tree:
        start = time.perf_counter()
        loader = make_loader()
        epoch_starts: List[float] = []
        batches = _endless(loader, epoch_starts)
        delivered = len(next(batches)[0])
        first_batch = time.perf_counter() - start
        series = [(first_batch, delivered)]
        while time.perf_counter() - start < first_batch + args.warmup:
            delivered += len(next(batches)[0])
            series.append((time.perf_counter() - start, delivered))
        cpu_before, machine_before = tree.cpu_seconds(), machine_busy_seconds()
        pss_before = tree.pss()
        window_start = time.perf_counter()
        images = 0
        while time.perf_counter() - window_start < args.seconds:
            images += len(next(batches)[0])
            series.append((time.perf_counter() - start, delivered + images))
        window = time.perf_counter() - window_start
        cpu_after, machine_after = tree.cpu_seconds(), machine_busy_seconds()
        pss_growth = tree.pss() - pss_before
        per_image = stages(loader) if stages is not None else None
        note = loader.stats["bottleneck"] if isinstance(loader, FastLoader) else None
        del batches, loader  # stops the workers before the PSS sampler's last look
    busy = sum(seconds - cpu_before.get(key, 0.0) for key, seconds in cpu_after.items())
    other = machine_after - machine_before - busy
    new_epoch = statistics.median(epoch_starts[1:]) if len(epoch_starts) > 1 else None
    return Result(images / window, first_batch, new_epoch, busy / window, tree.peak_pss, other / window, pss_growth,
                  images, series=series, stages=per_image, note=note and f"FastLoader: {note}")


def make_dataloader(corpus: Corpus, args: argparse.Namespace) -> "torch.utils.data.DataLoader[Any]":
    """The pipeline users run today, in a torch DataLoader."""
    dataset = DataPipeline(
        SimpleShardList(corpus.urls),
        split_by_worker,
        tarfile_to_samples(),
        decode("pil"),
        to_tuple("jpg;ppm", "cls"),
        map_tuple(RandomResizedCropFlip(CROP_SIZE), None),
        batched(args.batch_size),
    ).with_stage_times()
    return torch.utils.data.DataLoader(dataset, num_workers=args.workers, batch_size=None,
                                       persistent_workers=True)


def pipeline_stages(loader: "torch.utils.data.DataLoader[Any]") -> Dict[str, float]:
    """The DataLoader's workers' milliseconds per image, by ``STAGE_GROUPS``."""
    figures = cast(DataPipeline, loader.dataset).stage_times()
    images = next(f["items"] for f in figures if f["stage"] == "to_tuple")
    return grouped({f["stage"]: f["seconds"] * 1e3 / max(images, 1) for f in figures})


def dataloader_pipeline(corpus: Corpus, args: argparse.Namespace) -> Result:
    """The baseline: ``make_dataloader`` measured."""
    return measure_loader(lambda: make_dataloader(corpus, args), args, pipeline_stages)


def user_webdataset_loader(wds: ModuleType, corpus: Corpus,
                           args: argparse.Namespace) -> "torch.utils.data.DataLoader[Any]":
    """The WebDataset pipeline a user writes, with ``wds`` the library it was imported as."""
    dataset = (wds.WebDataset(corpus.urls, shardshuffle=100).shuffle(1000).decode("pil")
               .to_tuple("jpg;ppm", "cls").map_tuple(CropFlipToTensor(CROP_SIZE), int).batched(args.batch_size))
    return torch.utils.data.DataLoader(dataset, num_workers=args.workers, batch_size=None,
                                       persistent_workers=True)


def webdataset_swapped_out(corpus: Corpus, args: argparse.Namespace) -> Result:
    """The user's pipeline with ``import webdataset as wds``; a note when it is not installed."""
    try:
        import webdataset
    except ImportError:
        return Result(None, note="webdataset is not installed (pip install 'wdsmp[bench]'): its row is empty")
    return measure_loader(lambda: user_webdataset_loader(webdataset, corpus, args), args)


def wdsmp_swapped_in(corpus: Corpus, args: argparse.Namespace) -> Result:
    """The same pipeline with ``import wdsmp as wds``."""
    return measure_loader(lambda: user_webdataset_loader(wdsmp, corpus, args), args)


def _decode_ppm(data: bytes) -> np.ndarray:
    """Binary 8-bit RGB PPM (as make_corpus writes it) -> (H, W, 3) uint8, copied."""
    magic, width, height, maxval = data[:32].split(maxsplit=4)[:4]
    if magic != b"P6" or maxval != b"255":
        raise ValueError(f"not an 8-bit binary PPM without comments: {data[:16]!r}")
    shape = (int(height), int(width), 3)
    size = shape[0] * shape[1] * 3
    return np.frombuffer(data, np.uint8, size, len(data) - size).reshape(shape).copy()


def decode_ceiling(corpus: Corpus, args: argparse.Namespace) -> Result:
    """One core's decode rate over the corpus (its first images excluded), times the workers."""
    samples = _endless(DataPipeline(SimpleShardList(corpus.urls), tarfile_to_samples()))
    seconds, images, jpeg_bytes, jpegs = 0.0, 0, 0, 0
    me = psutil.Process()
    for seen, sample in enumerate(samples):
        if seen == CEILING_WARMUP_IMAGES:
            own_before, machine_before = sum(me.cpu_times()[:2]), machine_busy_seconds()
            window_start = time.perf_counter()
        if seconds >= args.seconds:
            break
        data = sample.get("jpg")
        start = time.perf_counter()
        if data is None:
            _decode_ppm(sample["ppm"])
        else:
            simplejpeg.decode_jpeg(data)
        elapsed = time.perf_counter() - start
        if seen >= CEILING_WARMUP_IMAGES:
            seconds += elapsed
            images += 1
            if data is not None:
                jpeg_bytes += len(data)
                jpegs += 1
    window = time.perf_counter() - window_start
    other = machine_busy_seconds() - machine_before - (sum(me.cpu_times()[:2]) - own_before)
    rate = images / seconds
    note = (f"decode-only ceiling: one core decodes {rate:,.0f} images/s ({1e3 / rate:.2f} ms per image; "
            f"{images:,} images, {jpegs:,} of them JPEGs of {jpeg_bytes / max(jpegs, 1) / 1e3:.1f} KB on "
            f"average) x {args.workers} workers")
    return Result(rate * args.workers, other_cores=other / window, note=note, stages={"decode": 1e3 / rate})


def fastloader_stages(loader: FastLoader) -> Dict[str, float]:
    """FastLoader's workers' milliseconds per image, by ``STAGE_GROUPS`` (waiting for slots left out)."""
    stages = loader.stats["stages"]
    return grouped({name: stage["ms_per_image"] for name, stage in stages.items() if name != "slot_wait"})


def fastloader(corpus: Corpus, args: argparse.Namespace) -> Result:
    """wdsmp's FastLoader on the same shards, with the sample counts of the corpus's index."""
    index = os.path.join(corpus.directory, "index.json")
    return measure_loader(lambda: FastLoader(index, args.batch_size, num_workers=args.workers,
                                             image_size=CROP_SIZE), args, fastloader_stages)


def fastloader_fresh_process(corpus: Corpus, args: argparse.Namespace, start_method: str = "spawn") -> Result:
    """FastLoader's first batches in a fresh interpreter that imports torch and wdsmp first
    (``wdsmp.bench.coldstart``), its workers started by ``start_method``: no rate, the latencies a
    restarted job meets."""
    figures = first_batches(os.path.join(corpus.directory, "index.json"), args.batch_size, args.workers, CROP_SIZE,
                            start_method=start_method)
    return Result(None, figures["first batch"], figures["new epoch"])


Contender = Callable[[Corpus, argparse.Namespace], Result]

# Name -> function(corpus, args) -> Result, in the order they run; BASELINE first.
CONTENDERS: Dict[str, Contender] = {
    BASELINE: dataloader_pipeline,
    "FastLoader": fastloader,
    FRESH: fastloader_fresh_process,
    f"{FRESH}, fork": functools.partial(fastloader_fresh_process, start_method="fork"),
    "decode-only ceiling": decode_ceiling,
}

# With --swap-import: the user's WebDataset pipeline, with either library imported as wds.
SWAP_CONTENDERS: Dict[str, Contender] = {
    "WebDataset pipeline, import webdataset": webdataset_swapped_out,
    "WebDataset pipeline, import wdsmp": wdsmp_swapped_in,
}


def contenders(args: argparse.Namespace) -> Dict[str, Contender]:
    """The contenders ``args`` asks for, in the order they run."""
    return {**CONTENDERS, **(SWAP_CONTENDERS if getattr(args, "swap_import", False) else {})}


def _cell(value: object, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def table(results: Mapping[str, Result], corpus_size: int) -> str:
    """Markdown table of ``{name: Result}``, each rate beside the baseline's."""
    base = cast(float, results[BASELINE].images_per_s)  # the baseline is measured: it has a rate
    lines = ["| contender | images/s | vs DataLoader | first batch (s) | new epoch (s) | CPU (cores) "
             "| images/CPU-s | peak PSS (MB) | PSS growth (MB) over epochs | other load (cores) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        if r.images_per_s is None:
            lines.append(f"| {name} | - | - | {_cell(r.first_batch_s, '{:.2f}')} | {_cell(r.new_epoch_s, '{:.2f}')} |"
                         + " - |" * 5)
            continue
        per_cpu = r.images_per_s / r.cpu_cores if r.cpu_cores else None
        pss = r.peak_pss / 2**20 if r.peak_pss is not None else None
        growth = (f"{r.pss_growth / 2**20:+,.0f} over {cast(int, r.images) / corpus_size:.1f}"
                  if r.pss_growth is not None else None)
        lines.append(f"| {name} | {r.images_per_s:,.0f} | {r.images_per_s / base:.2f}x | "
                     f"{_cell(r.first_batch_s, '{:.2f}')} | {_cell(r.new_epoch_s, '{:.2f}')} | "
                     f"{_cell(r.cpu_cores, '{:.2f}')} | "
                     f"{_cell(per_cpu, '{:,.0f}')} | {_cell(pss, '{:,.0f}')} | {_cell(growth, '{}')} | "
                     f"{_cell(r.other_cores, '{:.2f}')} |")
    return "\n".join(lines)


def machine() -> str:
    """The machine in one line: cores, CPU model and the versions that move the figures."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as stream:
            model = next(line.split(":", 1)[1].strip() for line in stream if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, torch {torch.__version__}, "
            f"simplejpeg {simplejpeg.__version__}, Pillow {Image.__version__}")


def region_decoding() -> str:
    """Whether FastLoader decodes only the region of a JPEG its crop needs, in words."""
    if native.jpeg_region_available():
        return "on (FastLoader decodes only the part of each JPEG its crop needs)"
    return ("off (wdsmp.native._jpegregion is not in use: FastLoader decodes whole JPEGs; `wdsmp doctor` says why, "
            "README.md how to build it)")


def header(command: str, corpus: Corpus) -> str:
    """What a run is: the command, the corpus, the machine and region decoding, as ``#`` lines."""
    return (f"# {command}\n# corpus: {corpus.describe()}\n# machine: {machine()}\n"
            f"# region decoding: {region_decoding()}")


def run(corpus: Corpus, args: argparse.Namespace, log: Optional[TextIO] = None) -> Dict[str, List[Result]]:
    """Measure every contender ``args.rounds`` times, interleaved: ``{name: [Result per round]}``.

    ``args`` carries ``workers``, ``batch_size``, ``seconds``, ``warmup`` and ``rounds``; each
    round's rate goes to the stream ``log`` as it comes, so a long run shows it is alive.
    """
    for url in corpus.urls:  # into the page cache
        with open(url, "rb") as stream:
            while stream.read(1 << 24):
                pass
    chosen = contenders(args)
    rounds: Dict[str, List[Result]] = {name: [] for name in chosen}
    for round_ in range(1, args.rounds + 1):
        for name, contender in chosen.items():
            result = contender(corpus, args)
            rounds[name].append(result)
            if log is not None and result.images_per_s is not None:
                print(f"# round {round_}/{args.rounds}: {name}: {result.images_per_s:,.0f} images/s",
                      file=log, flush=True)
    return rounds


def best(rounds: Mapping[str, Sequence[Result]]) -> Dict[str, Result]:
    """Each contender's best round: the fastest, or for a row without a rate the quickest first batch."""
    return {name: max(results, key=lambda r: r.images_per_s or -(r.first_batch_s or 0.0))
            for name, results in rounds.items()}


def _swap_note(results: Mapping[str, Result]) -> List[str]:
    """The swapped import's rate against webdataset's, when both ran."""
    theirs, ours = (results.get(name) for name in SWAP_CONTENDERS)
    if theirs is None or ours is None or not theirs.images_per_s:
        return []
    return [f"- import swapped: wdsmp delivers {cast(float, ours.images_per_s) / theirs.images_per_s:.2f}x "
            f"the images/s of webdataset {_webdataset_version()} running the same user code"]


def _webdataset_version() -> str:
    try:
        from importlib.metadata import version

        return version("webdataset")
    except Exception:  # noqa: BLE001 (only a label)
        return "(version unknown)"


def summary(rounds: Mapping[str, Sequence[Result]], corpus: Corpus) -> str:
    """The table of the best rounds, with the notes and every round's rate below it (Markdown)."""
    results = best(rounds)
    notes = [f"- {r.note}" for r in results.values() if r.note] + _swap_note(results)
    notes.append("- images/s in each round: " + "; ".join(
        f"{name} {', '.join(f'{r.images_per_s:,.0f}' for r in results if r.images_per_s is not None) or '-'}"
        for name, results in rounds.items()))
    return table(results, corpus.index["samples"]) + "\n\n" + "\n".join(notes)


def picture(rounds: Mapping[str, Sequence[Result]], corpus: Corpus, args: argparse.Namespace) -> str:
    """Draw the best rounds (``plot.draw``) to ``args.plot``; a ``#`` line saying where,
    or why there is no picture (matplotlib missing)."""
    from . import plot

    index = corpus.index
    title = (f"{index['samples']:,} JPEGs of ~{index['mean_width']}x{index['mean_height']} px, {args.workers} workers, "
             f"batches of {args.batch_size}, crop to {CROP_SIZE}; region decoding "
             f"{'on' if native.jpeg_region_available() else 'off'}; {os.cpu_count()} cores")
    try:
        plot.draw(best(rounds), args.plot, title, note=CEILING_NOTE)
    except ImportError as exn:
        return f"# no picture: {exn}"
    return f"# picture: {args.plot}"


def as_json(rounds: Mapping[str, Sequence[Result]]) -> Dict[str, Dict[str, Any]]:
    """``{name: {best round's figures..., "rounds": [images/s of each round]}}``, without the
    batch-by-batch series."""
    return {name: dict(asdict(result), series=None, rounds=[r.images_per_s for r in rounds[name]])
            for name, result in best(rounds).items()}
