"""FastLoader's first batches as a fresh process meets them: a new interpreter that imports torch
and wdsmp as a training script does, builds a loader and times its first batch (from
construction), its second batch after one training step of :data:`STEP` seconds (the wait
left after the step), and the first batch of its second epoch (from ``iter()``, workers
kept), after an epoch taken as fast as it comes ("new epoch": nothing to overlap, the workers make the
first batch as the loop waits), and of its third, after an epoch whose loop trains
:data:`STEP` seconds on each batch ("new epoch after training steps": the workers went ahead
with it meanwhile, NOTE [next epoch ahead] in ``wdsmp/fast/delivery.py``), and that epoch's
second batch after one more step. "first batch, CPU" is the CPU time all the loader's
processes (the script from construction on, the workers) spent until the first batch: on C
cores the first batch cannot come sooner than that over C.

The loader benchmark (``wdsmp.bench.loader``) reports it as a row of its own, and
``benchmarks/bench_startup.py`` beside each part of start-up; both run :data:`SCRIPT`,
which uses wdsmp's public API only, so it measures any checkout put on ``PYTHONPATH``.
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, Optional

__all__ = ["SCRIPT", "STEP", "first_batches"]

STEP = 0.25  # seconds of "training" on a batch (the first, each of the third epoch): about a batch's making on 2 cores

SCRIPT = """
import json, sys, time
import psutil
import torch
from wdsmp import FastLoader


def cpu_seconds(process):
    times = process.cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    index, batch_size, workers, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    step, start_method = float(sys.argv[5]), sys.argv[6]
    me = psutil.Process()
    start, cpu_before = time.perf_counter(), cpu_seconds(me)
    loader = FastLoader(index, batch_size, num_workers=workers, image_size=size, start_method=start_method)
    built = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    cpu = cpu_seconds(me) - cpu_before + sum(cpu_seconds(child) for child in me.children(recursive=True))
    time.sleep(step)
    fresh_second = time.perf_counter()
    next(batches)
    fresh_second = time.perf_counter() - fresh_second
    for _ in batches:
        pass
    end = time.perf_counter()
    batches = iter(loader)
    next(batches)
    tight = time.perf_counter() - end
    for _ in batches:
        time.sleep(step)
    end = time.perf_counter()
    batches = iter(loader)
    next(batches)
    trained = time.perf_counter()
    time.sleep(step)
    second = time.perf_counter()
    next(batches)
    second = time.perf_counter() - second
    loader.close()
    print(json.dumps({"construction": built - start, "first batch": first - start, "first batch, CPU": cpu,
                      "first batch, then the second after one step": fresh_second,
                      "new epoch": tight, "new epoch after training steps": trained - end,
                      "new epoch after training steps, its second batch": second}))
"""


def first_batches(index: str, batch_size: int, workers: int, image_size: int, *, tree: Optional[str] = None,
                  start_method: str = "spawn", timeout: float = 600) -> Dict[str, float]:
    """``{"construction", "first batch", "first batch, CPU", "first batch, then the second after one step",
    "new epoch", "new epoch after training steps",
    "new epoch after training steps, its second batch": seconds}``
    of a FastLoader over the corpus ``index`` in a fresh interpreter, its workers started by
    ``start_method``; ``tree``: a checkout put first on its ``PYTHONPATH``."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as directory:
        script = os.path.join(directory, "train.py")
        with open(script, "w") as stream:
            stream.write(SCRIPT)
        result = subprocess.run([sys.executable, script, index, str(batch_size), str(workers), str(image_size),
                                 str(STEP), start_method],
                                capture_output=True, text=True, timeout=timeout, env=env, cwd=directory)
    if result.returncode != 0:
        raise RuntimeError(f"the fresh-process loader failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
