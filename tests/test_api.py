"""wdsmp carries webdataset 1.0.2's public names, module by module and at the top level.

Code written against ``webdataset.<module>`` must work with ``wdsmp.<module>``
in its place, so every public name of webdataset 1.0.2's modules must exist
here too, and be in ``__all__`` (``from webdataset.utils import *`` imports all
public names, as webdataset defines no ``__all__``).

The lists are facts about webdataset 1.0.2, recorded once from its source
(module-level functions, classes and assignments not starting with ``_``;
for the package, the names its ``__init__.py`` imports), so the test needs no
copy of webdataset to run.
"""

import importlib

import pytest

import wdsmp

WEBDATASET_1_0_2_NAMES = {
    "autodecode": [
        "Continue", "Decoder", "DecodingError", "IMAGE_EXTENSIONS", "ImageHandler", "basichandlers",
        "call_extension_handler", "cbor_loads", "decoders", "default_decoder", "default_post_handlers",
        "default_pre_handlers", "gzfilter", "handle_extension", "imagehandler", "imagespecs",
        "msgpack_loads", "npy_loads", "npz_loads", "pytorch_weights_only", "tenbin_loads",
        "torch_audio", "torch_loads", "torch_video", "unpickle_loads",
    ],
    "cache": [
        "FileCache", "LRUCleanup", "StreamingOpen", "check_tar_format", "default_cache_dir",
        "default_cache_size", "download", "get_filetype", "islocal", "magic_filetype", "pipe_cleaner",
        "url_to_cache_name", "verbose_cache",
    ],
    "compat": [
        "FluidInterface", "FluidWrapper", "WebDataset", "WebLoader", "check_empty",
    ],
    "filters": [
        "Cached", "FilterFunction", "LMDBCached", "RestCurried", "associate", "batched",
        "combine_values", "compose", "compose2", "decode", "decode_bin", "decode_pickle", "decode_text",
        "default_collation_fn", "default_decoders", "detshuffle", "dict2tuple", "extract_keys",
        "find_decoder", "getfirst", "identity", "info", "log_keys", "map", "map_dict", "map_tuple",
        "parse_field_spec", "pick", "pipeline", "pipelinefilter", "rename", "rename_keys",
        "reraise_exception", "rsample", "select", "shuffle", "slice", "to_tuple", "transform_with",
        "tuple2dict", "unbatched", "unlisted", "xdecode",
    ],
    "gopen": [
        "Pipe", "gopen", "gopen_ais", "gopen_curl", "gopen_error", "gopen_file", "gopen_gsutil",
        "gopen_hf", "gopen_htgs", "gopen_pipe", "gopen_schemes", "info", "reader", "rewrite_url",
        "set_options",
    ],
    "handlers": [
        "ignore_and_continue", "ignore_and_stop", "reraise_exception", "warn_and_continue",
        "warn_and_stop",
    ],
    "mix": [
        "RandomMix", "RoundRobin", "random_samples", "round_robin_longest", "round_robin_shortest",
    ],
    "pipeline": [
        "DataPipeline", "add_length_method",
    ],
    "shardlists": [
        "DirectoryShardList", "MSSource", "MultiShardSample", "ResampledShardList", "ResampledShards",
        "SimpleShardList", "check_pid_is_running", "default_rng", "envlookup", "envsubst", "expand",
        "expand_source", "expand_urls", "get_pid_from_filename", "non_empty", "resampled", "resampled_",
        "shardspec", "single_node_only", "split_by_node", "split_by_worker", "without_last_extension",
    ],
    "tariterators": [
        "base_plus_ext", "group_by_keys", "meta_prefix", "meta_suffix", "shardlist",
        "tar_file_expander", "tar_file_iterator", "tarfile_samples", "tarfile_to_samples", "trace",
        "url_opener", "valid_sample",
    ],
    "tenbin": [
        "bytedata", "bytelen", "check_acceptable_input_type", "check_infos", "decode_buffer",
        "decode_chunks", "decode_header", "decode_list", "encode_buffer", "encode_chunks",
        "encode_header", "encode_list", "load", "long_to_short", "magic", "magic_bytes", "magic_str",
        "read", "read_chunk", "roundup", "save", "short_to_long", "str64", "unstr64", "write",
        "write_chunk",
    ],
    "utils": [
        "ObsoleteException", "PipelineStage", "compute_sample_weights", "deprecated",
        "enforce_security", "fnmatch_with_braces", "glob_with_braces", "guess_batchsize", "identity",
        "is_iterable", "lookup_sym", "make_seed", "obsolete", "pytorch_worker_info",
        "pytorch_worker_seed", "repeatedly", "repeatedly0", "safe_eval",
    ],
    "writer": [
        "ShardWriter", "TarWriter", "add_handlers", "bytestr", "cbor_dumps", "default_handlers",
        "encode_based_on_extension", "encode_based_on_extension1", "imageencoder", "make_encoder",
        "make_handlers", "mp_dumps", "numpy_dumps", "numpy_npz_dumps", "tenbin_dumps", "torch_dumps",
    ],
    "extradatasets": [
        "MockDataset", "repeatedly", "with_epoch", "with_length",
    ],
}

WEBDATASET_1_0_2_TOP_LEVEL = [
    "Cached", "Continue", "DataPipeline", "Decoder", "DecodingError", "FluidInterface",
    "FluidWrapper", "LMDBCached", "LRUCleanup", "MockDataset", "MultiShardSample", "PipelineStage",
    "RandomMix", "ResampledShards", "RoundRobin", "ShardWriter", "SimpleShardList", "TarWriter",
    "WebDataset", "WebLoader", "associate", "batched", "decode", "detshuffle", "extract_keys",
    "getfirst", "gopen", "gopen_schemes", "gzfilter", "handle_extension", "ignore_and_continue",
    "ignore_and_stop", "imagehandler", "info", "map", "map_dict", "map_tuple", "non_empty",
    "numpy_dumps", "pipe_cleaner", "pipelinefilter", "pytorch_weights_only", "rename",
    "rename_keys", "repeatedly", "reraise_exception", "resampled", "rsample", "select", "shardspec",
    "shuffle", "single_node_only", "slice", "split_by_node", "split_by_worker", "tarfile_samples",
    "tarfile_to_samples", "tenbin", "to_tuple", "torch_audio", "torch_dumps", "torch_loads",
    "torch_video", "transform_with", "unbatched", "utils", "warn_and_continue", "warn_and_stop",
    "with_epoch", "with_length", "xdecode",
]


@pytest.mark.parametrize("module", sorted(WEBDATASET_1_0_2_NAMES))
def test_module_has_webdataset_names(module):
    mod = importlib.import_module(f"wdsmp.{module}")
    missing = [name for name in WEBDATASET_1_0_2_NAMES[module] if not hasattr(mod, name)]
    assert missing == [], f"wdsmp.{module} lacks webdataset 1.0.2's {missing}"


@pytest.mark.parametrize("module", sorted(WEBDATASET_1_0_2_NAMES))
def test_module_all_lists_webdataset_names(module):
    mod = importlib.import_module(f"wdsmp.{module}")
    exported = set(getattr(mod, "__all__", ()))
    unlisted = [name for name in WEBDATASET_1_0_2_NAMES[module] if name not in exported]
    assert unlisted == [], f"wdsmp.{module}.__all__ lacks {unlisted}"
    assert all(isinstance(name, str) for name in exported)


def test_package_has_webdataset_top_level_names():
    missing = [name for name in WEBDATASET_1_0_2_TOP_LEVEL if not hasattr(wdsmp, name)]
    assert missing == [], f"wdsmp lacks webdataset 1.0.2's top-level {missing}"
