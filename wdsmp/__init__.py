"""wdsmp: WebDataset-compatible sharded data loading for PyTorch, with a fast native path.

``import wdsmp as wds`` gives the names of webdataset's public API.
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
from .handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)

__version__ = "0.1.0"

__all__ = [
    "DecodeError",
    "PipeError",
    "SampleError",
    "ShardError",
    "TarFormatError",
    "WdsmpError",
    "WorkerError",
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]
