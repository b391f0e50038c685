"""Tar splitting throughput: wdsmp's native splitter vs its pure-Python twin vs
Python's ``tarfile`` (streaming mode, as webdataset reads shards) vs ``cat``.

All readers run side by side in one process over the same shards from the page
cache, interleaved over several rounds; the best round of each is reported,
with its ratio to ``tarfile``. Usage::

    python benchmarks/bench_tar.py [--dir bench-data/tar] [--mb 256] [--rounds 3]
"""

import argparse
import os
import subprocess
import sys
import tarfile
import time

from wdsmp.native import tarsplit_py as _tarsplit_py
from wdsmp.native.core import native_available, tar_splitter_class
from wdsmp.writer import TarWriter

CORPORA = {
    # name: (bytes per member, members per sample)
    "small members (1 KB)": (1024, 2),
    "large members (100 KB)": (100 * 1024, 2),
}


def make_shards(directory, member_size, members_per_sample, total_mb, shards=4):
    """Write ``shards`` tar files holding ``total_mb`` of random-ish member data."""
    os.makedirs(directory, exist_ok=True)
    per_shard = total_mb * 2**20 // shards
    samples_per_shard = max(1, per_shard // (member_size * members_per_sample))
    payload = os.urandom(member_size)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"shard-{s:04d}.tar")
        paths.append(path)
        if os.path.exists(path):
            continue
        with TarWriter(path + ".part", encoder=False) as sink:
            for i in range(samples_per_shard):
                sample = {"__key__": f"s{s:04d}/{i:08d}"}
                for m in range(members_per_sample):
                    sample[f"f{m}.bin"] = payload
                sink.write(sample)
        os.rename(path + ".part", path)
    return paths


def read_native(paths):
    cls = tar_splitter_class()
    return _count(cls, paths)


def read_twin(paths):
    return _count(_tarsplit_py.TarSplitter, paths)


def _count(cls, paths):
    members = 0
    for path in paths:
        with open(path, "rb") as stream:
            for _ in cls(stream, path):
                members += 1
    return members


def read_tarfile(paths):
    members = 0
    for path in paths:
        with open(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            for info in tar:
                if info.isreg():
                    tar.extractfile(info).read()
                    members += 1
    return members


def read_cat(paths):
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return None


READERS = [("cat", read_cat), ("native", read_native), ("twin", read_twin),
           ("tarfile", read_tarfile)]


def bench(paths, rounds):
    total = sum(os.path.getsize(p) for p in paths)
    read_cat(paths)  # into the page cache
    best, counts = {}, {}
    for _ in range(rounds):
        for name, fn in READERS:
            start = time.perf_counter()
            counts[name] = fn(paths)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    members = counts["tarfile"]
    if not counts["native"] == counts["twin"] == members:
        raise SystemExit(f"readers disagree on member counts: {counts}")
    return total, members, best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="bench-data/tar")
    parser.add_argument("--mb", type=int, default=256, help="MB of member data per corpus")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not native_available():
        raise SystemExit("the native core is not in use (not built, or WDSMP_PUREPYTHON=1)")
    print(f"# {' '.join([os.path.basename(sys.argv[0])] + sys.argv[1:])}; best of {args.rounds} rounds")
    print("| corpus | reader | MB/s | members/s | vs tarfile | vs cat |")
    print("|---|---|---:|---:|---:|---:|")
    for corpus, (size, per_sample) in CORPORA.items():
        directory = os.path.join(args.dir, f"{size}x{per_sample}-{args.mb}mb")
        paths = make_shards(directory, size, per_sample, args.mb)
        total, members, best = bench(paths, args.rounds)
        for name, _ in READERS:
            t = best[name]
            rate = f"{members / t:,.0f}" if name != "cat" else "-"
            print(f"| {corpus} | {name} | {total / t / 1e6:,.0f} | {rate} | "
                  f"{best['tarfile'] / t:.1f}x | {best['cat'] / t:.2f}x |")


if __name__ == "__main__":
    main()
