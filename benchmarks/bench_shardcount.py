"""How long local shards take to count themselves (``wdsmp.epochs.counts``): what a FastLoader or
``ExactSamples`` on plain local shard URLs spends at construction before its epochs are exact.

The corpus is ImageNet's shape: ``--shards`` shards of ``--samples`` samples, each a ``.jpg``
member of ``--size`` bytes and a ``.cls`` member, in real tar files (GNU headers, as
``tarfile`` writes them). The ``.jpg`` data is left as holes of a sparse file, so that the
147 x 1000 x 110 KB of the default (16 GB apparent) costs about a gigabyte of disk and seconds
to write; the walk reads headers only, so it cannot tell. Counted, each round with an empty
count cache:

- warm: the shards in the page cache (as just written, or read before);
- cold: each file dropped from the page cache first (``posix_fadvise(POSIX_FADV_DONTNEED)``);
- pure-Python twin, warm (``WDSMP_PUREPYTHON=1``);
- from the count cache (a restart): the cache file read, every shard ``stat``-ed.

``--gzip`` also times one gzip-compressed shard of real (random, incompressible) data, which
has to be decompressed whole to be counted. The corpus is deleted at the end unless
``--keep``. Usage::

    python benchmarks/bench_shardcount.py [--dir /tmp/wdsmp-countbench] [--shards 147] [--rounds 3] [--gzip]
"""

import argparse
import gzip
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time

from wdsmp.native.core import native_available, tar_headers_class
from wdsmp.epochs.counts import count_local_shards
from wdsmp.tariterators import sample_count

BLOCK = 512


def _member(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mtime = size, 0
    return info.tobuf(format=tarfile.GNU_FORMAT)


def write_sparse_shard(path, samples, size):
    """A tar file of ``samples`` samples (``.jpg`` of ``size`` bytes left as a hole, ``.cls``)."""
    padded = -(-size // BLOCK) * BLOCK
    with open(path, "wb") as stream:
        for i in range(samples):
            stream.write(_member(f"{i:08d}.jpg", size))
            stream.seek(padded, os.SEEK_CUR)
            label = b"%d" % (i % 1000)
            stream.write(_member(f"{i:08d}.cls", len(label)) + label.ljust(BLOCK, b"\0"))
        stream.write(b"\0" * (2 * BLOCK))


def drop_from_page_cache(paths):
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_through(paths):
    """Bring the shards' pages into the page cache (the holes cost nothing)."""
    for path in paths:
        with open(path, "rb") as stream:
            while stream.read(1 << 24):
                pass


def timed_count(paths, cache_dir=None):
    """``(seconds, CPU seconds of this process, samples)`` to count ``paths`` with an empty count
    cache (or ``cache_dir``'s). The CPU seconds (all threads) tell the cost on a busy machine,
    where the wall clock also counts the time other processes ran."""
    with tempfile.TemporaryDirectory() as fresh:
        started, cpu = time.perf_counter(), time.process_time()
        counts = count_local_shards(paths, cache_dir or fresh)
        return time.perf_counter() - started, time.process_time() - cpu, sum(counts.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "wdsmp-countbench"))
    parser.add_argument("--shards", type=int, default=147)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--size", type=int, default=110_000, help="bytes of each .jpg member")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="also time one gzip-compressed shard of real data")
    parser.add_argument("--keep", action="store_true", help="keep the corpus")
    args = parser.parse_args()
    if not native_available():
        sys.exit("the native core is not in use: build it (python setup.py build_ext --inplace)")
    os.makedirs(args.dir, exist_ok=True)
    try:
        started = time.perf_counter()
        paths = [os.path.join(args.dir, f"train-{s:06d}.tar") for s in range(args.shards)]
        for path in paths:
            write_sparse_shard(path, args.samples, args.size)
        apparent = sum(os.path.getsize(p) for p in paths)
        print(f"corpus: {args.shards} shards x {args.samples} samples, {apparent / 1e9:.1f} GB apparent, "
              f"written in {time.perf_counter() - started:.1f} s; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        figures = {"warm": [], "cold": [], "pure-Python twin, warm": [], "from the count cache": []}
        expected = args.shards * args.samples
        with tempfile.TemporaryDirectory() as kept:
            count_local_shards(paths, kept)
            for _ in range(args.rounds):
                read_through(paths)
                figures["warm"].append(timed_count(paths))
                drop_from_page_cache(paths)
                figures["cold"].append(timed_count(paths))
                read_through(paths)
                os.environ["WDSMP_PUREPYTHON"] = "1"
                figures["pure-Python twin, warm"].append(timed_count(paths))
                del os.environ["WDSMP_PUREPYTHON"]
                figures["from the count cache"].append(timed_count(paths, kept))
        print(f"\n| counting {args.shards} shards ({expected:,} samples) | best s | median s | s per 100 shards "
              f"(best) | CPU s per 100 shards (least) | samples/s (best) |\n|---|---:|---:|---:|---:|---:|")
        for name, runs in figures.items():
            assert all(total == expected for _, _, total in runs), (name, runs)
            seconds = [s for s, _, _ in runs]
            best, cpu = min(seconds), min(c for _, c, _ in runs)
            print(f"| {name} | {best:.3f} | {statistics.median(seconds):.3f} | {best * 100 / args.shards:.3f} | "
                  f"{cpu * 100 / args.shards:.3f} | {expected / best:,.0f} |")
        print(f"\nload average after: {os.getloadavg()[0]:.1f}; rounds (s): " + "; ".join(
            f"{name} " + ", ".join(f"{s:.3f}" for s, _, _ in runs) for name, runs in figures.items()))
        _breakdown(paths[:20], args.rounds)
        if args.gzip:
            _time_gzip(args)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


def _breakdown(paths, rounds):
    """Where one thread's time goes, per shard (warm): the header walk, and within it the bare
    ``pread`` calls (the syscalls alone, at the offsets the walk reads), then the grouping."""
    read_through(paths)
    offsets, names = {}, {}
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            names[path] = [name for name, _, _ in tar_headers_class()(file, path)]
        offsets[path] = _read_offsets(path)

    def walk():
        for path in paths:
            with open(path, "rb", buffering=0) as file:
                [name for name, _, _ in tar_headers_class()(file, path)]

    def preads():
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            for offset in offsets[path]:
                os.pread(fd, 4096, offset)
            os.close(fd)

    def grouping():
        for path in paths:
            sample_count(names[path])

    print("\none thread, ms per shard (best of rounds): " + ", ".join(
        f"{name} {min(_seconds(f) for _ in range(rounds)) * 1000 / len(paths):.2f}"
        for name, f in (("header walk", walk), ("of which bare pread calls", preads), ("grouping", grouping))))


def _seconds(function):
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _read_offsets(path):
    """The offsets of the 4 KiB reads the walk makes: one at each header not already in the
    last read (the .jpg header after a .cls member is)."""
    offsets, covered, position = [], -1, 0
    with open(path, "rb") as stream:
        while True:
            stream.seek(position)
            header = stream.read(BLOCK)
            if len(header) < BLOCK or not any(header):
                return offsets
            if position + BLOCK > covered:
                offsets.append(position)
                covered = position + 4096
            size = int(header[124:136].split(b"\0")[0] or b"0", 8)
            position += BLOCK + -(-size // BLOCK) * BLOCK


def _time_gzip(args):
    """One shard of real random data, gzip-compressed: counting it means decompressing it."""
    path = os.path.join(args.dir, "real.tar.gz")
    payload = os.urandom(args.size)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as stream:
        for i in range(args.samples):
            stream.write(_member(f"{i:08d}.jpg", args.size) + payload.ljust(-(-args.size // BLOCK) * BLOCK, b"\0"))
            stream.write(_member(f"{i:08d}.cls", 1) + b"7".ljust(BLOCK, b"\0"))
        stream.write(b"\0" * (2 * BLOCK))
    seconds = min(timed_count([path])[0] for _ in range(args.rounds))  # wall clock
    print(f"\none gzip-compressed shard ({os.path.getsize(path) / 1e6:.0f} MB, {args.samples} samples), warm: "
          f"{seconds:.2f} s ({os.path.getsize(path) / 1e6 / seconds:.0f} MB/s of compressed shard)")


if __name__ == "__main__":
    main()
