"""wdsmp: WebDataset-compatible sharded data loading for PyTorch, with a native core.

``import wdsmp as wds`` gives the names of webdataset's public API; its
submodules (``wdsmp.autodecode``, ``wdsmp.shardlists``, ``wdsmp.writer``, ...)
carry the names of webdataset's submodules of the same name.

The names are imported on first use (``wdsmp.WebDataset`` imports
``wdsmp.compat``, and with it torch), not by ``import wdsmp``: a FastLoader's
worker processes import only the modules they run, so they start without
torch (NOTE [worker processes] in ``wdsmp/fast/pool.py``).
"""

from importlib import import_module
from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any, List as _List

# ``wdsmp.gopen`` is a function and a submodule of that name: imported here, the function is what
# the package holds, as the import system sets the module as the package's attribute only at its
# first import (light: no torch).
from .gopen import gopen

if _TYPE_CHECKING:  # the names' types, for type checkers; at run time __getattr__ imports them on first use
    from . import tenbin, utils
    from .aswebdataset import install_as_webdataset
    from .autodecode import (
        Continue, Decoder, DecodingError, gzfilter, handle_extension, imagehandler, pytorch_weights_only, torch_audio,
        torch_loads, torch_video,
    )
    from .cache import LRUCleanup, cached_tarfile_samples, cached_tarfile_to_samples, cached_url_opener, pipe_cleaner
    from .datasets.cbors import cbors2_to_samples, cbors_samples, cbors_to_samples, msgpack_samples, msgpack_to_samples
    from .compat import FluidInterface, FluidWrapper, Processor, WebDataset, WebLoader
    from .datasets.dbcache import DBCache
    from .errors import (
        DecodeError, MissingFieldError, PipeError, SampleError, SecureModeError, ShardError, ShardNotFoundError,
        TarFormatError, WdsmpError, WorkerError,
    )
    from .epochs.exact import ExactSamples
    from .extradatasets import MockDataset, with_epoch, with_length
    from .fast.loader import Batch, FastLoader
    from .filters import (
        Cached, LMDBCached, associate, batched, decode, detshuffle, extract_keys, getfirst, info, map, map_dict,
        map_tuple, pipelinefilter, rename, rename_keys, rsample, select, shuffle, slice, to_tuple, transform_with,
        unbatched, xdecode,
    )
    from .gopen import gopen_schemes, reader, register_scheme
    from .handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop
    from .mix import RandomMix, RoundRobin
    from .native.core import native_available
    from .pipeline import DataPipeline
    from .shardlists import (
        MultiShardSample, ResampledShards, SimpleShardList, non_empty, resampled, shardspec, single_node_only,
        split_by_node, split_by_worker,
    )
    from .datasets.specs import SpecError, load_spec, spec_dataset
    from .tariterators import group_by_keys, tarfile_samples, tarfile_to_samples, url_opener
    from .utils import PipelineStage, pytorch_worker_info, pytorch_worker_seed, repeatedly
    from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

# Where each public name lives; ``wdsmp.<name>`` imports its module on first use (see __getattr__).
_PUBLIC = {
    "aswebdataset": ("install_as_webdataset",),
    "autodecode": (
        "Continue", "Decoder", "DecodingError", "gzfilter", "handle_extension", "imagehandler",
        "pytorch_weights_only", "torch_audio", "torch_loads", "torch_video",
    ),
    "cache": (
        "LRUCleanup", "cached_tarfile_samples", "cached_tarfile_to_samples", "cached_url_opener",
        "pipe_cleaner",
    ),
    "datasets.cbors": (
        "cbors2_to_samples", "cbors_samples", "cbors_to_samples", "msgpack_samples", "msgpack_to_samples",
    ),
    "compat": ("FluidInterface", "FluidWrapper", "Processor", "WebDataset", "WebLoader"),
    "datasets.dbcache": ("DBCache",),
    "errors": (
        "DecodeError", "MissingFieldError", "PipeError", "SampleError", "SecureModeError", "ShardError",
        "ShardNotFoundError", "TarFormatError", "WdsmpError", "WorkerError",
    ),
    "epochs.exact": ("ExactSamples",),
    "extradatasets": ("MockDataset", "with_epoch", "with_length"),
    "fast.loader": ("Batch", "FastLoader"),
    "filters": (
        "Cached", "LMDBCached", "associate", "batched", "decode", "detshuffle", "extract_keys", "getfirst",
        "info", "map", "map_dict", "map_tuple", "pipelinefilter", "rename", "rename_keys", "rsample",
        "select", "shuffle", "slice", "to_tuple", "transform_with", "unbatched", "xdecode",
    ),
    "gopen": ("gopen_schemes", "reader", "register_scheme"),
    "handlers": (
        "ignore_and_continue", "ignore_and_stop", "reraise_exception", "warn_and_continue", "warn_and_stop",
    ),
    "mix": ("RandomMix", "RoundRobin"),
    "native.core": ("native_available",),
    "pipeline": ("DataPipeline",),
    "shardlists": (
        "MultiShardSample", "ResampledShards", "SimpleShardList", "non_empty", "resampled", "shardspec",
        "single_node_only", "split_by_node", "split_by_worker",
    ),
    "datasets.specs": ("SpecError", "load_spec", "spec_dataset"),
    "tariterators": ("group_by_keys", "tarfile_samples", "tarfile_to_samples", "url_opener"),
    "utils": ("PipelineStage", "pytorch_worker_info", "pytorch_worker_seed", "repeatedly"),
    "writer": ("ShardWriter", "TarWriter", "numpy_dumps", "torch_dumps"),
}

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
    "MissingFieldError",
    "MockDataset",
    "MultiShardSample",
    "PipeError",
    "PipelineStage",
    "Processor",
    "RandomMix",
    "ResampledShards",
    "RoundRobin",
    "SampleError",
    "SecureModeError",
    "ShardError",
    "ShardNotFoundError",
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
    "install_as_webdataset",
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

_ORIGIN = {name: module for module, names in _PUBLIC.items() for name in names}
# The submodules ``dir(wdsmp)`` lists before they are imported, as an eager package would.
_SUBMODULES = {module.partition(".")[0] for module in _PUBLIC} | {"pytorch"}


def __getattr__(name: str) -> _Any:
    """A public name (or a submodule) of wdsmp, imported on first use and kept."""
    module = _ORIGIN.get(name)
    if module is not None:
        value = getattr(import_module(f"{__name__}.{module}"), name)
    elif name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            value = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exn:
            if exn.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> _List[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
