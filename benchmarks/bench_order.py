"""What the sample order costs and buys (NOTE [sample order] in ``wdsmp/fast/loader.py``).

Three measurements on the benchmark corpus (``make_corpus.py``), each as a user's plain script
runs: a fresh process per run, nothing warmed or started before it.

1. Batches from shards written in label order: the corpus rewritten sorted by label (as
   ``ImageFolder`` lists files), read by FastLoader with its defaults (global order), with
   ``order="shards"`` (shard by shard through the shuffle buffer, as webdataset reads), and the
   distinct labels per batch a uniform shuffle of the same labels gives.
2. Images/s in global order against shard order on the corpus as it is, ``--rounds`` rounds
   interleaved (global, shards, global, ...): warm (the shards in the page cache) and cold (each
   shard dropped from the page cache before every run, ``posix_fadvise(POSIX_FADV_DONTNEED)``).
3. ``wdsmp split --shuffle --memory``: time and peak resident memory to reshuffle the corpus
   holding a fraction of it (``--memory``), against the process's own start-up peak.

Usage::

    python benchmarks/bench_order.py [--corpus /tmp/wdsmp-corpus] [--rounds 3] [--memory 100M] [--fold 100]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import wdsmp
from bench_shardcount import drop_from_page_cache, read_through  # beside this script
from wdsmp.fast.variety import expected_distinct
from wdsmp.shards.index import shard_counts

RUN = """import json, sys, time
start = time.perf_counter()
import wdsmp
urls, order, batch = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
distinct = []
if __name__ == "__main__":
    loader = wdsmp.FastLoader(urls, batch_size=batch, order=order)
    for images, labels in loader:
        distinct.append(len(set(labels.tolist())))
    stats = loader.stats
    print(json.dumps({"order": loader.order, "images_per_s": stats["images_per_s"], "batches": len(distinct),
                      "wall_s": time.perf_counter() - start, "median_distinct": sorted(distinct)[len(distinct) // 2],
                      "startup_s": stats["startup_s"]}))
"""

PEAK = """import re, sys
from wdsmp.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as status:  # this process's own peak (ru_maxrss counts the parent's at fork)
    print(int(re.search(r"VmHWM:\\s*(\\d+) kB", status.read()).group(1)) * 1024)
sys.exit(code)
"""


def _run(urls, order, batch):
    result = subprocess.run([sys.executable, "-c", RUN, ",".join(urls), order, str(batch)], capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def label_ordered(urls, directory, per_shard, fold):
    """The corpus rewritten sorted by label into ``directory`` (labels folded to ``fold`` classes,
    label * fold // 1000, when given); the new shards and the labels."""
    samples = list(wdsmp.DataPipeline(wdsmp.SimpleShardList(urls), wdsmp.tarfile_to_samples()))
    if fold:
        for sample in samples:
            sample["cls"] = str(int(sample["cls"]) * fold // 1000).encode()
    samples.sort(key=lambda s: (int(s["cls"]), s["__key__"]))
    paths = []
    for start in range(0, len(samples), per_shard):
        paths.append(os.path.join(directory, f"ordered-{len(paths):06d}.tar"))
        with wdsmp.TarWriter(paths[-1], encoder=False) as sink:
            for sample in samples[start:start + per_shard]:
                sink.write({k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")})
    return paths, [int(s["cls"]) for s in samples]


def uniform_median(labels, batch):
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(10):
        shuffled = rng.permutation(labels)[: len(labels) // batch * batch].reshape(-1, batch)
        runs.append(np.median([len(set(row.tolist())) for row in shuffled]))
    return float(np.median(runs))


def _peak(args, cwd):
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, check=True, cwd=cwd)
    return time.perf_counter() - started, int(result.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="/tmp/wdsmp-corpus")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--memory", default="100M", help="the reshuffle's --memory")
    parser.add_argument("--fold", type=int, action="append", default=[],
                        help="also measure with the labels folded to this many classes (repeatable): "
                             "ImageNet's ~1,300 images per class, where the corpus has few")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: labels,speed,reshuffle")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    index = os.path.join(args.corpus, "index.json")
    table = list(shard_counts(index))
    urls = [url for url, _ in table]
    print(f"corpus {args.corpus}: {len(urls)} shards, {sum(n for _, n in table)} samples; "
          f"{os.cpu_count()} CPUs; command: {' '.join(sys.argv)}")
    scratch = tempfile.mkdtemp(prefix="wdsmp-order-")
    try:
        for fold in ([None] + args.fold) if "labels" not in skip else ():
            ordered, labels = label_ordered(urls, scratch, max(n for _, n in table), fold)
            counts = np.bincount(labels)
            print(f"\n1. shards in label order ({len(ordered)} shards, {len(counts.nonzero()[0])} labels"
                  f"{', folded from 1000' if fold else ''}), batch {args.batch}: median distinct labels per batch")
            print(f"   uniform shuffle of the same labels: {uniform_median(np.array(labels), args.batch):.0f} "
                  f"(expected {expected_distinct(counts[counts > 0], args.batch):.1f} for draws with replacement)")
            for order in ("auto", "shards"):
                result = _run(ordered, order, args.batch)
                print(f"   FastLoader order={order!r} ({result['order']}): {result['median_distinct']}")
        if "speed" not in skip:
            print(f"\n2. images/s, global order against shard order, {args.rounds} interleaved rounds "
                  f"(a fresh process each)")
            for temperature in ("warm", "cold"):
                rates = {"global": [], "shards": []}
                for _ in range(args.rounds):
                    for order in rates:
                        if temperature == "cold":
                            drop_from_page_cache(urls)
                        else:
                            read_through(urls)
                        rates[order].append(_run(urls, order, args.batch)["images_per_s"])
                g, s = statistics.median(rates["global"]), statistics.median(rates["shards"])
                print(f"   {temperature}: global {g:.0f} images/s, shards {s:.0f} images/s: ratio {g / s:.3f} "
                      f"(rounds: global {[round(r) for r in rates['global']]}, "
                      f"shards {[round(r) for r in rates['shards']]})")
        if "reshuffle" not in skip:
            size = sum(os.path.getsize(u) for u in urls)
            print(f"\n3. wdsmp split --shuffle --memory {args.memory} over {size / 1e6:.0f} MB")
            tiny = os.path.join(scratch, "tiny.tar")
            with wdsmp.TarWriter(tiny, encoder=False) as sink:
                sink.write({"__key__": "a", "cls": b"1"})
            _, base = _peak(["cat", "-q", "-o", os.path.join(scratch, "tiny-out.tar"), tiny], scratch)
            seconds, peak = _peak(["split", "-q", "--shuffle", "--memory", args.memory, "-o",
                                   os.path.join(scratch, "shuffled-%06d.tar"), *urls], scratch)
            print(f"   {seconds:.1f} s, peak resident memory {peak / 1e6:.0f} MB, {(peak - base) / 1e6:.0f} MB above "
                  f"the command's start-up peak ({base / 1e6:.0f} MB)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
