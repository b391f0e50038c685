"""Loaders as users' plain scripts run them: each measurement a fresh ``python`` process, timed from
the loader's construction, nothing warmed or started before.

Usage::

    python benchmarks/make_corpus.py /tmp/corpus --images 8000
    python benchmarks/bench_scripts.py --corpus /tmp/corpus [--workers 2] [--epochs 2] [--rounds 3]
        [--tree DIR ...] [--fastloader-only]

Each round runs, one after the other (so that a busy moment on a shared machine hits all alike),
for each ``--tree`` checkout (put first on ``PYTHONPATH``; default: the installed wdsmp):

- "FastLoader": ``loader = FastLoader(shards, batch_size=256, num_workers=W)``, then
  ``for images, labels in loader`` over ``--epochs`` epochs;
- "webdataset pipeline, import wdsmp": the WebDataset pipeline users write (``wds.WebDataset(
  shards, shardshuffle=100).shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(
  transform, int).batched(256)`` in a ``DataLoader(num_workers=W, batch_size=None)``, the
  transform torchvision's RandomResizedCrop(224), flip and ToTensor written with PIL, numpy and
  torch: ``wdsmp.bench.loader.CropFlipToTensor``, of the wdsmp running this script, copied beside
  the script so that every tree runs the same one) with ``import wdsmp as wds``, one epoch;

and once per round, the same pipeline with ``import webdataset as wds`` (webdataset 1.0.2);
``--fastloader-only`` leaves the pipelines out.
Each script reports its first batch (seconds from the loader's construction, the script's
imports done), and its images per second from the first batch to the last. The table gives
the median of the rounds, the lowest and highest beside it.
"""

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile

from wdsmp.bench import loader as benchmark

FASTLOADER = """
import glob, json, sys, time
import torch
from wdsmp import FastLoader

if __name__ == "__main__":
    shards = sorted(glob.glob(sys.argv[1] + "/*.tar"))
    workers, epochs = int(sys.argv[2]), int(sys.argv[3])
    images, first, start = 0, None, time.perf_counter()
    loader = FastLoader(shards, batch_size=256, num_workers=workers)
    for epoch in range(epochs):
        for batch, labels in loader:
            if first is None:
                first = since = time.perf_counter()
            else:
                images += len(labels)
    print(json.dumps({"first batch": first - start, "images/s": images / (time.perf_counter() - since)}))
"""

PIPELINE = """
import glob, json, sys, time
import torch
import {library} as wds
from transform import CropFlipToTensor

if __name__ == "__main__":
    shards = sorted(glob.glob(sys.argv[1] + "/*.tar"))
    workers = int(sys.argv[2])
    images, first, start = 0, None, time.perf_counter()
    dataset = (wds.WebDataset(shards, shardshuffle=100).shuffle(1000).decode("pil").to_tuple("jpg", "cls")
               .map_tuple(CropFlipToTensor(224), int).batched(256))
    for batch, labels in torch.utils.data.DataLoader(dataset, num_workers=workers, batch_size=None):
        if first is None:
            first = since = time.perf_counter()
        else:
            images += len(labels)
    print(json.dumps({{"first batch": first - start, "images/s": images / (time.perf_counter() - since)}}))
"""


def run(script, args, tree, directory):
    """The figures a script prints, run in a fresh interpreter with ``tree`` first on its path."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(tree), env.get("PYTHONPATH")) if p)
    path = os.path.join(directory, "script.py")
    with open(path, "w") as stream:
        stream.write(script)
    result = subprocess.run([sys.executable, path, *map(str, args)], capture_output=True, text=True, env=env,
                            cwd=directory, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"the script failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def contenders(args):
    """``[(name, script, arguments, tree)]`` in the order each round runs them."""
    trees = args.tree or [None]
    named = [(tree, f" ({tree})" if len(trees) > 1 else "") for tree in trees]
    plan = []
    for tree, suffix in named:
        plan.append((f"FastLoader{suffix}", FASTLOADER, (args.corpus, args.workers, args.epochs), tree))
    if args.fastloader_only:
        return plan
    plan.append(("webdataset pipeline, import webdataset", PIPELINE.format(library="webdataset"),
                 (args.corpus, args.workers), None))
    for tree, suffix in named:
        plan.append((f"webdataset pipeline, import wdsmp{suffix}", PIPELINE.format(library="wdsmp"),
                     (args.corpus, args.workers), tree))
    return plan


def _cell(values, fmt):
    values = sorted(values)
    return f"{fmt.format(statistics.median(values))} ({fmt.format(values[0])}-{fmt.format(values[-1])})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a directory of shards (benchmarks/make_corpus.py)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of each loader")
    parser.add_argument("--epochs", type=int, default=2, help="FastLoader's epochs per script")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running every contender once")
    parser.add_argument("--tree", action="append", help="a wdsmp checkout to measure (repeat to compare)")
    parser.add_argument("--fastloader-only", action="store_true", help="leave the webdataset pipelines out")
    args = parser.parse_args(argv)
    figures = {}
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "transform.py"), "w") as stream:
            stream.write("import math, random\nimport numpy as np\nimport torch\nfrom PIL import Image\n\n\n"
                         + inspect.getsource(benchmark.RandomResizedCropFlip) + "\n\n"
                         + inspect.getsource(benchmark.CropFlipToTensor))
        for round_ in range(args.rounds):
            for name, script, script_args, tree in contenders(args):
                result = run(script, script_args, tree, directory)
                figures.setdefault(name, []).append(result)
                print(f"round {round_ + 1}: {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    print(f"Command: python benchmarks/bench_scripts.py {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    print("| script | first batch (s) | images/s |")
    print("|---|---:|---:|")
    for name, results in figures.items():
        print(f"| {name} | {_cell([r['first batch'] for r in results], '{:.2f}')} | "
              f"{_cell([r['images/s'] for r in results], '{:,.0f}')} |")


if __name__ == "__main__":
    main()
