"""FastLoader under faults, for many epochs: workers killed at random, bad samples in the data.

Usage::

    python benchmarks/soak.py [--epochs 20] [--samples 1200] [--bad 0.02] [--kill 0.05] [--seed 0]

It writes a corpus of small JPEGs (``--bad`` of them garbage) with a shard index, then runs one
FastLoader (``handler=ignore_and_continue``) epoch after epoch. After each batch, with
probability ``--kill``, it SIGKILLs a random worker; the ``WorkerError`` that follows is caught,
and the epoch goes on from ``state_dict()`` with fresh workers, as a training loop would after a
checkpoint. Each epoch's keys are compared with those of an undisturbed loader of the same seed
and epoch: they must be the same sequence (every good sample once, none lost or repeated by the
kills). It also checks the skipped count, and watches PSS (this process and its children), open
file descriptors and /dev/shm. Exit status 1 on any failed check.
"""

import argparse
import os
import random
import signal
import sys
import tempfile
import time

import numpy as np
import psutil
import simplejpeg

import wdsmp
from wdsmp.errors import WorkerError


def write_corpus(directory, samples, bad, seed):
    """Shards of small JPEGs with labels; returns (index path, keys of the bad samples)."""
    rng = np.random.default_rng(seed)
    broken = set()
    index = os.path.join(directory, "index.json")
    with wdsmp.ShardWriter(os.path.join(directory, "soak-%04d.tar"), maxcount=200, index=index) as sink:
        for i in range(samples):
            key = f"{i:06d}"
            if rng.random() < bad:
                data = b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 255, 300, dtype=np.uint8))
                broken.add(key)
            else:
                y, x = np.mgrid[0:48, 0:64]
                pixels = np.stack([x * 4, y * 5, (x + y) * 2], -1) + rng.integers(0, 30, (48, 64, 3))
                data = simplejpeg.encode_jpeg(np.clip(pixels, 0, 255).astype(np.uint8), 90)
            sink.write({"__key__": key, "jpg": data, "cls": str(i % 10).encode()})
    return index, broken


def make_loader(index, seed):
    return wdsmp.FastLoader(index, 16, num_workers=2, image_size=32, keys=True, seed=seed, policy="pad",
                            handler=wdsmp.ignore_and_continue)


def tree_pss():
    total = 0
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except psutil.NoSuchProcess:
            pass
    return total


def run_epoch(loader, epoch, rng, kill):
    """The keys of one epoch, killing workers at random; and how many kills hit."""
    loader.set_epoch(epoch)
    keys, kills, state = [], 0, None
    while True:
        if state is not None:
            loader.load_state_dict(state)
        try:
            for batch in loader:
                keys += batch.keys
                if rng.random() < kill:
                    try:
                        os.kill(rng.choice(loader._resources.workers.pids()), signal.SIGKILL)
                        kills += 1
                    except ProcessLookupError:  # killed already, and not yet noticed
                        pass
            return keys, kills
        except WorkerError:
            state = loader.state_dict()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--bad", type=float, default=0.02, help="fraction of garbage JPEGs")
    parser.add_argument("--kill", type=float, default=0.05, help="probability of a worker kill after a batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    failures = []
    with tempfile.TemporaryDirectory() as directory:
        index, broken = write_corpus(directory, args.samples, args.bad, args.seed)
        start = time.perf_counter()
        pss, fds = [], []
        total_kills = 0
        with make_loader(index, args.seed) as loader, make_loader(index, args.seed) as reference:
            for epoch in range(args.epochs):
                reference.set_epoch(epoch)
                expected = [key for batch in reference for key in batch.keys]
                skipped_before = loader.stats["skipped"]
                keys, kills = run_epoch(loader, epoch, rng, args.kill)
                total_kills += kills
                if keys != expected:
                    failures.append(f"epoch {epoch}: {len(keys)} keys differ from the undisturbed run's "
                                    f"{len(expected)} after {kills} kills")
                if set(keys) & broken:
                    failures.append(f"epoch {epoch}: bad samples delivered: {sorted(set(keys) & broken)[:5]}")
                if set(expected) != set(f"{i:06d}" for i in range(args.samples)) - broken:
                    failures.append(f"epoch {epoch}: the undisturbed run missed good samples")
                if kills == 0 and loader.stats["skipped"] - skipped_before != len(broken):
                    failures.append(f"epoch {epoch}: skipped {loader.stats['skipped'] - skipped_before}, "
                                    f"{len(broken)} bad samples")
                pss.append(tree_pss())
                fds.append(len(os.listdir("/proc/self/fd")))
                print(f"epoch {epoch:3d}: {len(keys)} samples, {kills} workers killed, PSS {pss[-1] / 2**20:,.0f} MB, "
                      f"{fds[-1]} fds", flush=True)
        # The rings of this process: a closed loader's is unlinked at once.
        left = [n for n in os.listdir("/dev/shm") if f"-{os.getpid()}-" in n and n.startswith("wdsmp-")]
        if left:
            failures.append(f"segments left in /dev/shm: {left}")
    elapsed = time.perf_counter() - start
    print(f"\n{args.epochs} epochs of {args.samples} samples ({len(broken)} bad) in {elapsed:.0f} s, "
          f"{total_kills} workers killed; PSS {pss[0] / 2**20:,.0f} MB after epoch 0, "
          f"{pss[-1] / 2**20:,.0f} MB after the last (max {max(pss) / 2**20:,.0f}); "
          f"open fds {fds[0]} -> {fds[-1]}; /dev/shm clean: {not left}")
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
