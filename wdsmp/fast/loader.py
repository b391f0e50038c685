"""FastLoader: decoded, cropped, batched images from WebDataset shards, made by worker processes
straight into shared memory.

The front end of the fast path (docs/fastloader.md): it checks its arguments
(``options.py``), plans each epoch (``wdsmp/epochs/plan.py``), creates the ring
(``ring.py``), runs the workers (``worker.py`` in a ``pool.py``, held with the
ring in ``resources.py``), and hands out each slot as tensors without copying
(``delivery.py``, ``batches.py``; on a GPU ``transfer.py``).

NOTE [batch lifetime]
    By default a batch's tensors are views of its ring slot: no copy. The
    slot goes back to its worker at the next ``next()`` on the same
    iterator (or when the epoch ends or the loader closes), and the worker
    then writes a new batch into it. Keep a batch past that point with
    ``copy=True`` (every batch is copied out of the ring, and its slot
    freed at once) or ``tensor.clone()``. The memory itself stays mapped
    while any tensor views it, so a kept view never crashes: it only shows
    newer pixels.

NOTE [sample order]
    How an epoch's samples are ordered decides what a batch holds. Shards are
    often written in label order (class by class, as ``ImageFolder`` lists
    the files); read shard by shard through a shuffle buffer, a batch then
    holds a few labels, and training suffers. So, with ``order="auto"`` (the
    default) and ``shuffle`` on, an epoch whose shards can all be read at any
    offset (local uncompressed files without link members) is a uniform
    permutation of all its samples (``epochplan.SampleSequence``): each
    worker reads its stretch of it, one ``pread`` per sample at the offsets
    the header walk found (``wdsmp/epochs/spans.py``, kept with the counts), and the
    shuffle buffer is off unless asked for. Exact epochs, equal batches on
    every rank, ``len()`` and resuming are as in shard order. Otherwise
    (remote shards, gzip, ``resampled``, ``exact=False``) the epoch is read
    shard by shard, and the loader watches the first batches' labels: far
    less varied than a uniform draw, it warns once (``variety.py``).
    ``order="global"`` insists (and fetches remote shards into ``cache_dir``
    first); ``order="shards"`` reads shard by shard, as webdataset does.

NOTE [elastic resume]
    A long job may come back on fewer ranks (a node lost) or more. Every rank
    of an exact epoch hands out the same number of batches, round robin over
    its streams, so one rank's ``state_dict`` says what every rank delivered:
    ``load_state_dict`` on a loader with another ``world_size`` deals the
    samples no rank delivered to the new ranks, each at most once, the same
    number of full batches on each (``wdsmp.epochs.plan``, Elastic); the next epochs
    are planned for the new ranks as usual. Where that cannot be known, it
    refuses and says why: epochs of whole shards, a shuffle buffer (it mixes
    delivered and undelivered samples: the global order needs none), stages
    or a handler that dropped samples (the ranks then stand at different
    places), or a state itself resumed elastically (resume it on its ranks).

NOTE [shutdown order]
    A loader lives while the script or any of its iterators (or ``.cuda()``
    iterators) holds it, as DataLoader does: ``for images, labels in
    FastLoader(urls, batch_size=256):`` keeps it for the loop. ``close()``
    (also run by ``with``, by garbage collection once the last reference
    goes, and at interpreter exit, through one ``weakref.finalize``): send
    ``Stop`` to every worker; close the pipes from them (a worker blocked
    sending gets a broken pipe); join them for a few seconds, then
    terminate, then kill; unregister pinned memory; then unlink the ring,
    exactly once (NOTE [ring ownership]). Workers ignore SIGINT (Ctrl-C is
    the script's, which then closes the loader) and exit by themselves when
    the loader's process is gone (``liveness.exit_with_parent``), and a new
    FastLoader unlinks rings whose owner died without closing.
"""

import warnings
import weakref
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Type, Union

from ..epochs.plan import (MAX_RANKS, EpochPlan, EpochPlanner, PlanPosition, round_robin_share, streams_in,
                           streams_of_workers)
from ..epochs.spans import SampleFiles, locate_samples
from ..epochs.counts import known_counts
from .._internal.validation import count as count_of, is_int
from .._internal.versions import check_version, versioned
from . import pool as _pool
from .batches import Batch, SlotTensors
from .bottleneck import shard_source
from .delivery import Delivery, EpochIterator
from .layout import ArraySpec, BatchLayout
from .options import IMAGE_KEYS, LoaderOptions
from .resources import LoaderResources
from .ring import DEFAULT_PREFIX, Ring, cleanup_stale
from .stats import LoaderStats
from .variety import LabelVariety
from .worker import IMAGES, KEYS, LABELS, WorkerConfig

if TYPE_CHECKING:
    from .transfer import CudaLoader

__all__ = ["IMAGE_KEYS", "Batch", "FastLoader"]


class FastLoader:
    """Batches of decoded, cropped images (and labels) from WebDataset shards, made by a pool of
    worker processes in shared memory; a replacement for DataLoader over a WebDataset.

    ::

        for images, labels in FastLoader("shards/train-{000000..000146}.tar", batch_size=256):
            ...                                    # images: uint8 (256, 224, 224, 3), labels: int64 (256,)
        for images, labels in FastLoader(urls, batch_size=256).cuda(mean=(123.7, 116.3, 103.5),
                                                                    std=(58.4, 57.1, 57.4)):
            ...                                    # on the GPU, normalised, float32 NCHW

    The workers start as the loader is made; each ``iter()`` runs the next epoch. Batches view
    shared memory until the next ``next()`` (NOTE [batch lifetime]); ``close()``, ``with`` or
    the last reference going stop the workers and free it. docs/fastloader.md tells what the
    loader does with each setting: exact epochs, the sample order, resuming, failures, memory
    and where the time goes.

    Args:
        urls: A shard spec (``"train-{0000..0146}.tar"``, any gopen URL), a list of URLs or of
            ``(url, sample_count)`` pairs, or the path or URL of a shard index (``.json``).
        batch_size: Images per batch.
        index: A shard index whose counts are added to the URLs given.
        **settings: Any setting of :class:`~wdsmp.fast.options.LoaderOptions`, by name
            (``num_workers``, ``image_size``, ``train``, ``label``, ``order``, ...).
    """

    def __init__(self, urls: Union[str, Sequence[Union[str, Tuple[str, Optional[int]]]]], batch_size: int = 256, *,
                 index: Optional[str] = None, **settings: Any) -> None:
        if _pool.starting_a_worker():  # NOTE [worker processes] in pool.py
            raise RuntimeError("a FastLoader was made while a worker process was starting and importing the main "
                               "script: a function given to the loader is defined in that script, so workers "
                               "import it; put the script's code under if __name__ == '__main__':, or define "
                               "the function in a module of its own")
        self.options = options = LoaderOptions.of(batch_size=batch_size, **settings)
        layout, extra = _layout(options)
        # Unknown counts leave ranks unequal (a resampled epoch is a number of batches; one rank is alone).
        required = options.exact and not options.resampled and options.world_size > 1
        self.shards = known_counts(
            urls, index, cache_dir=options.cache_dir, handler=options.handler,
            required_by=f"FastLoader on {options.world_size} ranks" if required else None,
            otherwise="pass exact=False for epochs of whole shards per rank (which may then hand out "
                      "different numbers of batches)")
        files = self._sample_files(settings.get("shuffle_buffer"))
        if files is not None:
            self.shards = tuple((url, count) for (url, _), count in zip(self.shards, files.counts))
        self._planner = EpochPlanner(
            tuple(self.shards), options.batch_size, seed=options.seed, rank=options.rank,
            world_size=options.world_size, num_streams=options.num_workers, policy=options.policy,
            shuffle=options.shuffle, resampled=options.resampled, epoch_batches=options.epoch_batches,
            exact=options.exact, order=self.order)
        self.plan(0)  # bad plan arguments (rank, policy, too few samples) fail here too
        cleanup_stale(DEFAULT_PREFIX)
        ring = Ring.create(layout, options.num_workers * options.prefetch)
        self._resources = LoaderResources(ring)
        self._finalizer = weakref.finalize(self, self._resources.close)  # what fails from here on, frees it
        self._config = WorkerConfig(
            ring=ring.name, layout=layout, image_keys=options.image_keys, label=options.label, fields=extra,
            keys=options.keys, stages=options.stages, handler=options.handler, decode=options.decode,
            shuffle_buffer=self.options.shuffle_buffer, planner=self._planner, cache_dir=options.cache_dir,
            paths=() if files is None else files.paths, spans=() if files is None else files.spans,
            files=() if files is None else files.files)
        # Whether spawned workers must import the script (NOTE [worker processes] in pool.py).
        self._main = options.start_method != "fork" and _pool.refers_to_main(self._config)
        if self._main and _pool.main_module() is None:
            raise ValueError("a function given to the loader is defined in an interactive session (or python -c), "
                             "which worker processes cannot import: define it in a module, or pass "
                             "start_method='fork'")
        self._slots = SlotTensors(ring, copy=options.copy, channels_first=options.channels_first)
        # Batches of few labels, where the loader cannot shuffle every sample (NOTE [sample order]).
        watch = self.order == "shards" and options.shuffle and options.label is not None
        self._variety = LabelVariety(self._order_why) if watch else None
        self._stats = LoaderStats(report_every=options.progress, num_workers=options.num_workers,
                                  source=shard_source([url for url, _ in self.shards]), cache_dir=options.cache_dir)
        self.epoch = 0
        self._resume: Optional[PlanPosition] = None  # a loaded PlanPosition, for the next iter()
        # The samples each stream had read behind it (the loaded state's worker_read).
        self._resume_read: Optional[List[Optional[int]]] = None
        self._delivery: Optional[Delivery] = None  # the current epoch's
        # Started now, so that their start overlaps what the script does before its first iter().
        self._resources.new_workers(self._config, options.num_workers, options.prefetch, options.start_method,
                                    self._main)

    def _sample_files(self, shuffle_buffer: Optional[int]) -> Optional[SampleFiles]:
        """Resolve ``order`` (NOTE [sample order]): the ``SampleFiles`` to read in global order, or
        None for shard order. In global order the shuffle buffer is off unless one was asked for
        (``shuffle_buffer``, the argument as given), and the counts are the walk's."""
        options = self.options
        self.order, self._order_why = "shards", None
        if options.order == "shards" or not options.shuffle or options.resampled or not options.exact:
            return None
        urls = [url for url, _ in self.shards]
        files, why = locate_samples(urls, options.cache_dir, options.handler, fetch=options.order == "global")
        if files is None:
            if options.order == "global":
                raise ValueError(f"order='global' reads each sample at its offset, and a shard cannot be read "
                                 f"so: {why}. Use order='shards' (or the default, order='auto')")
            self._order_why = why
            return None
        stale = [(url, given, count) for (url, given), count in zip(self.shards, files.counts)
                 if given is not None and given != count]
        if stale:
            url, given, count = stale[0]
            warnings.warn(f"stale sample count: shard {url!r} has {count} samples, not the {given} given for it "
                          f"({len(stale)} shard{'s' * (len(stale) != 1)} so); epochs use the counts the shards "
                          f"have. Rebuild the index (wdsmp index)", stacklevel=3)
        self.order = "global"
        if shuffle_buffer is None:
            self.options = replace(options, shuffle_buffer=0)
        return files

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    @property
    def num_workers(self) -> int:
        return self.options.num_workers

    # -- epochs -------------------------------------------------------------------------

    def plan(self, position: Union[int, PlanPosition, None] = None) -> EpochPlan:
        """This rank's ``EpochPlan`` of epoch ``position`` (default: the next one; or a
        ``PlanPosition``): what each stream reads (see ``wdsmp/epochs/plan.py``). A position counts the
        streams the epoch started with; a new epoch has one per worker."""
        return self._planner.plan(self.epoch if position is None else position)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (as DistributedSampler.set_epoch)."""
        if not is_int(epoch, 0):
            raise ValueError(f"epoch must be an int >= 0, not {epoch!r}")
        self.epoch = epoch
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # a loaded state of this very epoch stays in force

    def __len__(self) -> int:
        """Batches per epoch on this rank (of a loaded state's epoch, all of them: on another number
        of ranks, those of its rest); TypeError when sample counts are unknown."""
        resume = self._resume
        position = resume if resume is not None and resume.epoch == self.epoch else PlanPosition(self.epoch)
        batches = self.plan(position).batches_per_rank
        if batches is None:
            raise TypeError("len() of a FastLoader needs exact epochs: every shard's sample count (local shards "
                            "count themselves; pass (url, count) pairs or a shard index, index=..., for remote "
                            "ones) and exact=True")
        return batches

    def __iter__(self) -> EpochIterator:
        """Start the next epoch: the workers get their tasks (unless they went ahead with this
        very epoch, NOTE [next epoch ahead] in ``delivery.py``); the iterator delivers the
        batches, and holds this loader while it lives."""
        self._resources.check_open()
        if self._delivery is not None:
            self._delivery.leave()
        before = self._resume, self.epoch  # what a failed start leaves for the next iter()
        position = self._resume or PlanPosition(self.epoch)
        resumed_read = self._resume_read if self._resume is not None else None
        self._resume = None
        plan = self.plan(position)
        self.epoch = plan.epoch + 1
        if position.batches_done == 0:  # announced once, when the epoch starts
            self._stats.add_plan(plan.dropped, plan.repeated, plan.mode == "shards")
            notice = plan.notice()
            if notice is not None:
                warnings.warn(notice, stacklevel=2)
        options, workers = self.options, self._resources.workers
        streams = streams_of_workers(plan.num_streams, options.num_workers)
        try:
            if workers is None or workers.broken or (workers.ahead is not None and workers.ahead != plan):
                workers = self._resources.new_workers(self._config, options.num_workers, options.prefetch,
                                                      options.start_method, self._main)
            if workers.ahead is None:
                workers.start_epoch(position, streams)
            workers.ahead = None
        except BaseException:  # the next iter() runs this very epoch (or loaded state) afresh
            if workers is not None:
                workers.shutdown()
            self._resume, self.epoch = before
            raise
        self._stats.start()
        read = resumed_read if position.batches_done else None
        self._delivery = Delivery(plan, workers, streams, resources=self._resources, slots=self._slots,
                                  stats=self._stats, timeout=options.timeout, stall_timeout=options.stall_timeout,
                                  ahead=weakref.WeakMethod(self._send_ahead), variety=self._variety, read=read)
        return EpochIterator(self, self._delivery)

    def _send_ahead(self, current: int) -> None:
        """Send the workers the next epoch's tasks once every stream of epoch ``current`` has ended,
        unless another epoch comes next (NOTE [next epoch ahead] in ``delivery.py``)."""
        workers = self._resources.workers
        if (self._resume is not None or self.epoch == current or workers is None or workers.broken
                or self._resources.closed):
            return  # a loaded state, or set_epoch back to this very epoch, comes next
        position = PlanPosition(self.epoch)
        plan = self.plan(position)
        workers.start_epoch(position, streams_of_workers(plan.num_streams, self.options.num_workers))
        workers.ahead = plan

    def state_dict(self) -> Dict[str, Any]:
        """Where this loader stands: the epoch and the batches handed out in it (also after an
        error ended it). Give it to ``load_state_dict`` of a loader with the same shards and
        settings to go on with exactly the batches not yet seen, also when stages or the
        handler drop samples (each worker's position in its sample stream is part of the
        state), and also with another ``num_workers`` (the epoch's streams are then shared
        out whole, ``epochplan.streams_of_workers``), in the order the batches would have come.
        Any rank's state also resumes the epoch on another number of ranks (NOTE [elastic
        resume])."""
        delivery, options = self._delivery, self.options
        origin, read = None, None
        if self._resume is not None and self._resume.worker_batches is not None:
            epoch, delivered, consumed = self._resume.epoch, self._resume.worker_batches, self._resume.worker_consumed
            origin, read = self._resume.origin, self._resume_read
        elif self._resume is not None:  # an epoch's start
            epoch, delivered, consumed = self._resume.epoch, (0,) * options.num_workers, (0,) * options.num_workers
            origin = self._resume.origin
        elif delivery is not None and not delivery.handed_out:
            epoch, delivered, consumed = delivery.epoch, tuple(delivery.handed), tuple(delivery.consumed)
            origin, read = delivery.plan.origin, list(delivery.read)
        else:
            epoch, delivered, consumed = self.epoch, (0,) * options.num_workers, (0,) * options.num_workers
        if read is None:
            read = [0] * len(delivered) if not any(delivered) else [None] * len(delivered)
        return versioned(STATE_FORMAT, STATE_VERSION, {
            "epoch": epoch, "batches_done": sum(delivered), "worker_batches": list(delivered),
            "worker_consumed": None if consumed is None else list(consumed), "worker_read": list(read),
            "origin": None if origin is None else list(origin),
            "batch_size": options.batch_size, "seed": options.seed, "rank": options.rank,
            "world_size": options.world_size, "exact": options.exact, "order": self.order,
            "policy": options.policy, "shuffle": options.shuffle, "shards": len(self.shards)})

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Make the next ``iter()`` continue where ``state`` (from ``state_dict``) stood; a state
        saved on another number of ranks goes on with the rest of its epoch (NOTE [elastic
        resume]). A state of another format or version is refused, naming both."""
        check_version(state, STATE_FORMAT, (STATE_VERSION,), "state")
        missing = [name for name in _STATE_FIELDS if name not in state]
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}: it is not a whole state_dict()")
        _check_state_sizes(state)
        options = self.options
        elastic = state.get("world_size") != options.world_size
        mine = {"batch_size": options.batch_size, "seed": options.seed, "rank": options.rank,
                "exact": options.exact, "policy": options.policy, "shuffle": options.shuffle,
                "shards": len(self.shards), "order": self.order}
        for name, value in mine.items():
            if name == "rank" and elastic:
                continue  # any rank's state resumes on another number of ranks
            if state.get(name) != value:
                if name == "order":
                    raise ValueError(f"state was saved with the samples in {state[name]} order, this loader reads "
                                     f"them in {value} order: pass order={state[name]!r} to resume exactly")
                raise ValueError(f"state was saved with {name}={state.get(name)!r}, this loader has "
                                 f"{value!r}: resuming exactly needs the same shards and settings")
        consumed, origin = state.get("worker_consumed"), state.get("origin")
        position = PlanPosition(state["epoch"], state["batches_done"], tuple(state["worker_batches"]),
                                None if consumed is None else tuple(consumed),
                                None if origin is None else tuple(origin))
        self._resume_read = state.get("worker_read")
        if elastic:
            position = self._elastic(position, state["world_size"], self._resume_read)
        elif (position.batches_done == 0 and len(state["worker_batches"]) == self.options.num_workers
                and not any(position.worker_consumed or ()) and position.origin is None):
            position = PlanPosition(position.epoch)  # an epoch's start: the plan sent ahead, if any, is it
        self.plan(position)  # fails now if the position does not fit
        self._resume = position
        self.epoch = position.epoch

    def _elastic(self, position: PlanPosition, world: int, read: Optional[List[Optional[int]]]) -> PlanPosition:
        """The position that deals the rest of ``position``'s epoch, saved on ``world`` ranks, to
        this loader's ranks; ValueError where that cannot be exact (NOTE [elastic resume])."""
        delivered = position.worker_batches or ()  # a loaded state has them
        options, streams = self.options, len(delivered)
        why = None
        if position.batches_done == 0 and position.origin is None:
            return PlanPosition(position.epoch)  # nothing delivered: the epoch, planned for these ranks
        if self.plan(PlanPosition(position.epoch)).mode != "samples":
            why = "it needs exact epochs (every shard's sample count, exact=True, resampled=False)"
        elif position.origin is not None:
            why = (f"the state is itself of an epoch resumed from {position.origin[0]} ranks; resume it on the "
                   f"{world} ranks it was saved on, or from a state saved before")
        elif options.shuffle_buffer > 1:
            why = (f"a shuffle buffer (shuffle_buffer={options.shuffle_buffer}) mixes what was delivered with "
                   f"what was not; the global order needs none (order='global')")
        elif read is None or len(read) != streams or any(n and r is None
                                                          for n, r in zip(delivered, read)):
            why = "the state does not say how many samples each stream read"
        elif delivered != round_robin_share(position.batches_done, streams) or not _nothing_dropped(
                position, read, options.batch_size):
            why = ("stages or the handler dropped samples, so the ranks' positions in the epoch differ and "
                   "no one rank's state says what the others delivered")
        if why is not None:
            raise ValueError(f"cannot resume a state saved on {world} ranks on {options.world_size}: {why}")
        return PlanPosition(position.epoch, origin=(world, position.batches_done, streams))

    # -- throughput ----------------------------------------------------------------------

    @property
    def stats(self) -> Dict[str, Any]:
        """Where the time went since the loader was made, as plain data (NOTE [stage times] in
        ``stats.py``): ``batches``, ``samples``, ``skipped`` (bad samples the handler let pass),
        ``padded`` (rows repeated to keep batches full), ``dropped`` and ``repeated`` (samples the
        epochs left to no rank, or gave this rank twice, where counts are known) and
        ``dropped_shards`` and ``repeated_shards`` (the same in whole shards, in epochs of whole
        shards); ``images_per_s`` over ``elapsed_s``
        (from the first batch handed out to the last), ``startup_s`` (construction to the first
        batch) and ``images_per_s_with_startup`` (``interval`` says so too); in the main process
        ``wait_s`` (waiting for workers), ``training_s`` (the training loop holding batches),
        ``transfer_s`` (``.cuda()``'s host time) and ``wait_fraction``; under ``.cuda()``
        ``h2d_s`` (the copies' time on the GPU), ``copy_wait_s`` (the host waiting for copies),
        ``pinned`` (whether the ring is pinned; None before ``.cuda()``) and ``pin_error``;
        from the workers ``workers_busy`` (the share of their time spent on batches),
        ``worker_busy_s``, ``stages`` (``{stage: {"seconds", "ms_per_image"}}`` for fetch,
        split, stages, decode, resize, write, slot_wait and other), the same per worker in
        ``workers``, ``decode`` (JPEGs decoded, by region, DCT-scaled) and ``shards`` (opened,
        cache hits and misses); and ``bottleneck``, the sentence ``progress=`` prints."""
        return self._stats.snapshot(max(self.epoch - 1, 0))

    def cuda(self, device: Any = None, *, mean: Optional[Sequence[float]] = None,
             std: Optional[Sequence[float]] = None, dtype: Any = None, channels_last: bool = True,
             depth: int = 2) -> "CudaLoader":
        """Batches on a CUDA device, copied from pinned shared memory and normalised on a side
        stream (NOTE [pinned transfer] in ``transfer.py``).

        ``device``: the CUDA device (default: the current one; under torchrun give
        ``f"cuda:{local_rank}"`` or call ``torch.cuda.set_device`` first: a device other than
        ``LOCAL_RANK``'s warns). ``mean``, ``std``: per-channel values on the 0-255 scale,
        applied on the GPU in float32 and rounded once to ``dtype`` (default float32 with them;
        bfloat16 and float16 work); without them images stay uint8 unless ``dtype`` is given.
        ``channels_last``: NCHW images in channels-last memory (default, no copy) or contiguous.
        ``depth``: batches copied and normalised ahead of the one handed out."""
        from .transfer import CudaLoader

        return CudaLoader(self, device, mean=mean, std=std, dtype=dtype, channels_last=channels_last,
                          depth=depth)

    # -- lifetime ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._resources.closed

    def close(self) -> None:
        """Stop the workers and free the shared memory (NOTE [shutdown order]). Idempotent."""
        self._finalizer()

    def __enter__(self) -> "FastLoader":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the exception leaving the block is the one to see
            self.close()
        except Exception as failure:  # noqa: BLE001
            warnings.warn(f"FastLoader.close() failed while {exc_type.__name__} propagated: {failure!r}",
                          RuntimeWarning, stacklevel=2)

    def __repr__(self) -> str:
        options = self.options
        state = "closed" if self.closed else f"{options.num_workers} workers"
        return (f"FastLoader({len(self.shards)} shards, batch_size={options.batch_size}, "
                f"image_size={options.image_size}, train={options.train}, {state})")


# The format of state_dict(): its name and version, and the fields every state of this version has.
STATE_FORMAT = "wdsmp.FastLoader"
STATE_VERSION = 1
_STATE_FIELDS = ("epoch", "batches_done", "worker_batches", "worker_consumed", "worker_read", "origin", "batch_size",
                 "seed", "rank", "world_size", "exact", "order", "policy", "shuffle", "shards")


def _check_state_sizes(state: Dict[str, Any]) -> None:
    """Refuse a state whose sizes no loader could have saved, before anything is sized by them:
    per-stream lists of more than ``MAX_STREAMS`` entries, or of other lengths than
    ``worker_batches``, and more than ``MAX_RANKS`` ranks (``origin`` is checked by
    ``PlanPosition``). ValueError naming the field."""
    streams = streams_in(state["worker_batches"], "state's worker_batches")
    for name in ("worker_consumed", "worker_read"):
        entries = state[name]
        if entries is not None and streams_in(entries, f"state's {name}") != streams:
            raise ValueError(f"state's {name} has {len(entries)} entries, worker_batches {streams}")
    for n in state["worker_read"] or ():
        if n is not None:
            count_of(n, "state's worker_read entries")
    count_of(state["world_size"], "state's world_size", 1, MAX_RANKS)


def _nothing_dropped(position: PlanPosition, read: List[Optional[int]], batch_size: int) -> bool:
    """Whether each stream of ``position`` read (``read``: its state's ``worker_read``, one per
    stream) and took exactly the samples of the batches it delivered: then the position says which
    samples they were."""
    consumed = position.worker_consumed
    return all(n == 0 or (consumed is not None and consumed[s] == read[s] == n * batch_size)
               for s, n in enumerate(position.worker_batches or ()))


def _layout(options: LoaderOptions) -> Tuple[BatchLayout, Tuple[Tuple[str, Any], ...]]:
    """The slot layout for ``options`` (a ``LoaderOptions``), and the ``(name, source)`` pairs
    of the declared fields; ValueError for a bad declaration."""
    height, width = options.image_size
    specs = [ArraySpec(IMAGES, (height, width, 3), "uint8")]
    if options.label is not None:
        specs.append(ArraySpec(LABELS, (), "int64"))
    if options.keys:
        specs.append(ArraySpec(KEYS, (), f"S{options.key_length}"))
    extra = []
    for name, declaration in (options.fields or {}).items():
        if name in (IMAGES, LABELS, KEYS):
            raise ValueError(f"field name {name!r} is taken by the loader; choose another")
        try:
            source, shape, dtype = declaration
        except (TypeError, ValueError):
            raise ValueError(f"field {name!r} must be declared as (source, shape, dtype), "
                             f"not {declaration!r}") from None
        if not (callable(source) or (isinstance(source, str) and source)):
            raise ValueError(f"field {name!r}: source must be an extension or a function, not {source!r}")
        specs.append(ArraySpec(name, shape, dtype))
        extra.append((name, source))
    return BatchLayout(options.batch_size, tuple(specs)), tuple(extra)
