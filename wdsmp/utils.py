"""Small helpers shared by the pipeline: who am I (node, worker), seeds, stage bases.

``pytorch_worker_info`` is the one place that decides which node and which
DataLoader worker the current process is; the shard splitters and the seeded
samplers all ask it, so they always agree.
"""

import hashlib
import itertools
import struct
import sys

from . import _env

__all__ = [
    "PipelineStage",
    "guess_batchsize",
    "identity",
    "is_iterable",
    "make_seed",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
    "repeatedly0",
]


def _distributed_rank_world(group):
    """(rank, world_size) from torch.distributed when it is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group=group), dist.get_world_size(group=group)


def _dataloader_worker():
    """(worker, num_workers) inside a DataLoader worker process, else None."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return None
    info = get_worker_info()
    if info is None:
        return None
    return info.id, info.num_workers


def pytorch_worker_info(group=None):
    """``(rank, world_size, worker, num_workers)`` of the calling process.

    Node: torch.distributed when initialised, else ``RANK``/``WORLD_SIZE``
    (torchrun sets them before the process group exists), else ``(0, 1)``.
    Worker: the DataLoader's worker info, else ``WORKER``/``NUM_WORKERS``
    (webdataset's override), else ``(0, 1)``.
    """
    node = _distributed_rank_world(group) or _env.rank_world_size() or (0, 1)
    worker = _dataloader_worker() or _env.worker_num_workers() or (0, 1)
    return node[0], node[1], worker[0], worker[1]


def pytorch_worker_seed(group=None):
    """A seed distinct per node and worker, and the same on every run (webdataset's formula)."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def _encode(arg):
    """Bytes that name ``arg`` and its type, the same in every process."""
    if arg is None:
        return b"n"
    if isinstance(arg, bool):
        return b"t" if arg else b"f"
    if isinstance(arg, int):
        return b"i" + str(arg).encode()
    if isinstance(arg, float):
        return b"d" + struct.pack("<d", arg)
    if isinstance(arg, str):
        return b"s" + arg.encode("utf-8", "surrogatepass")
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return b"b" + bytes(arg)
    if isinstance(arg, (tuple, list)):
        return b"(" + b"".join(_frame(a) for a in arg) + b")"
    raise TypeError(f"make_seed: cannot hash {type(arg).__name__} values deterministically")


def _frame(arg):
    data = _encode(arg)
    return struct.pack("<Q", len(data)) + data


def make_seed(*args):
    """A 31-bit seed from ints, strings, bytes, floats (and tuples of them).

    Unlike webdataset's, it never uses ``hash()``: string hashes are salted
    per process, so spawned workers would disagree on every seed.
    """
    digest = hashlib.blake2b(b"".join(_frame(a) for a in args), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def is_iterable(obj):
    """Whether ``obj`` can be iterated as a sequence of items (strings and bytes cannot)."""
    if isinstance(obj, (str, bytes, bytearray)):
        return False
    return hasattr(obj, "__iter__")


class PipelineStage:
    """Base of stage objects that ``DataPipeline`` calls as ``stage.run(upstream)``."""

    def run(self, *args, **kw):
        raise NotImplementedError(f"{type(self).__name__}.run")

    def invoke(self, *args, **kw):
        return self.run(*args, **kw)


def identity(x):
    """Return the argument: a picklable stand-in for ``lambda x: x``."""
    return x


def repeatedly0(loader, nepochs=sys.maxsize, nbatches=sys.maxsize):
    """Up to ``nbatches`` items from each of ``nepochs`` passes over ``loader``."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def guess_batchsize(batch):
    """The batch size of a tuple/list batch: the length of its first field."""
    return len(batch[0])


def repeatedly(source, nepochs=None, nbatches=None, nsamples=None, batchsize=guess_batchsize):
    """Items from repeated passes over ``source``, until a limit is reached.

    Stops after ``nepochs`` passes, ``nbatches`` items or ``nsamples`` samples
    (counted with ``batchsize(item)``), whichever comes first; a pass that
    yields nothing ends it too, so an exhausted iterator cannot loop forever.
    """
    epoch = batches = total = 0
    while nepochs is None or epoch < nepochs:
        count = 0
        for item in source:
            yield item
            count += 1
            batches += 1
            if nbatches is not None and batches >= nbatches:
                return
            if nsamples is not None:
                total += batchsize(item)
                if total >= nsamples:
                    return
        if count == 0:
            return
        epoch += 1
