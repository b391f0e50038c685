"""wdsmp: WebDataset-compatible sharded data loading for PyTorch, with a native core.

``import wdsmp as wds`` gives the names of webdataset's public API; its
submodules (``wdsmp.gopen``, ``wdsmp.tariterators``, ``wdsmp.writer``, ...) carry
the names of webdataset's submodules of the same name.
"""

from .errors import (
    DecodeError,
    PipeError,
    SampleError,
    ShardError,
    TarFormatError,
    WdsmpError,
    WorkerError,
)
from .filters import pipelinefilter
from .gopen import gopen, gopen_schemes, reader, register_scheme
from .handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from .native import native_available
from .pipeline import DataPipeline
from .shardlists import (
    ResampledShards,
    SimpleShardList,
    non_empty,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from .tariterators import group_by_keys, tarfile_samples, tarfile_to_samples, url_opener
from .utils import PipelineStage, pytorch_worker_info, pytorch_worker_seed
from .writer import ShardWriter, TarWriter

__version__ = "0.1.0"

__all__ = [
    "DataPipeline",
    "DecodeError",
    "PipeError",
    "PipelineStage",
    "ResampledShards",
    "SampleError",
    "ShardError",
    "ShardWriter",
    "SimpleShardList",
    "TarFormatError",
    "TarWriter",
    "WdsmpError",
    "WorkerError",
    "gopen",
    "gopen_schemes",
    "group_by_keys",
    "ignore_and_continue",
    "ignore_and_stop",
    "native_available",
    "non_empty",
    "pipelinefilter",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "reader",
    "register_scheme",
    "reraise_exception",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "url_opener",
    "warn_and_continue",
    "warn_and_stop",
]
