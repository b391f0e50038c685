"""A training loop in miniature, run under torchrun by tests/test_distributed.py.

Each rank reads its batches from a ``WebLoader`` over ``ExactSamples`` or from a
``FastLoader`` (or both, an epoch each), makes one collective call per batch (as DDP's gradient
all-reduce does: a rank with fewer batches would hang the others), and logs
the keys of every batch. ``--checkpoint-at`` saves the loader's state after
that many batches, ``--kill-at`` then SIGKILLs every rank mid-epoch, and
``--resume`` starts from the saved state (``--state-of-rank``: every rank from that rank's,
as a job resumed on another number of ranks does). Rank 0 writes every rank's batch
count at the end.
"""

import argparse
import json
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

import wdsmp as wds


def _loader(args, kind, rank):
    cache_dir = None if args.cache_dir is None else os.path.join(args.cache_dir, f"rank{rank}")
    if kind == "fast":
        return wds.FastLoader(args.urls, batch_size=args.batch, num_workers=args.workers, image_size=16,
                              keys=True, cache_dir=cache_dir)
    source = wds.ExactSamples(args.urls, batch_size=args.batch, shuffle_buffer=8, cache_dir=cache_dir)
    dataset = wds.WebDataset(source).to_tuple("__key__", "cls").batched(args.batch, partial=False)
    return wds.WebLoader(dataset, batch_size=None, num_workers=args.workers)


def _save(state, path):
    with open(path + ".tmp", "w") as stream:
        json.dump(state, stream)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", choices=["pipeline", "fast", "both"], required=True,
                        help="both: an epoch of each, one after the other, logged with tags TAG-pipeline and TAG-fast")
    parser.add_argument("--urls", required=True, help="a shard spec or a shard index")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--epoch", type=int, default=1)
    parser.add_argument("--checkpoint-at", type=int)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--state-of-rank", type=int,
                        help="with --resume: every rank loads this rank's state (a job resumed on another "
                             "number of ranks)")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if args.loader == "both":
        for kind in ("pipeline", "fast"):
            _epoch(args, kind, f"{args.tag}-{kind}")
    else:
        _epoch(args, args.loader, args.tag)
    dist.destroy_process_group()


def _epoch(args, kind, tag):
    """One epoch through a loader of ``kind``: its batches' keys logged, the counts gathered."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state_path = os.path.join(args.out, f"state-rank{rank}.json")
    with open(os.path.join(args.out, f"pid-{tag}-rank{rank}.txt"), "w") as stream:
        stream.write(str(os.getpid()))  # a loader's shared memory is named after its process
    loader = _loader(args, kind, rank)
    if args.resume:
        if args.state_of_rank is not None:
            state_path = os.path.join(args.out, f"state-rank{args.state_of_rank}.json")
        with open(state_path) as stream:
            loader.load_state_dict(json.load(stream))
    loader.set_epoch(args.epoch)
    count = 0
    with open(os.path.join(args.out, f"keys-{tag}-rank{rank}.txt"), "w") as log:
        for batch in loader:
            keys = batch.keys if kind == "fast" else batch[0]
            dist.all_reduce(torch.ones(1))
            count += 1
            log.write(" ".join(keys) + "\n")
            log.flush()
            if count == args.checkpoint_at:
                _save(loader.state_dict(), state_path)
            if count == args.kill_at:
                dist.barrier()
                os.kill(os.getpid(), signal.SIGKILL)
    counts = [None] * world_size
    dist.all_gather_object(counts, count)
    if rank == 0:
        _save({"counts": counts, "len": len(loader)}, os.path.join(args.out, f"done-{tag}.json"))
    if kind == "fast":
        loader.close()


if __name__ == "__main__":
    main()
