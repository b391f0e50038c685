#!/usr/bin/env python3
"""FastLoader.cuda() on a GPU machine, checked and measured in one run.

    pip install --no-build-isolation --no-deps -e .      # then, from the checkout:
    python benchmarks/gpu_check.py [--budget 420] [--json gpu_check.json]

Correctness first: ``.cuda()`` batches equal the CPU batches (keys, labels, order, pixels;
normalised in float32, bfloat16 and float16 within one rounding), with the right dtype, layout and
device, for every way of naming the device and depth; the same with the copies held back 20 ms a batch and every
batch kept (a slot recycled before its copy shows another batch's pixels), and with batches read
and let go of at once while the normalisation or the training stream is held back (a batch
handed out before its last kernel, or its memory reused while the training stream reads it,
reads wrong); the staging fallback (the ring registered beforehand, so CUDA
refuses the loader's registration), ``copy=True``, break and resume, a CUDA graph fed from the
loader, GPU memory flat over epochs, ``close()`` with an iterator suspended and after a
device-side assert. Then throughput: images/s delivered to the GPU in bfloat16 channels_last at
1, 4, 8 and 16 workers against a simulated 2 ms training step, the host's wait in ``next()``, the
GPU's idle time between steps and the copies' GB/s. ``/dev/shm`` is checked clean at the end.

Each step has a time limit inside ``--budget``; the JSON summary (``--json``, and ``$OUT`` when
set) is rewritten after every step, and the last line printed sums it up. Without CUDA the CPU
parts run (corpus, reference batches, ``.cuda()``'s error, ``/dev/shm``) and the GPU steps are
reported skipped: CI runs it that way.
"""

import argparse
import gc
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from wdsmp.fast.loader import FastLoader  # noqa: E402
from wdsmp.fast.ring import DEFAULT_PREFIX  # noqa: E402

MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 0.008, torch.float16: 0.002}  # one rounding of [-2.2, 2.7]


class Failed(Exception):
    """A check that did not hold."""


class OutOfTime(BaseException):
    """A step over its time (not an Exception: code under test that catches those lets it pass)."""


def expect(condition, message):
    if not condition:
        raise Failed(message)


class Run:
    """The steps' results, written as JSON after each step, each step within its time limit."""

    def __init__(self, args):
        self.args, self.started = args, time.monotonic()
        self.results = {"steps": {}, "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])}
        self.paths = [p for p in (args.json, os.path.join(os.environ["OUT"], "gpu_check.json")
                                  if os.environ.get("OUT") else None) if p]

    def left(self):
        return self.args.budget - (time.monotonic() - self.started)

    def step(self, name, function, limit, *, gpu=True):
        if gpu and not torch.cuda.is_available():
            return self._record(name, {"status": "skipped", "why": "no CUDA"})
        seconds = min(limit, self.left() - 5)
        if seconds < 3:
            return self._record(name, {"status": "skipped", "why": f"budget: {self.left():.0f} s left"})
        print(f"[{time.monotonic() - self.started:6.1f}s] {name} (up to {seconds:.0f} s)", flush=True)

        def out_of_time(signum, frame):
            raise OutOfTime(f"over {seconds:.0f} s")

        signal.signal(signal.SIGALRM, out_of_time)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        began = time.monotonic()
        try:
            entry = {"status": "pass", **(function() or {})}
        except Failed as exn:
            entry = {"status": "fail", "why": str(exn)}
        except OutOfTime as exn:
            entry = {"status": "timeout", "why": str(exn)}
        except Exception as exn:  # noqa: BLE001 - a step's error is its result
            entry = {"status": "error", "why": f"{type(exn).__name__}: {exn}"[:1500],
                     "traceback": traceback.format_exc()[-3000:]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        entry["seconds"] = round(time.monotonic() - began, 1)
        return self._record(name, entry)

    def _record(self, name, entry):
        self.results["steps"][name] = entry
        shown = {k: v for k, v in entry.items() if k != "traceback"}
        print(f"    {entry['status'].upper()} {name}: {json.dumps(shown, default=str)[:1200]}", flush=True)
        if "traceback" in entry:
            print(textwrap.indent(entry["traceback"], "    "), flush=True)
        self.write()
        return entry

    def write(self):
        self.results["elapsed_s"] = round(time.monotonic() - self.started, 1)
        for path in self.paths:
            with open(path + ".part", "w") as stream:
                json.dump(self.results, stream, indent=1, default=str)
            os.replace(path + ".part", path)

    def summary(self):
        steps = self.results["steps"]
        bad = sorted(name for name, entry in steps.items() if entry["status"] in ("fail", "error", "timeout"))
        ran = [name for name, entry in steps.items() if entry["status"] != "skipped"]
        rates = {run["workers"]: run["images_per_s"] for run in steps.get("throughput", {}).get("runs", [])}
        line = (f"gpu_check: {'FAILED ' + ','.join(bad) if bad else 'passed'}; {len(ran)} of {len(steps)} steps ran"
                f"{'' if torch.cuda.is_available() else ' (no CUDA: GPU steps skipped)'}; images/s by workers "
                f"{rates or '-'}; {self.results['elapsed_s']} s")
        self.results["summary"] = line
        self.write()
        print(line, flush=True)
        return 1 if bad else 0


# -- data ----------------------------------------------------------------------------------------


class Data:
    """The corpus (an index) and the CPU batches every GPU batch is compared with."""

    def __init__(self, args):
        self.args, self.index, self.reference = args, None, {}

    def loader(self, **kwargs):
        options = dict(batch_size=self.args.batch, num_workers=4, image_size=224, seed=7, keys=True, timeout=120)
        options.update(kwargs)
        return FastLoader(self.index, **options)

    def make_corpus(self):
        """``benchmarks/make_corpus.py``'s photographs where scikit-image is installed, else
        smooth colour fields with grain (``simple_corpus``); 8 shards."""
        index = os.path.join(self.args.corpus, "index.json")
        if not os.path.exists(index) or _read_json(index).get("samples") != self.args.images:
            if importlib.util.find_spec("skimage") is None:  # make_corpus.py's source photographs
                simple_corpus(self.args.corpus, self.args.images, 8)
            else:
                subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "make_corpus.py"), self.args.corpus,
                                "--images", str(self.args.images), "--shard-size",
                                str(max(1, -(-self.args.images // 8))), "--processes",
                                str(min(16, os.cpu_count() or 1))], check=True, capture_output=True)
        self.index = index
        return {"index": index, "samples": _read_json(index)["samples"],
                "generator": _read_json(index).get("generator", "benchmarks/make_corpus.py")}

    def make_reference(self):
        """Epochs 0 and 1 at 4 workers, and for the GPU steps epoch 0 at 16 and at 2 (``copy=True``:
        kept)."""
        runs = ((4, (0, 1)), (16, (0,)), (2, (0,))) if torch.cuda.is_available() else ((4, (0, 1)),)
        for workers, epochs in runs:
            with self.loader(num_workers=workers, copy=True) as loader:
                for epoch in epochs:
                    loader.set_epoch(epoch)
                    self.reference[workers, epoch] = [(list(b.keys), b.images, b.labels) for b in loader]
        return {"batches": {f"{w} workers, epoch {e}": len(v) for (w, e), v in self.reference.items()}}


def simple_corpus(directory, images, shards):
    """``images`` JPEGs of ImageNet-like sizes (300-500 pixels a side) in ``shards`` shards, with
    labels, and ``index.json``: smooth random colour fields with grain, made with numpy and torch
    alone (the GPU machine may lack scikit-image)."""
    import simplejpeg

    from wdsmp import TarWriter
    from wdsmp.shards.index import write_index

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    per_shard, entries = -(-images // shards), []
    for shard in range(shards):
        name, count = f"train-{shard:06d}.tar", min(per_shard, images - shard * per_shard)
        with TarWriter(os.path.join(directory, name)) as sink:
            for i in range(count):
                height, width = (int(side) for side in rng.integers(300, 501, 2))
                coarse = torch.from_numpy(rng.random((1, 3, height // 40 + 2, width // 40 + 2), np.float32) * 255)
                smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bicubic")
                grain = rng.normal(0, 6, (height, width, 3)).astype(np.float32)
                pixels = np.clip(smooth[0].permute(1, 2, 0).numpy() + grain, 0, 255).astype(np.uint8)
                sink.write({"__key__": f"{shard:06d}-{i:05d}", "jpg": simplejpeg.encode_jpeg(pixels, 90),
                            "cls": int(rng.integers(1000))})
        entries.append((name, count))
    write_index(os.path.join(directory, "index.json"), entries, samples=images, generator="gpu_check.py")


def _read_json(path):
    with open(path) as stream:
        return json.load(stream)


def wanted(images, dtype):
    """The reference batch as ``.cuda()`` should deliver it: NCHW, normalised in float64 unless uint8."""
    nchw = images.permute(0, 3, 1, 2)
    if dtype == torch.uint8:
        return nchw
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (nchw.double() - mean) / std


def check_epoch(batches, reference, *, dtype=torch.uint8, channels_last=True, device=None, hold=False,
                between=None):
    """Iterate ``batches`` (a ``.cuda()`` loader) and compare every batch with ``reference``; with
    ``hold``, all batches are kept and compared at the end (a recycled buffer would show). ``between``
    runs after each batch. The largest error."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    held, worst = [], 0.0

    def compare(i, batch):
        keys, images, labels = reference[i]
        expect(list(batch.keys) == keys, f"batch {i}: keys {batch.keys[:2]}... where the CPU had {keys[:2]}...")
        expect(torch.equal(batch.labels.cpu(), labels), f"batch {i}: labels differ")
        got, want = batch.images.cpu(), wanted(images, dtype)
        if dtype == torch.uint8:
            expect(torch.equal(got, want), f"batch {i}: pixels differ")
            return 0.0
        error = (got.double() - want).abs().max().item()
        expect(error <= TOLERANCE[dtype], f"batch {i}: {dtype} error {error:.4g} > {TOLERANCE[dtype]}")
        return error

    count = 0
    for i, batch in enumerate(batches):
        expect(i < len(reference), f"more batches than the CPU's {len(reference)}")
        images = batch.images
        expect(images.device == device and batch.labels.device == device, f"batch {i} on {images.device}")
        expect(images.dtype == dtype, f"batch {i}: {images.dtype}, not {dtype}")
        layout = torch.channels_last if channels_last else torch.contiguous_format
        expect(images.is_contiguous(memory_format=layout), f"batch {i}: strides {images.stride()}")
        if between is not None:
            between()
        if hold:
            held.append((i, batch))
        else:
            worst = max(worst, compare(i, batch))
        count += 1
    torch.cuda.synchronize()
    for i, batch in held:
        worst = max(worst, compare(i, batch))
    expect(count == len(reference), f"{count} batches on the GPU, {len(reference)} on the CPU")
    return worst


def sleep_cycles(milliseconds):
    """``torch.cuda._sleep`` cycles for ``milliseconds`` on this GPU (measured once)."""
    if not hasattr(sleep_cycles, "per_ms"):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        sleep_cycles.per_ms = 50_000_000 / start.elapsed_time(end)
    return int(milliseconds * sleep_cycles.per_ms)


def late_copies(gpu):
    """Before each batch, hold ``gpu``'s side stream back 20 ms: its copies finish late."""
    def hold_back():
        with torch.cuda.stream(gpu.stream):
            torch.cuda._sleep(sleep_cycles(20))
    return hold_back


# -- steps ---------------------------------------------------------------------------------------


def step_environment():
    import wdsmp.native.core

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpus": len(os.sched_getaffinity(0)), "native_core": wdsmp.native.core.native_available()}
    if torch.cuda.is_available():
        info.update(device=torch.cuda.get_device_name(), devices=torch.cuda.device_count())
    return info


def step_no_cuda(data):
    with data.loader(num_workers=1) as loader:
        try:
            loader.cuda()
        except RuntimeError as exn:
            expect("needs a CUDA device" in str(exn), f"an unclear error: {exn}")
            return {"error": str(exn)[:200]}
    raise Failed(".cuda() raised nothing without CUDA")


def step_equal(data):
    info = {}
    with data.loader() as loader:
        gpu = loader.cuda()
        check_epoch(gpu, data.reference[4, 0])
        check_epoch(gpu, data.reference[4, 1])  # the same .cuda() loader, the next epoch
        stats = loader.stats
        expect(stats["pinned"] is True, f"the ring was not pinned: {stats['pin_error']}")
        image_bytes = stats["samples"] * 224 * 224 * 3
        info["h2d_gb_per_s"] = round(image_bytes / stats["h2d_s"] / 1e9, 1) if stats["h2d_s"] else None
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            loader.set_epoch(0)
            info[f"{dtype}_error"] = check_epoch(loader.cuda(mean=MEAN, std=STD, dtype=dtype), data.reference[4, 0],
                                                 dtype=dtype)
        loader.set_epoch(0)
        check_epoch(loader.cuda(mean=MEAN, std=STD, channels_last=False), data.reference[4, 0],
                    dtype=torch.float32, channels_last=False)
    return info


def step_devices(data):
    index = torch.cuda.current_device()
    with data.loader() as loader:
        for device in ("cuda", index, f"cuda:{index}", torch.device("cuda", index)):
            loader.set_epoch(0)
            check_epoch(loader.cuda(device), data.reference[4, 0])
        for depth in (1, 4):
            loader.set_epoch(0)
            check_epoch(loader.cuda(depth=depth), data.reference[4, 0])
        if torch.cuda.device_count() > 1:
            other = torch.device("cuda", (index + 1) % torch.cuda.device_count())
            loader.set_epoch(0)
            check_epoch(loader.cuda(other), data.reference[4, 0], device=other)
    return {"devices": torch.cuda.device_count()}


def step_late_copies(data):
    """Copies held back, every batch held: 16 workers, then 2 workers of one slot with 3 batches
    ahead (a worker's only slot waits for its copy before the worker can go on)."""
    for workers in (16, 2):
        with data.loader(num_workers=workers, prefetch=1) as loader:
            gpu = loader.cuda(depth=3)
            check_epoch(gpu, data.reference[workers, 0], hold=True, between=late_copies(gpu))


def step_late_kernels(data):
    """Each batch read on the training stream and let go of at once, its per-image sums compared
    with the CPU's: first with the side stream's normalisation held back 40 ms a batch (a batch
    handed out before its last kernel, without a wait on its event, reads unfinished memory),
    then with the training stream busy 40 ms before each read (a batch's memory given to the
    next batches while the training stream may still read it, without ``record_stream``, reads
    another batch's pixels)."""
    from wdsmp.fast import transfer

    reference = data.reference[4, 0]
    wanted_sums = [wanted(images, torch.float32).sum((1, 2, 3)) for _, images, _ in reference]
    normalise, late = transfer.to_model_input, sleep_cycles(40)

    def late_normalise(*args, **kwargs):
        torch.cuda._sleep(late)
        return normalise(*args, **kwargs)

    errors = {}
    for name, side_delay, training_delay in (("late normalisation", True, 0), ("busy training stream", False, late)):
        transfer.to_model_input = late_normalise if side_delay else normalise
        try:
            with data.loader() as loader:
                sums = []
                for batch in loader.cuda(mean=MEAN, std=STD, depth=3):
                    if training_delay:
                        torch.cuda._sleep(training_delay)
                    sums.append(batch.images.double().sum((1, 2, 3)))
                torch.cuda.synchronize()
        finally:
            transfer.to_model_input = normalise
        expect(len(sums) == len(reference), f"{name}: {len(sums)} batches, the CPU had {len(reference)}")
        errors[name] = max((got.cpu() - want).abs().max().item() for got, want in zip(sums, wanted_sums))
        expect(errors[name] <= 1.0, f"{name}: a batch's per-image sums are off by {errors[name]:.4g}")
    return {"largest_sum_error": errors}


def step_staging(data):
    with data.loader(prefetch=1) as loader:
        memory = np.frombuffer(loader._resources.ring.buffer, np.uint8)
        cudart = torch.cuda.cudart()
        expect(int(cudart.cudaHostRegister(memory.ctypes.data, memory.nbytes, 0)) == 0, "could not pin the ring")
        try:
            gpu = loader.cuda(depth=2)
            import warnings

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                next(iter(gpu))
            expect(any("could not be registered" in str(w.message) for w in caught), "no warning of the fallback")
            loader.set_epoch(0)
            check_epoch(gpu, data.reference[4, 0], hold=True, between=late_copies(gpu))
            stats = loader.stats
        finally:
            torch.cuda.synchronize()
            cudart.cudaHostUnregister(memory.ctypes.data)
    expect(stats["pinned"] is False and "could not be pinned" in stats["bottleneck"], "stats do not say it")
    return {"pin_error": stats["pin_error"]}


def step_copy_true(data):
    with data.loader(copy=True) as loader:
        check_epoch(loader.cuda(), data.reference[4, 0])


def step_break_resume(data):
    reference = data.reference[4, 0]
    cut = min(4, len(reference) - 2)
    with data.loader() as loader:
        for i, _ in enumerate(loader.cuda()):
            if i == cut:
                break
        state = loader.state_dict()
        loader.set_epoch(1)
        check_epoch(loader.cuda(), data.reference[4, 1])
    with data.loader() as loader:
        loader.load_state_dict(state)
        check_epoch(loader.cuda(), reference[cut + 1:])
    return {"state": state}


def step_cuda_graph(data):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten()).cuda().to(memory_format=torch.channels_last)
    static = torch.zeros(data.args.batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.allow_tf32 = False  # graph and eager may pick different TF32 plans
    with torch.no_grad():
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            model(static)
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = model(static)
        worst = 0.0
        with data.loader() as loader:
            for _, batch in zip(range(4), loader.cuda(mean=MEAN, std=STD)):
                static.copy_(batch.images)
                graph.replay()
                worst = max(worst, (output - model(batch.images)).abs().max().item())
    expect(worst <= 1e-4, f"the graph's output differs from eager by {worst}")
    return {"difference": worst}


def step_memory(data):
    allocated = []
    with data.loader(keys=False) as loader:
        gpu = loader.cuda(mean=MEAN, std=STD, dtype=torch.bfloat16)
        for _ in range(4):
            for batch in gpu:
                pass
            del batch
            gc.collect()
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
    growth = allocated[-1] - allocated[0]
    expect(growth <= 16 << 20, f"GPU memory grew {growth >> 20} MiB over 3 epochs: {allocated}")
    return {"allocated_mib": [a >> 20 for a in allocated]}


def step_close(data):
    loader = data.loader(num_workers=2)
    ring = f"/dev/shm/{loader._resources.ring.name}"
    batches = iter(loader.cuda(mean=MEAN, std=STD))
    next(batches)
    loader.close()  # copies may be in flight
    expect(not os.path.exists(ring), "close() left the ring")
    loader = data.loader(num_workers=2)
    ring = f"/dev/shm/{loader._resources.ring.name}"
    batches = iter(loader.cuda())
    next(batches)
    del batches, loader  # no close(): garbage collection closes it
    gc.collect()
    expect(not os.path.exists(ring), "a dropped loader left the ring")


def step_device_assert(data):
    code = textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {REPO!r})
        from wdsmp.fast.loader import FastLoader
        if __name__ == "__main__":
            loader = FastLoader({data.index!r}, batch_size=32, num_workers=2)
            ring = "/dev/shm/" + loader._resources.ring.name
            try:
                with loader:
                    for images, labels in loader.cuda():
                        torch.zeros(2, device="cuda")[torch.tensor([10 ** 6], device="cuda")].sum().item()
            except Exception as exn:
                print("RESULT", type(exn).__name__, "device-side assert" in str(exn), os.path.exists(ring))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=80)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    expect(lines, f"no result: {done.stderr[-1500:]}")
    _, raised, named, ring_left = lines[-1].split()
    expect(named == "True", f"the user's error did not propagate out of the with block: {raised}")
    expect(ring_left == "False", "the ring was left in /dev/shm")
    return {"raised": raised}


def step_throughput(run, data, seconds):
    """Images/s to the GPU (bfloat16 channels_last, 256 x 224 x 224) against a simulated training
    step of ``--step-ms`` per batch, at 1, 4, 8 and 16 workers: the host's wait in ``next()``, the
    GPU idle between steps, the copies' GB/s."""
    runs = []
    step = sleep_cycles(run.args.step_ms)
    for workers in [w for w in (1, 4, 8, 16) if w <= len(os.sched_getaffinity(0))]:
        with data.loader(num_workers=workers, batch_size=256, keys=False, resampled=True, epoch_batches=10 ** 6,
                         timeout=300) as loader:
            batches = iter(loader.cuda(mean=MEAN, std=STD, dtype=torch.bfloat16))
            next(batches)
            warm_until = time.perf_counter() + 3
            while time.perf_counter() < warm_until:
                next(batches)
            before, waits, marks = loader.stats, [], []
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                asked = time.perf_counter()
                batch = next(batches)
                waits.append(time.perf_counter() - asked)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                torch.cuda._sleep(step)
                batch.images.sum()  # the step reads the batch
                end.record()
                marks.append((begin, end))
                if len(marks) > 8:
                    marks[-8][1].synchronize()  # the host runs ahead of the GPU at most 8 steps
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
            after = loader.stats
            del batches, batch
        images = after["samples"] - before["samples"]
        gaps = [marks[k][1].elapsed_time(marks[k + 1][0]) for k in range(len(marks) - 1)]
        h2d = after["h2d_s"] - before["h2d_s"]
        runs.append({"workers": workers, "images_per_s": round(len(waits) * 256 / wall),
                     "host_wait_fraction": round(sum(waits) / wall, 3),
                     "host_wait_ms_median": round(statistics.median(waits) * 1e3, 2),
                     "gpu_idle_fraction": round(sum(gaps) / 1e3 / wall, 3),
                     "h2d_gb_per_s": round(images * 224 * 224 * 3 / h2d / 1e9, 1) if h2d else None,
                     "copy_wait_ms_per_batch": round((after["copy_wait_s"] - before["copy_wait_s"]) * 1e3
                                                     / max(len(waits), 1), 3),
                     "bottleneck": after["bottleneck"][:160]})
        print(f"      {runs[-1]}", flush=True)
        run.write()
    return {"step_ms": run.args.step_ms, "runs": runs}


def step_shm():
    gc.collect()
    mine = [name for name in os.listdir("/dev/shm") if name.startswith(f"{DEFAULT_PREFIX}{os.getpid()}-")]
    expect(not mine, f"left in /dev/shm: {mine}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="/tmp/wdsmp-gpu-check", help="where the generated shards go")
    parser.add_argument("--images", type=int, default=2000, help="images in the generated corpus")
    parser.add_argument("--batch", type=int, default=64, help="batch size of the correctness steps")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per throughput run")
    parser.add_argument("--step-ms", type=float, default=2.0, help="the simulated training step per batch")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for everything")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    run, data = Run(args), Data(args)
    run.step("environment", step_environment, 30, gpu=False)
    if run.step("corpus", data.make_corpus, 180, gpu=False)["status"] != "pass":
        return run.summary()
    if run.step("reference", data.make_reference, 120, gpu=False)["status"] != "pass":
        return run.summary()
    if not torch.cuda.is_available():
        run.step("no_cuda", lambda: step_no_cuda(data), 60, gpu=False)
    for name, function, limit in (("equal", step_equal, 90), ("devices", step_devices, 60),
                                  ("late_copies", step_late_copies, 60), ("late_kernels", step_late_kernels, 90),
                                  ("staging", step_staging, 60), ("copy_true", step_copy_true, 30),
                                  ("break_resume", step_break_resume, 60), ("cuda_graph", step_cuda_graph, 30),
                                  ("memory", step_memory, 60), ("close", step_close, 30),
                                  ("device_assert", step_device_assert, 90)):
        run.step(name, lambda function=function: function(data), limit)
    data.reference.clear()
    seconds = max(3.0, min(args.seconds, (run.left() - 30) / 4 - 6))
    run.step("throughput", lambda: step_throughput(run, data, seconds), run.left() - 15)
    run.step("shm", step_shm, 15, gpu=False)
    return run.summary()


if __name__ == "__main__":
    sys.exit(main())
