"""The fluid interface: ``WebDataset(urls).shuffle(1000).decode("rgb").to_tuple(...)``.

``WebDataset`` is a ``DataPipeline`` built from constructor arguments (shard
list, splitting, shard shuffling, opening with or without a shard cache, tar
expansion, grouping); every chaining method returns a new pipeline with one
more stage, leaving the one it was called on unchanged. ``WebLoader`` wraps a
``DataLoader`` the same way, so batches can be unbatched, shuffled across
workers and rebatched after the loader. ``Processor`` keeps the older
``wds.Processor(wds.map, f)(dataset)`` form working.
"""

from urllib.parse import urlsplit

from torch.utils.data import DataLoader, IterableDataset

from . import _env, filters, shardlists
from .autodecode import Decoder
from .exact import ExactSamples
from .handlers import reraise_exception
from .pipeline import DataPipeline
from .tariterators import group_by_keys, tar_file_expander, url_opener
from .utils import pytorch_worker_info

__all__ = ["FluidInterface", "FluidWrapper", "Processor", "WebDataset", "WebLoader", "check_empty"]


class FluidInterface:
    """Chaining methods shared by ``WebDataset``, ``WebLoader`` and ``FluidWrapper``.

    Each returns ``self.compose(stage)``: a copy with the stage appended.
    """

    def batched(self, batchsize, collation_fn=filters.default_collation_fn, partial=True):
        """Group items into batches of ``batchsize``, collated by ``collation_fn``."""
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self):
        """Split batches back into items."""
        return self.compose(filters.unbatched())

    def listed(self, batchsize, partial=True):
        """Group items into lists of ``batchsize`` without collating them."""
        return self.compose(filters.batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self):
        """Split lists back into items."""
        return self.compose(filters.unlisted())

    def log_keys(self, logfile=None):
        """Append each sample's key to ``logfile``."""
        return self.compose(filters.log_keys(logfile))

    def shuffle(self, size, **kw):
        """Shuffle items through a buffer of ``size``; a size below 1 is no shuffle."""
        if size < 1:
            return self
        return self.compose(filters.shuffle(size, **kw))

    def map(self, f, handler=reraise_exception):
        """Replace each sample by ``f(sample)``."""
        return self.compose(filters.map(f, handler=handler))

    def decode(self, *args, pre=None, post=None, only=None, partial=False, handler=reraise_exception,
               **kw):
        """Decode fields by extension; strings are image specs ("rgb", "pil", "torchrgb", ...).
        Each decoded sample keeps its source's ``__key__``, as after ``map``."""
        # built once here so that a bad spec or keyword fails now, as in webdataset
        Decoder(list(args), pre=pre, post=post, only=only, partial=partial, **kw)
        return self.compose(filters.decode(*args, pre=pre, post=post, only=only, partial=partial,
                                           handler=handler, keep_key=True, **kw))

    def map_dict(self, handler=reraise_exception, **kw):
        """Apply ``kw[field]`` to each named field."""
        return self.compose(filters.map_dict(handler=handler, **kw))

    def select(self, predicate, **kw):
        """Keep the samples for which ``predicate(sample)`` is true."""
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self, *args, **kw):
        """Turn samples into tuples of the named fields ("jpg;png" takes the first present)."""
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(self, *args, handler=reraise_exception):
        """Apply the i-th function to the i-th element of each tuple (None leaves it)."""
        return self.compose(filters.map_tuple(*args, handler=handler))

    def slice(self, *args):
        """Items ``itertools.islice(items, *args)``."""
        return self.compose(filters.slice(*args))

    def rename(self, **kw):
        """Rename fields: ``rename(new="old1;old2")``."""
        return self.compose(filters.rename(**kw))

    def rsample(self, p=0.5):
        """Keep each item with probability ``p``."""
        return self.compose(filters.rsample(p))

    def rename_keys(self, *args, **kw):
        """Rename fields by glob patterns."""
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self, *args, **kw):
        """Turn samples into tuples of the fields matching the given patterns."""
        return self.compose(filters.extract_keys(*args, **kw))

    def xdecode(self, *args, **kw):
        """Decode fields with decoders chosen by extension pattern."""
        return self.compose(filters.xdecode(*args, **kw))

    def mcached(self):
        """Keep the samples of the first complete pass in memory and replay them afterwards."""
        return self.compose(filters.Cached())

    def lmdb_cached(self, *args, **kw):
        """Keep the samples of the first complete pass in an LMDB database (``filters.LMDBCached``)."""
        return self.compose(filters.LMDBCached(*args, **kw))

    def compose(self, *args, **kw):
        """A copy with stages appended, or ``cls(self, *args)`` for a class (the older form).

        ``dataset.compose(get_patches)`` appends an iterator -> iterator
        function; ``dataset.compose(wds.DBCache, "cache.db", 1000)`` wraps the
        dataset in a new one, which keeps the chaining methods.
        """
        result = super().compose(*args, **kw)
        if isinstance(result, FluidInterface):
            return result
        return FluidWrapper(result)


def check_empty(source):
    """Pass samples through; raise, naming the worker, if none came.

    With fewer shards than DataLoader workers, some workers get no shard at
    all; webdataset then quietly trains on fewer workers' data.
    """
    count = 0
    for sample in source:
        count += 1
        yield sample
    if count == 0:
        rank, world_size, worker, num_workers = pytorch_worker_info()
        raise ValueError(f"no samples in worker {worker} of {num_workers} (node {rank} of "
                         f"{world_size}): with fewer shards than nodes x workers some get none; "
                         f"use more shards, fewer workers, resampled=True, or empty_check=False")


def _is_spec(urls):
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

    def __init__(self, urls, handler=reraise_exception, mode=None, resampled=False, repeat=False,
                 shardshuffle=None, cache_size=-1, cache_dir=None, url_to_name=None,
                 detshuffle=False, nodesplitter=shardlists.single_node_only,
                 workersplitter=shardlists.split_by_worker, select_files=None, rename_files=None,
                 empty_check=True, verbose=False, seed=None, cache_name=None):
        super().__init__()
        resampled = resampled or mode == "resampled"
        if shardshuffle is True:
            shardshuffle = 100
        if isinstance(urls, ExactSamples):  # it reads and groups the samples itself
            self.append(urls)
        elif _is_spec(urls):  # a spec mixes whole sample pipelines, one per collection
            from . import specs
            self.append(specs.spec_dataset(urls, seed=seed or 0, resampled=resampled,
                                           handler=handler))
        else:
            self._add_shard_stages(urls, resampled, shardshuffle, detshuffle, seed,
                                   nodesplitter, workersplitter)
            self.append(self._opener(handler, cache_dir, cache_size, cache_name or url_to_name,
                                     verbose or _env.verbose_cache()))
            self.append(filters.pipelinefilter(tar_file_expander)(
                handler=handler, select_files=select_files, rename_files=rename_files,
                boundaries=True))
            self.append(filters.pipelinefilter(group_by_keys)(handler=handler))
        if empty_check and not isinstance(urls, ExactSamples):  # a worker may rightly have no batch left
            self.append(check_empty)
        if repeat:
            self.repeat()

    def _add_shard_stages(self, urls, resampled, shardshuffle, detshuffle, seed, nodesplitter,
                          workersplitter):
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
    def _opener(handler, cache_dir, cache_size, cache_name, verbose):
        """The stage that opens each shard: straight from its URL, or through the cache."""
        cache_dir = cache_dir if cache_dir is not None else _env.cache_dir()
        if cache_size == -1 and _env.cache_size() is not None:
            cache_size = _env.cache_size()
        if cache_dir is None or cache_size == 0:  # local files give __local_path__, as in webdataset
            return filters.pipelinefilter(url_opener)(handler=handler, local_paths=True)
        from . import cache
        kw = dict(handler=handler, cache_dir=cache_dir, verbose=verbose)
        if cache_size is not None and cache_size > 0:
            kw["cache_size"] = cache_size
        if cache_name is not None:
            kw["cache_name"] = cache_name
        return filters.pipelinefilter(cache.cached_url_opener)(**kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FluidWrapper(FluidInterface, DataPipeline):
    """Any iterable made chainable: ``FluidWrapper(dataset).map(f).batched(8)``."""

    def __init__(self, initial):
        super().__init__()
        self.append(initial)


class WebLoader(FluidInterface, DataPipeline):
    """A ``DataLoader`` (same arguments) with the chaining methods and ``with_epoch``."""

    def __init__(self, *args, **kw):
        super().__init__()
        self.append(DataLoader(*args, **kw))


class Processor:
    """The older stage form: ``Processor(wds.map, f)(dataset)`` is ``dataset`` mapped by ``f``.

    ``stage(*args, **kw)`` must give an iterator -> iterator callable, as the
    curried stages of ``wdsmp.filters`` do.
    """

    def __init__(self, stage, *args, **kw):
        self.stage = stage(*args, **kw)

    def __call__(self, dataset):
        return FluidWrapper(dataset).compose(self.stage)
