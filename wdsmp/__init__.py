"""wdsmp: WebDataset-compatible sharded data loading for PyTorch, with a native core.

``import wdsmp as wds`` gives the names of webdataset's public API; its
submodules (``wdsmp.autodecode``, ``wdsmp.shardlists``, ``wdsmp.writer``, ...)
carry the names of webdataset's submodules of the same name.
"""

from . import tenbin, utils
from .autodecode import (
    Continue,
    Decoder,
    DecodingError,
    gzfilter,
    handle_extension,
    imagehandler,
    pytorch_weights_only,
    torch_audio,
    torch_loads,
    torch_video,
)
from .cache import (
    LRUCleanup,
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    cached_url_opener,
    pipe_cleaner,
)
from .cbors import cbors2_to_samples, cbors_samples, cbors_to_samples, msgpack_samples, msgpack_to_samples
from .compat import FluidInterface, FluidWrapper, Processor, WebDataset, WebLoader
from .dbcache import DBCache
from .errors import (
    DecodeError,
    PipeError,
    SampleError,
    ShardError,
    TarFormatError,
    WdsmpError,
    WorkerError,
)
from .exact import ExactSamples
from .extradatasets import MockDataset, with_epoch, with_length
from .fast.loader import Batch, FastLoader
from .filters import (
    Cached,
    LMDBCached,
    associate,
    batched,
    decode,
    detshuffle,
    extract_keys,
    getfirst,
    info,
    map,
    map_dict,
    map_tuple,
    pipelinefilter,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    unbatched,
    xdecode,
)
from .gopen import gopen, gopen_schemes, reader, register_scheme
from .handlers import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from .mix import RandomMix, RoundRobin
from .native import native_available
from .pipeline import DataPipeline
from .shardlists import (
    MultiShardSample,
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from .specs import SpecError, load_spec, spec_dataset
from .tariterators import group_by_keys, tarfile_samples, tarfile_to_samples, url_opener
from .utils import PipelineStage, pytorch_worker_info, pytorch_worker_seed, repeatedly
from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Cached",
    "Continue",
    "DBCache",
    "DataPipeline",
    "DecodeError",
    "Decoder",
    "DecodingError",
    "ExactSamples",
    "FastLoader",
    "FluidInterface",
    "FluidWrapper",
    "LMDBCached",
    "LRUCleanup",
    "MockDataset",
    "MultiShardSample",
    "PipeError",
    "PipelineStage",
    "Processor",
    "RandomMix",
    "ResampledShards",
    "RoundRobin",
    "SampleError",
    "ShardError",
    "ShardWriter",
    "SimpleShardList",
    "SpecError",
    "TarFormatError",
    "TarWriter",
    "WdsmpError",
    "WebDataset",
    "WebLoader",
    "WorkerError",
    "associate",
    "batched",
    "cached_tarfile_samples",
    "cached_tarfile_to_samples",
    "cached_url_opener",
    "cbors2_to_samples",
    "cbors_samples",
    "cbors_to_samples",
    "decode",
    "detshuffle",
    "extract_keys",
    "getfirst",
    "gopen",
    "gopen_schemes",
    "group_by_keys",
    "gzfilter",
    "handle_extension",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "info",
    "load_spec",
    "map",
    "map_dict",
    "map_tuple",
    "msgpack_samples",
    "msgpack_to_samples",
    "native_available",
    "non_empty",
    "numpy_dumps",
    "pipe_cleaner",
    "pipelinefilter",
    "pytorch_weights_only",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "reader",
    "register_scheme",
    "rename",
    "rename_keys",
    "repeatedly",
    "reraise_exception",
    "resampled",
    "rsample",
    "select",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "spec_dataset",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "tenbin",
    "to_tuple",
    "torch_audio",
    "torch_dumps",
    "torch_loads",
    "torch_video",
    "transform_with",
    "unbatched",
    "url_opener",
    "utils",
    "warn_and_continue",
    "warn_and_stop",
    "with_epoch",
    "with_length",
    "xdecode",
]
