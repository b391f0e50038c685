"""What a DataLoader worker pays to stack a batch into shared memory: new memory, as torch's
``default_collate`` takes it, against the memory of an earlier batch no process holds any more
(``wdsmp._recycledshm``), and a plain ``torch.stack`` into private memory beside them.

Usage::

    python benchmarks/bench_batchmemory.py [--batch-size 256] [--shape 3 224 224] [--rounds 5]

In a process forked from this one, with one thread, as a DataLoader worker (wdsmp recycles only
in workers forked by the process taking their batches); the three ways alternate round by
round and the median round is reported, in milliseconds per image (per stacked tensor). The
recycled way drops each batch before stacking the next, as a training loop lets go of the
batch it has used.
"""

import argparse
import multiprocessing
import statistics
import sys
import time

import torch

from wdsmp import _recycledshm


def new_shared(tensors):
    """``torch.stack`` into new shared memory, as ``default_collate`` does in a worker."""
    first = tensors[0]
    storage = first.untyped_storage()._new_shared(len(tensors) * first.numel() * first.element_size())
    out = torch.empty(0, dtype=first.dtype).set_(storage, 0, (len(tensors), *first.shape))
    return torch.stack(tensors, out=out)


def seconds_per_batch(stack, tensors, batches):
    start = time.perf_counter()
    for _ in range(batches):
        batch = stack(tensors)
        del batch
    return (time.perf_counter() - start) / batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shape", type=int, nargs="+", default=[3, 224, 224])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=5, help="batches per round and way")
    args = parser.parse_args()
    worker = multiprocessing.get_context("fork").Process(target=measure, args=(args,))
    worker.start()
    worker.join()
    sys.exit(worker.exitcode)


def measure(args):
    """The three ways, timed here, in the forked process; the table on standard output."""
    torch.set_num_threads(1)
    tensors = [torch.rand(*args.shape) for _ in range(args.batch_size)]
    recycled = _recycledshm.stack(tensors)
    if recycled is None:
        sys.exit("bench_batchmemory: no recycled shared memory on this machine (Linux memfd and inotify)")
    assert torch.equal(recycled, torch.stack(tensors)) and torch.equal(new_shared(tensors), recycled)
    del recycled
    ways = {"new shared memory (as default_collate in a worker)": new_shared,
            "recycled shared memory (wdsmp)": _recycledshm.stack,
            "private memory (torch.stack)": torch.stack}
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, stack in ways.items():
            times[name].append(seconds_per_batch(stack, tensors, args.batches))
    megabytes = args.batch_size * tensors[0].numel() * tensors[0].element_size() / 1e6
    print(f"# {args.batch_size} float32 tensors of {tuple(args.shape)}: {megabytes:.0f} MB a batch, "
          f"median of {args.rounds} rounds of {args.batches} batches")
    print("| way | ms per image | ms per batch |")
    print("|---|---:|---:|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median * 1e3 / args.batch_size:.3f} | {median * 1e3:.1f} |")


if __name__ == "__main__":
    main()
