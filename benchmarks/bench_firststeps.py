"""A fresh process's first batches as a training loop meets them: how long each ``next()`` waits.

Usage::

    python benchmarks/bench_firststeps.py --corpus /tmp/wdsmp-corpus [--pause 0] [--first-step 3]
        [--step 0.25] [--batches 6] [--rounds 3] [--tree DIR ...]

Each round runs, in a new interpreter per ``--tree`` checkout (put first on ``PYTHONPATH``,
trees interleaved), a script that imports torch and wdsmp as a training script does, builds a
FastLoader (2 workers, batches of 256 crops to 224), waits ``--pause`` seconds (a script that
builds its model between the loader and the loop), then times ``iter()`` and the first batch,
trains ``--first-step`` seconds on it (CUDA's start, a compilation), and ``--step`` seconds on
each of the next ones, timing each wait. The first figure is from ``iter()``; the others are
the waits left after each step: where a start-up choice moves work from one batch to the next,
it shows here.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = """
import json, sys, time
import torch
from wdsmp import FastLoader

if __name__ == "__main__":
    index, pause, first_step, step, count = sys.argv[1], *map(float, sys.argv[2:5]), int(sys.argv[5])
    loader = FastLoader(index, 256, num_workers=2, image_size=224)
    time.sleep(pause)
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    waits = [time.perf_counter() - start]
    time.sleep(first_step)
    for _ in range(count - 1):
        start = time.perf_counter()
        next(batches)
        waits.append(time.perf_counter() - start)
        time.sleep(step)
    loader.close()
    print(json.dumps(waits))
"""


def _waits(tree, args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as directory:
        script = os.path.join(directory, "train.py")
        with open(script, "w") as stream:
            stream.write(SCRIPT)
        result = subprocess.run([sys.executable, script, os.path.join(args.corpus, "index.json"), str(args.pause),
                                 str(args.first_step), str(args.step), str(args.batches)],
                                capture_output=True, text=True, timeout=600, env=env, cwd=directory)
    if result.returncode != 0:
        raise RuntimeError(f"the loader script failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a directory made by benchmarks/make_corpus.py")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between building the loader and iter()")
    parser.add_argument("--first-step", type=float, default=3.0, help="seconds of training on the first batch")
    parser.add_argument("--step", type=float, default=0.25, help="seconds of training on each later batch")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="append", default=None, help="a checkout to measure (repeatable)")
    args = parser.parse_args()
    trees = args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    print(f"pause {args.pause} s, first step {args.first_step} s, then {args.step} s a batch; "
          f"waits for batches 1..{args.batches} (s), batch 1 from iter()")
    for r in range(args.rounds):
        for tree in trees:
            waits = _waits(tree, args)
            print(f"round {r + 1} {tree}: {', '.join(f'{w:.3f}' for w in waits)}", flush=True)


if __name__ == "__main__":
    main()
