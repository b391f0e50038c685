"""Where FastLoader's first batch goes: each part of start-up measured on its own, in fresh processes.

Usage::

    python benchmarks/bench_startup.py --corpus /tmp/wdsmp-corpus [--rounds 5] [--tree DIR ...]

Every figure comes from a new interpreter (``subprocess``), as a user who restarts a job meets
it; rounds are interleaved across the parts (and across ``--tree`` checkouts, each put first on
``PYTHONPATH``, to compare a change with what it replaces on the same machine at the same time),
and the median of the rounds is reported, with the lowest beside it. The parts:

- interpreter: ``python -c pass``;
- imports, each beyond the bare interpreter: numpy, torch, a worker's (numpy on one BLAS
  thread, then the worker module: what each spawned worker imports before its first task),
  and what a training script imports (``torch``, ``wdsmp`` and ``wdsmp.FastLoader``);
- ring: ``Ring.create`` of the benchmark's slots (the memory reserved with ``posix_fallocate``);
- opening the first shard and reading its first sample, the first image's decode (a fresh
  process's first call, and the mean of the following ones), and a whole batch decoded,
  cropped and written into a slot row by row, as one worker makes the first batch alone;
- end to end, in a script that imports torch and wdsmp as a training script does
  (``wdsmp.bench.coldstart``): construction, first batch from construction, and the first batch of
  a new epoch of the same loader (workers kept), after a whole epoch; and the first batch
  again with ``start_method="fork"`` (workers forked from the script itself, no interpreter
  to start).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

from wdsmp.bench.coldstart import first_batches

# Each probe runs in a fresh interpreter and prints its figures (seconds) as JSON.
_IMPORTS = {
    "interpreter": "pass",
    "import numpy": "import numpy",
    "import torch": "import torch",
    "a worker's (numpy on one thread, the worker module)": "import wdsmp.fast.numpy_one_thread, wdsmp.fast.worker",
    "a training script's imports (torch, wdsmp, FastLoader)": "import torch, wdsmp; wdsmp.FastLoader",
}

_PARTS = textwrap.dedent("""
    import json, random, sys, time
    import numpy as np
    from wdsmp.fast.imagedecode import decode_with_options
    from wdsmp.fast.layout import ArraySpec, BatchLayout
    from wdsmp.fast.options import DecodeOptions
    from wdsmp.fast.ring import Ring
    from wdsmp.epochs.plan import plan_epoch
    from wdsmp.epochs.ranges import read_ranges
    from wdsmp.shards.index import shard_counts

    index, batch_size, workers, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    figures = {}
    layout = BatchLayout(batch_size, (ArraySpec("images", (size, size, 3), "uint8"), ArraySpec("labels", (), "int64")))
    start = time.perf_counter()
    ring = Ring.create(layout, 2 * workers)
    figures["ring: create (reserve %d slots)" % (2 * workers)] = time.perf_counter() - start
    plan = plan_epoch(shard_counts(index, None), 0, batch_size=batch_size, num_streams=workers).streams[0]
    start = time.perf_counter()
    samples = read_ranges(plan.shards(resume=True))
    first = next(samples)
    figures["first shard: open, first sample"] = time.perf_counter() - start
    images = [first["jpg"]] + [next(samples)["jpg"] for _ in range(batch_size)]
    rows = ring.views(0)["images"]
    options, rng = DecodeOptions(), random.Random(0)
    start = time.perf_counter()
    decode_with_options(images[0], rows[0], options, rng)
    figures["first image: decode, crop (fresh process)"] = time.perf_counter() - start
    start = time.perf_counter()
    for row, data in enumerate(images[1:]):
        decode_with_options(data, rows[row], options, rng)
    batch = time.perf_counter() - start
    figures["one image: decode, crop (mean of the next %d)" % batch_size] = batch / batch_size
    figures["a batch of %d: decode, crop into a slot" % batch_size] = batch
    ring.close()
    print(json.dumps(figures))
""")

def _run(tree, args, timeout=600):
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                            cwd=tree or os.getcwd())
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _imports(tree):
    figures = {}
    for name, code in _IMPORTS.items():
        figures[name] = _run(tree, ["-c", f"import json, time; t = time.perf_counter(); {code}; "
                                          f"print(json.dumps(time.perf_counter() - t))"])
    return figures


def _timed_interpreter(tree):
    """Wall seconds of ``python -c pass``, from outside."""
    import time

    start = time.perf_counter()
    _run(tree, ["-c", "print(0)"])
    return {"interpreter: python -c pass": time.perf_counter() - start}


def measure(tree, scripts, args):
    """One round of every probe for the checkout ``tree`` (None: as imported): {part: seconds}."""
    common = [args.corpus_index, str(args.batch_size), str(args.workers), str(args.image_size)]
    figures = _timed_interpreter(tree)
    figures.update((f"import beyond the interpreter: {name}", seconds) for name, seconds in _imports(tree).items()
                   if name != "interpreter")
    figures.update(_run(tree, [scripts["parts"], *common]))
    end_to_end = first_batches(args.corpus_index, args.batch_size, args.workers, args.image_size, tree=tree)
    figures.update((f"end to end: {part}", seconds) for part, seconds in end_to_end.items())
    forked = first_batches(args.corpus_index, args.batch_size, args.workers, args.image_size, tree=tree,
                           start_method="fork")
    figures.update((f"end to end, start_method='fork': {part}", forked[part])
                   for part in ("first batch", "first batch, CPU"))
    return figures


def table(rounds_by_tree):
    """Markdown: one row per part, median (lowest) per tree."""
    trees = list(rounds_by_tree)
    parts = list(next(iter(rounds_by_tree.values()))[0])
    head = "| part | " + " | ".join(f"{t} (s)" for t in trees) + " |"
    lines = [head, "|---|" + "---:|" * len(trees)]
    for part in parts:
        cells = []
        for tree in trees:
            values = [r[part] for r in rounds_by_tree[tree] if part in r]
            cells.append(f"{statistics.median(values):.3f} ({min(values):.3f})" if values else "-")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a directory written by benchmarks/make_corpus.py")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[],
                        help="a wdsmp checkout to measure (repeat to compare); default: the wdsmp imported")
    args = parser.parse_args(argv)
    args.corpus_index = os.path.join(os.path.abspath(args.corpus), "index.json")
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        scripts = {}
        for name, text in (("parts", _PARTS),):
            scripts[name] = os.path.join(directory, f"{name}.py")
            with open(scripts[name], "w") as stream:
                stream.write(text)
        trees = [os.path.abspath(t) for t in args.tree] or [None]
        rounds = {tree or "this wdsmp": [] for tree in trees}
        for round_ in range(args.rounds):
            for tree in trees:
                figures = measure(tree, scripts, args)
                rounds[tree or "this wdsmp"].append(figures)
                print(f"# round {round_ + 1}/{args.rounds} {tree or 'this wdsmp'}: first batch "
                      f"{figures['end to end: first batch']:.2f} s", file=sys.stderr, flush=True)
    print(table(rounds))


if __name__ == "__main__":
    main()
