"""The fluid interface: ``WebDataset(urls).shuffle(1000).decode("rgb").to_tuple(...)``.

``WebDataset`` is a ``DataPipeline`` built from constructor arguments (shard
list, splitting, shard shuffling, opening with or without a shard cache, tar
expansion, grouping); every chaining method returns a new pipeline with one
more stage, leaving the one it was called on unchanged. ``WebLoader`` wraps a
``DataLoader`` the same way, so batches can be unbatched, shuffled across
workers and rebatched after the loader. ``Processor`` keeps the older
``wds.Processor(wds.map, f)(dataset)`` form working.
"""

import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, TypeVar, Union, cast
from urllib.parse import urlsplit

from torch.utils.data import DataLoader, IterableDataset

from . import filters, shardlists
from ._internal import env
from .autodecode import Decoder
from .epochs.exact import ExactSamples
from .handlers import _Handler, reraise_exception
from .pipeline import DataPipeline
from .tariterators import group_by_keys, tar_file_expander, url_opener
from . import utils
from .utils import PipelineStage

__all__ = ["FluidInterface", "FluidWrapper", "Processor", "WebDataset", "WebLoader", "check_empty"]

_T = TypeVar("_T")
_F = TypeVar("_F", bound="FluidInterface")  # what a chaining method returns: a copy of the same class
# A Decoder's handler: ``handler(".ext", data)`` -> the decoded value, or None for "not mine".
_DecoderHandler = Callable[[str, Any], Any]


class FluidInterface:
    """Chaining methods shared by ``WebDataset``, ``WebLoader`` and ``FluidWrapper``.

    Each returns ``self.compose(stage)``: a copy with the stage appended.
    """

    def batched(self: _F, batchsize: int,
                collation_fn: Optional[Callable[[List[Any]], Any]] = filters.default_collation_fn,
                partial: bool = True) -> _F:
        """Group items into batches of ``batchsize``, collated by ``collation_fn``."""
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self: _F) -> _F:
        """Split batches back into items."""
        return self.compose(filters.unbatched())

    def listed(self: _F, batchsize: int, partial: bool = True) -> _F:
        """Group items into lists of ``batchsize`` without collating them."""
        return self.compose(filters.batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self: _F) -> _F:
        """Split lists back into items."""
        return self.compose(filters.unlisted())

    def log_keys(self: _F, logfile: Optional[Union[str, "os.PathLike[str]"]] = None) -> _F:
        """Append each sample's key to ``logfile``."""
        return self.compose(filters.log_keys(logfile))

    def shuffle(self: _F, size: int, **kw: Any) -> _F:
        """Shuffle items through a buffer of ``size``; a size below 1 is no shuffle."""
        if size < 1:
            return self
        return self.compose(filters.shuffle(size, **kw))

    def map(self: _F, f: Callable[[Any], Any], handler: _Handler = reraise_exception) -> _F:
        """Replace each sample by ``f(sample)``."""
        return self.compose(filters.map(f, handler=handler))

    def decode(self: _F, *args: Union[str, _DecoderHandler], pre: Optional[Iterable[_DecoderHandler]] = None,
               post: Optional[Iterable[_DecoderHandler]] = None, only: Optional[Union[str, Iterable[str]]] = None,
               partial: bool = False, handler: _Handler = reraise_exception, **kw: Any) -> _F:
        """Decode fields by extension; strings are image specs ("rgb", "pil", "torchrgb", ...).
        Each decoded sample keeps its source's ``__key__``, as after ``map``."""
        # built once here so that a bad spec or keyword fails now, as in webdataset
        Decoder(list(args), pre=pre, post=post, only=only, partial=partial, **kw)
        return self.compose(filters.decode(*args, pre=pre, post=post, only=only, partial=partial,
                                           handler=handler, keep_key=True, **kw))

    def map_dict(self: _F, handler: _Handler = reraise_exception, **kw: Callable[[Any], Any]) -> _F:
        """Apply ``kw[field]`` to each named field."""
        return self.compose(filters.map_dict(handler=handler, **kw))

    def select(self: _F, predicate: Callable[[Any], Any], **kw: Any) -> _F:
        """Keep the samples for which ``predicate(sample)`` is true."""
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self: _F, *args: Union[str, Sequence[str]], **kw: Any) -> _F:
        """Turn samples into tuples of the named fields ("jpg;png" takes the first present)."""
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(self: _F, *args: Optional[Callable[[Any], Any]], handler: _Handler = reraise_exception) -> _F:
        """Apply the i-th function to the i-th element of each tuple (None leaves it)."""
        return self.compose(filters.map_tuple(*args, handler=handler))

    def slice(self: _F, *args: Optional[int]) -> _F:
        """Items ``itertools.islice(items, *args)``."""
        return self.compose(filters.slice(*args))

    def rename(self: _F, **kw: Any) -> _F:
        """Rename fields: ``rename(new="old1;old2")``."""
        return self.compose(filters.rename(**kw))

    def rsample(self: _F, p: float = 0.5) -> _F:
        """Keep each item with probability ``p``."""
        return self.compose(filters.rsample(p))

    def rename_keys(self: _F, *args: Sequence[str], **kw: Any) -> _F:
        """Rename fields by glob patterns."""
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self: _F, *args: Union[str, Sequence[str]], **kw: Any) -> _F:
        """Turn samples into tuples of the fields matching the given patterns."""
        return self.compose(filters.extract_keys(*args, **kw))

    def xdecode(self: _F, *args: Sequence[Any], **kw: Any) -> _F:
        """Decode fields with decoders chosen by extension pattern."""
        return self.compose(filters.xdecode(*args, **kw))

    def mcached(self: _F) -> _F:
        """Keep the samples of the first complete pass in memory and replay them afterwards."""
        return self.compose(filters.Cached())

    def lmdb_cached(self: _F, *args: Any, **kw: Any) -> _F:
        """Keep the samples of the first complete pass in an LMDB database (``filters.LMDBCached``)."""
        return self.compose(filters.LMDBCached(*args, **kw))

    def compose(self, *args: Any, **kw: Any) -> Any:
        """A copy with stages appended, or ``cls(self, *args)`` for a class (the older form).

        ``dataset.compose(get_patches)`` appends an iterator -> iterator
        function; ``dataset.compose(wds.DBCache, "cache.db", 1000)`` wraps the
        dataset in a new one, which keeps the chaining methods.
        """
        result = cast(Any, super()).compose(*args, **kw)  # a mixin: DataPipeline.compose
        if isinstance(result, FluidInterface):
            return result
        return FluidWrapper(result)


def check_empty(source: Iterable[_T]) -> Iterator[_T]:
    """Pass samples through; raise, naming the worker, if none came.

    With fewer shards than DataLoader workers, some workers get no shard at
    all; webdataset then quietly trains on fewer workers' data.
    """
    count = 0
    for sample in source:
        count += 1
        yield sample
    if count == 0:
        rank, world_size, worker, num_workers = utils.pytorch_worker_info()
        raise ValueError(f"no samples in worker {worker} of {num_workers} (node {rank} of "
                         f"{world_size}): with fewer shards than nodes x workers some get none; "
                         f"use more shards, fewer workers, resampled=True, or empty_check=False")


def _is_spec(urls: object) -> bool:
    """A dataset spec: a dict, or a YAML/JSON document's path or URL (a URL's query string,
    as a presigned URL has, not counted)."""
    if isinstance(urls, dict):
        return True
    if not isinstance(urls, str):
        return False
    path = urlsplit(urls).path if "://" in urls else urls
    return path.endswith((".yaml", ".yml", ".json"))


class WebDataset(FluidInterface, DataPipeline):
    """A dataset of samples from tar shards, configured by arguments, chained fluidly.

    ``urls`` is a shard spec (brace patterns, ``::`` lists, globs), a list of
    URLs, an IterableDataset of ``{"url": ...}`` items, a YAML/JSON dataset
    spec, or an ``ExactSamples`` source for exact, resumable epochs (which then
    does the splitting, shuffling, opening and caching: the arguments for those
    here do not apply). Shards are read in order unless ``shardshuffle`` (a buffer size, or
    True for 100) shuffles them, seeded by ``seed`` (and by ``set_epoch``
    with ``detshuffle=True``). ``resampled=True`` draws shards with
    replacement forever instead (set an epoch with ``with_epoch``).
    ``cache_dir`` (default ``WDS_CACHE``) keeps a local copy of every remote
    shard, filled while the first pass streams it, within ``cache_size``
    bytes (default ``WDS_CACHE_SIZE``, else no cap). ``empty_check`` makes a worker that got no sample
    an error rather than a silently smaller epoch.
    """

    def __init__(self, urls: Union[str, "os.PathLike[str]", Dict[str, Any], Iterable[Any]],
                 handler: _Handler = reraise_exception, mode: Optional[str] = None, resampled: bool = False,
                 repeat: bool = False, shardshuffle: Optional[Union[bool, int]] = None,
                 cache_size: Optional[float] = -1, cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 url_to_name: Optional[Callable[[str], str]] = None, detshuffle: bool = False,
                 nodesplitter: Optional[Union[Callable[..., Any], PipelineStage]] = shardlists.single_node_only,
                 workersplitter: Optional[Union[Callable[..., Any], PipelineStage]] = shardlists.split_by_worker,
                 select_files: Optional[Callable[[str], Any]] = None,
                 rename_files: Optional[Callable[[str], str]] = None, empty_check: bool = True,
                 verbose: bool = False, seed: Any = None,
                 cache_name: Optional[Callable[[str], str]] = None) -> None:
        super().__init__()
        resampled = resampled or mode == "resampled"
        if shardshuffle is True:
            shardshuffle = 100
        if isinstance(urls, ExactSamples):  # it reads and groups the samples itself
            self.append(urls)
        elif _is_spec(urls):  # a spec mixes whole sample pipelines, one per collection
            from .datasets import specs
            spec = cast(Union[str, Dict[str, Any]], urls)  # what _is_spec said yes to
            self.append(specs.spec_dataset(spec, seed=seed or 0, resampled=resampled, handler=handler))
        else:
            self._add_shard_stages(urls, resampled, shardshuffle, detshuffle, seed,
                                   nodesplitter, workersplitter)
            self.append(self._opener(handler, cache_dir, cache_size, cache_name or url_to_name,
                                     verbose or env.verbose_cache()))
            self.append(filters.pipelinefilter(tar_file_expander)(
                handler=handler, select_files=select_files, rename_files=rename_files,
                boundaries=True))
            self.append(filters.pipelinefilter(group_by_keys)(handler=handler))
        if empty_check and not isinstance(urls, ExactSamples):  # a worker may rightly have no batch left
            self.append(check_empty)
        if repeat:
            self.repeat()

    def _add_shard_stages(self, urls: Union[str, "os.PathLike[str]", Dict[str, Any], Iterable[Any]], resampled: bool,
                          shardshuffle: Optional[Union[bool, int]], detshuffle: bool, seed: Any,
                          nodesplitter: Optional[Union[Callable[..., Any], PipelineStage]],
                          workersplitter: Optional[Union[Callable[..., Any], PipelineStage]]) -> None:
        """The shard URLs this process reads: listed or resampled, split, shuffled."""
        if isinstance(urls, IterableDataset):
            self.append(urls)
        elif resampled:  # every worker draws its own shards: no splitting
            self.append(shardlists.ResampledShards(urls, seed=seed or 0,
                                                   deterministic=seed is not None))
            return
        else:
            self.append(shardlists.SimpleShardList(urls))
        if nodesplitter is not None:
            self.append(nodesplitter)
        if workersplitter is not None:
            self.append(workersplitter)
        if shardshuffle:
            shuffler = filters.detshuffle if detshuffle else filters.shuffle
            self.append(shuffler(shardshuffle, seed=seed))

    @staticmethod
    def _opener(handler: _Handler, cache_dir: Optional[Union[str, "os.PathLike[str]"]], cache_size: Optional[float],
                cache_name: Optional[Callable[[str], str]], verbose: bool) -> filters.Curried:
        """The stage that opens each shard: straight from its URL, or through the cache."""
        cache_dir = cache_dir if cache_dir is not None else env.cache_dir()
        if cache_size == -1 and env.cache_size() is not None:
            cache_size = env.cache_size()
        if cache_dir is None or cache_size == 0:  # local files give __local_path__, as in webdataset
            return filters.pipelinefilter(url_opener)(handler=handler, local_paths=True)
        from . import cache
        kw: Dict[str, Any] = dict(handler=handler, cache_dir=cache_dir, verbose=verbose)
        if cache_size is not None and cache_size > 0:
            kw["cache_size"] = cache_size
        if cache_name is not None:
            kw["cache_name"] = cache_name
        return filters.pipelinefilter(cache.cached_url_opener)(**kw)

    def __enter__(self: _F) -> _F:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FluidWrapper(FluidInterface, DataPipeline):
    """Any iterable made chainable: ``FluidWrapper(dataset).map(f).batched(8)``."""

    def __init__(self, initial: Any) -> None:
        super().__init__()
        self.append(initial)


class WebLoader(FluidInterface, DataPipeline):
    """A ``DataLoader`` (same arguments) with the chaining methods and ``with_epoch``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__()
        self.append(DataLoader(*args, **kw))


class Processor:
    """The older stage form: ``Processor(wds.map, f)(dataset)`` is ``dataset`` mapped by ``f``.

    ``stage(*args, **kw)`` must give an iterator -> iterator callable, as the
    curried stages of ``wdsmp.filters`` do.
    """

    def __init__(self, stage: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.stage = stage(*args, **kw)

    def __call__(self, dataset: Any) -> "FluidWrapper":
        return FluidWrapper(dataset).compose(self.stage)
