"""Who am I: the node and the DataLoader worker of the calling process.

``pytorch_worker_info`` is the one place that decides which node and which
DataLoader worker the current process is; the shard splitters and the seeded
samplers all ask it, so they always agree.
"""

import sys
from typing import Any, Optional, Tuple

from . import env

__all__ = ["pytorch_worker_info", "pytorch_worker_seed"]

# Both are looked up, never imported: a process group exists only where torch.distributed was
# imported, a DataLoader worker only where torch.utils.data was. Importing them here would cost
# a process without torch its import, and a first import of torch.utils.data keeps the frames
# of its callers (a loader under construction among them) alive for the life of the process.


def _distributed_rank_world(group: Any) -> Optional[Tuple[int, int]]:
    """(rank, world_size) from torch.distributed when it is initialised, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group=group), dist.get_world_size(group=group)


def _dataloader_worker() -> Optional[Tuple[int, int]]:
    """(worker, num_workers) inside a DataLoader worker process, else None."""
    data = sys.modules.get("torch.utils.data")
    info = None if data is None else data.get_worker_info()
    if info is None:
        return None
    return info.id, info.num_workers


def pytorch_worker_info(group: Any = None) -> Tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of the calling process.

    Node: torch.distributed when initialised, else ``RANK``/``WORLD_SIZE``
    (torchrun sets them before the process group exists), else ``(0, 1)``.
    Worker: the DataLoader's worker info, else ``WORKER``/``NUM_WORKERS``
    (webdataset's override), else ``(0, 1)``.
    """
    node = _distributed_rank_world(group) or env.rank_world_size() or (0, 1)
    worker = _dataloader_worker() or env.worker_num_workers() or (0, 1)
    return node[0], node[1], worker[0], worker[1]


def pytorch_worker_seed(group: Any = None) -> int:
    """A seed distinct per node and worker, and the same on every run (webdataset's formula)."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker
