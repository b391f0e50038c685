"""FastLoader: decoded, cropped, batched images from WebDataset shards, made by worker processes
straight into shared memory.

The front end of the fast path (DESIGN.md §3): it checks its arguments
(``options.py``), plans each epoch (``epochplan.py``), creates the ring
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

from ..epochplan import EpochPlanner, PlanPosition, streams_of_workers
from ..handlers import reraise_exception
from ..shardcount import known_counts
from ..validation import is_int
from . import pool as _pool
from .batches import Batch, SlotTensors
from .bottleneck import shard_source
from .delivery import Delivery, EpochIterator
from .layout import BatchLayout, FieldSpec
from .options import IMAGE_KEYS, DecodeOptions, LoaderOptions
from .resources import LoaderResources
from .ring import DEFAULT_PREFIX, Ring, cleanup_stale
from .stats import LoaderStats
from .worker import IMAGES, KEYS, LABELS, WorkerConfig

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

    Data: ``urls`` is a shard spec (``"train-{0000..0146}.tar"``, any gopen URL), a list of
    URLs or ``(url, sample_count)`` pairs, or the path or URL of a shard index (``.json``,
    see ``wdsmp.shardindex``); ``index=`` adds counts from an index to given URLs. Local
    shards without counts count themselves (their tar headers, kept in a cache under
    ``cache_dir`` or the user's cache directory); remote ones take theirs from the index
    beside them (``index.json``), if any. With every count known, epochs are exact (every
    sample once across ranks and workers, the same full batches on every rank, ``len()``
    works). Without, on more than one rank, the loader refuses, with the command that
    writes the index, unless ``exact=False``: then (and on one rank) whole shards are dealt
    out, the last batch of a worker may be short, and shards read by no rank or twice are
    counted in ``stats`` and announced each epoch. Each sample needs an image (the first of
    ``image_keys`` present: JPEG decoded by libjpeg-turbo, ``.ppm``/``.npy`` raw pixels taken as they are,
    other formats through Pillow) and, unless ``label=None``, a label (``label``: an
    extension holding an integer, as ``.cls``, or a function ``sample -> int``). Labels and
    fields are never cast: a label must be an integer (``.cls`` text: ASCII digits, an
    optional sign), a field's values must fit its dtype as they are (no 300 in a uint8, no
    3.7 in an int), else the sample is an error (``values.py``).

    Images: ``train=True`` draws RandomResizedCrop(``scale``, ``ratio``) boxes and flips with
    probability ``flip``; ``train=False`` resizes the short side to ``image_size /
    resize_ratio`` and takes the centre crop, as torchvision's eval transforms do. Batches
    are uint8 NHWC (``channels_first=True``: NCHW views) and int64 labels.

    More per sample: ``keys=True`` gives each batch its sample keys; ``fields={name:
    (source, shape, dtype)}`` declares fixed-shape arrays (``source``: an extension with
    ``.npy`` bytes or numbers as text, or a function ``sample -> array``); ``stages`` are
    iterator -> iterator functions (``wdsmp.select(...)``, ``wdsmp.map(...)``) run on the
    sample dicts in the workers before decoding, the escape hatch for arbitrary Python.
    Functions must pickle: define them at module level, in a module or in a script whose
    code runs under ``if __name__ == "__main__":`` (workers then import the script, as
    DataLoader's do under ``spawn``). Workers are fresh interpreters that import only what
    they need, not your script nor torch (NOTE [worker processes] in ``pool.py``), started
    as the loader is made; ``start_method="fork"`` forks them from your process instead,
    quicker to start but with every lock of your process copied as it is (choose it where
    the script runs no threads of its own).

    Order: ``seed`` and the epoch fix the shard order (``shuffle``), each worker's
    ``shuffle_buffer`` and every crop; each ``iter()`` runs epoch ``epoch`` and then counts
    it up (``set_epoch`` sets it). Ranks: ``rank``/``world_size`` default to
    torch.distributed's, else ``RANK``/``WORLD_SIZE``; ``policy`` ("drop" or "pad") evens
    out ranks. ``num_workers`` defaults to the CPUs this process may use, shared among the
    node's ranks under torchrun (divided by ``LOCAL_WORLD_SIZE``). ``resampled=True`` draws
    shards with replacement forever, ``epoch_batches`` per epoch.

    Remote shards (``http(s)://``, ``s3://``, ``pipe:``, ...) are streamed; with ``cache_dir``
    each is fetched whole into it before its first sample is read, and read from there
    afterwards (one copy per directory, shared by workers and processes); one that cannot be
    cached (too large for the cache's size limit, no room, another process fetching it for
    too long) is read directly, with a warning.

    Memory: an image is refused (a ``DecodeError`` for ``handler``) when it would decode to
    more than ``max_image_pixels`` pixels (default ``WDSMP_MAX_IMAGE_PIXELS``, else the larger
    of 64 Mi and 256 times the output's pixels; JPEGs are decoded at reduced size first, but a
    progressive JPEG's coefficients are all held at full size, so they are what is counted,
    and one with more than 256 scans is refused too), and a tar member larger than
    ``WDSMP_MAX_MEMBER_SIZE`` (1 GiB) is a ``TarFormatError``.

    Throughput: ``stats`` says where the time goes, stage by stage, and names the bottleneck;
    ``progress=True`` (or seconds between reports) prints the rate and the bottleneck to
    stderr as it goes.

    Errors: by default a bad sample stops the epoch with a ``WorkerError`` naming the
    worker, shard and member; ``handler=wdsmp.warn_and_continue`` skips bad samples instead
    (counted in ``stats``; NOTE [full batches] in ``worker.py``); a stage that yields anything
    but a sample dict (None) is such an error too. A shard whose sample count differs from the
    index's is read as planned, with a warning (NOTE [stale counts] in ``ranges.py``). A worker
    that shows no sign of life for ``stall_timeout`` seconds (120; stopped, stuck in a read,
    deadlocked) is killed and reported (NOTE [stalled workers] in ``delivery.py``); ``timeout``
    bounds the wait for any one batch (none by default). Batches are views of shared
    memory valid until the next ``next()`` (NOTE [batch lifetime]; ``copy=True`` to keep
    them). ``close()``, ``with`` or garbage collection stop the workers and free the memory.
    """

    def __init__(self, urls, batch_size=256, *, num_workers=None, image_size=224, train=True, seed=0,
                 index=None, label="cls", image_keys=IMAGE_KEYS, keys=False, key_length=128, fields=None,
                 stages=(), handler=reraise_exception, shuffle=None, shuffle_buffer=None,
                 rank=None, world_size=None, policy="drop", resampled=False, epoch_batches=None,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5, resize_ratio=0.875, dct_scaling=True,
                 channels_first=False, copy=False, prefetch=2, timeout=None, stall_timeout=120.0,
                 start_method="spawn", progress=False, cache_dir=None, max_image_pixels=None, exact=True):
        if _pool.starting_a_worker():  # NOTE [worker processes] in pool.py
            raise RuntimeError("a FastLoader was made while a worker process was starting and importing the main "
                               "script: a function given to the loader is defined in that script, so workers "
                               "import it; put the script's code under if __name__ == '__main__':, or define "
                               "the function in a module of its own")
        self.options = options = LoaderOptions(
            batch_size, DecodeOptions(train, scale, ratio, flip, resize_ratio, dct_scaling,
                                      max_pixels=max_image_pixels), num_workers=num_workers,
            image_size=image_size, seed=seed, label=label, image_keys=image_keys, keys=keys, key_length=key_length,
            fields=fields, stages=stages, handler=handler, shuffle=shuffle, shuffle_buffer=shuffle_buffer, rank=rank,
            world_size=world_size, policy=policy, resampled=resampled, epoch_batches=epoch_batches,
            channels_first=channels_first, copy=copy, prefetch=prefetch, timeout=timeout,
            stall_timeout=stall_timeout, start_method=start_method, progress=progress, cache_dir=cache_dir,
            exact=exact)
        layout, extra = _layout(options)
        # Unknown counts leave ranks unequal (a resampled epoch is a number of batches; one rank is alone).
        required = options.exact and not options.resampled and options.world_size > 1
        self.shards = known_counts(
            urls, index, cache_dir=options.cache_dir, handler=options.handler,
            required_by=f"FastLoader on {options.world_size} ranks" if required else None,
            otherwise="pass exact=False for epochs of whole shards per rank (which may then hand out "
                      "different numbers of batches)")
        self._planner = EpochPlanner(
            tuple(self.shards), options.batch_size, seed=options.seed, rank=options.rank,
            world_size=options.world_size, num_streams=options.num_workers, policy=options.policy,
            shuffle=options.shuffle, resampled=options.resampled, epoch_batches=options.epoch_batches,
            exact=options.exact)
        self.plan(0)  # bad plan arguments (rank, policy, too few samples) fail here too
        cleanup_stale(DEFAULT_PREFIX)
        ring = Ring.create(layout, options.num_workers * options.prefetch)
        self._resources = LoaderResources(ring)
        self._finalizer = weakref.finalize(self, self._resources.close)  # what fails from here on, frees it
        self._config = WorkerConfig(
            ring=ring.name, layout=layout, image_keys=options.image_keys, label=options.label, fields=extra,
            keys=options.keys, stages=options.stages, handler=options.handler, decode=options.decode,
            shuffle_buffer=options.shuffle_buffer, planner=self._planner, cache_dir=options.cache_dir)
        # Whether spawned workers must import the script (NOTE [worker processes] in pool.py).
        self._main = options.start_method != "fork" and _pool.refers_to_main(self._config)
        if self._main and _pool.main_module() is None:
            raise ValueError("a function given to the loader is defined in an interactive session (or python -c), "
                             "which worker processes cannot import: define it in a module, or pass "
                             "start_method='fork'")
        self._slots = SlotTensors(ring, copy=options.copy, channels_first=options.channels_first)
        self._stats = LoaderStats(report_every=options.progress, num_workers=options.num_workers,
                                  source=shard_source([url for url, _ in self.shards]), cache_dir=options.cache_dir)
        self.epoch = 0
        self._resume = None  # a loaded PlanPosition, for the next iter()
        self._delivery = None  # the current epoch's Delivery
        # Started now, so that their start overlaps what the script does before its first iter().
        self._resources.new_workers(self._config, options.num_workers, options.prefetch, options.start_method,
                                    self._main)

    @property
    def batch_size(self):
        return self.options.batch_size

    @property
    def num_workers(self):
        return self.options.num_workers

    # -- epochs -------------------------------------------------------------------------

    def plan(self, position=None):
        """This rank's ``EpochPlan`` of epoch ``position`` (default: the next one; or a
        ``PlanPosition``): what each stream reads (see ``epochplan.py``). A position counts the
        streams the epoch started with; a new epoch has one per worker."""
        return self._planner.plan(self.epoch if position is None else position)

    def set_epoch(self, epoch):
        """Make the next ``iter()`` run epoch ``epoch`` (as DistributedSampler.set_epoch)."""
        if not is_int(epoch, 0):
            raise ValueError(f"epoch must be an int >= 0, not {epoch!r}")
        self.epoch = epoch
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # a loaded state of this very epoch stays in force

    def __len__(self):
        """Batches per epoch on this rank; TypeError when sample counts are unknown."""
        batches = self.plan(PlanPosition(self.epoch)).batches_per_rank
        if batches is None:
            raise TypeError("len() of a FastLoader needs exact epochs: every shard's sample count (local shards "
                            "count themselves; pass (url, count) pairs or a shard index, index=..., for remote "
                            "ones) and exact=True")
        return batches

    def __iter__(self):
        """Start the next epoch: the workers get their tasks (unless they went ahead with this
        very epoch, NOTE [next epoch ahead] in ``delivery.py``); the iterator delivers the
        batches, and holds this loader while it lives."""
        self._resources.check_open()
        if self._delivery is not None:
            self._delivery.leave()
        before = self._resume, self.epoch  # what a failed start leaves for the next iter()
        position = self._resume or PlanPosition(self.epoch)
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
        self._delivery = Delivery(plan, workers, streams, resources=self._resources, slots=self._slots,
                                  stats=self._stats, timeout=options.timeout, stall_timeout=options.stall_timeout,
                                  ahead=weakref.WeakMethod(self._send_ahead))
        return EpochIterator(self, self._delivery)

    def _send_ahead(self, current):
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

    def state_dict(self):
        """Where this loader stands: the epoch and the batches handed out in it (also after an
        error ended it). Give it to ``load_state_dict`` of a loader with the same shards and
        settings to go on with exactly the batches not yet seen, also when stages or the
        handler drop samples (each worker's position in its sample stream is part of the
        state), and also with another ``num_workers`` (the epoch's streams are then shared
        out whole, ``epochplan.streams_of_workers``), in the order the batches would have come."""
        delivery, options = self._delivery, self.options
        if self._resume is not None and self._resume.worker_batches is not None:
            epoch, delivered, consumed = self._resume.epoch, self._resume.worker_batches, self._resume.worker_consumed
        elif self._resume is not None:  # an epoch's start
            epoch, delivered, consumed = self._resume.epoch, (0,) * options.num_workers, (0,) * options.num_workers
        elif delivery is not None and not delivery.handed_out:
            epoch, delivered, consumed = delivery.epoch, tuple(delivery.handed), tuple(delivery.consumed)
        else:
            epoch, delivered, consumed = self.epoch, (0,) * options.num_workers, (0,) * options.num_workers
        return {"epoch": epoch, "batches_done": sum(delivered), "worker_batches": list(delivered),
                "worker_consumed": None if consumed is None else list(consumed),
                "batch_size": options.batch_size, "seed": options.seed, "rank": options.rank,
                "world_size": options.world_size, "exact": options.exact}

    def load_state_dict(self, state):
        """Make the next ``iter()`` continue where ``state`` (from ``state_dict``) stood."""
        for name in ("batch_size", "seed", "rank", "world_size", "exact"):
            if name == "exact" and name not in state:
                continue  # states saved by earlier wdsmp do not say; the rest is checked
            if state.get(name) != getattr(self.options, name):
                raise ValueError(f"state was saved with {name}={state.get(name)!r}, this loader has "
                                 f"{getattr(self.options, name)!r}: resuming exactly needs the same settings")
        consumed = state.get("worker_consumed")
        position = PlanPosition(state["epoch"], state["batches_done"], tuple(state["worker_batches"]),
                                None if consumed is None else tuple(consumed))
        if (position.batches_done == 0 and len(position.worker_batches) == self.options.num_workers
                and not any(position.worker_consumed or ())):
            position = PlanPosition(position.epoch)  # an epoch's start: the plan sent ahead, if any, is it
        self.plan(position)  # fails now if the position does not fit
        self._resume = position
        self.epoch = position.epoch

    # -- throughput ----------------------------------------------------------------------

    @property
    def stats(self):
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

    def cuda(self, device=None, *, mean=None, std=None, dtype=None, channels_last=True, depth=2):
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
    def closed(self):
        return self._resources.closed

    def close(self):
        """Stop the workers and free the shared memory (NOTE [shutdown order]). Idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is None:
            self.close()
            return
        try:  # the exception leaving the block is the one to see
            self.close()
        except Exception as failure:  # noqa: BLE001
            warnings.warn(f"FastLoader.close() failed while {exc_type.__name__} propagated: {failure!r}",
                          RuntimeWarning, stacklevel=2)

    def __repr__(self):
        options = self.options
        state = "closed" if self.closed else f"{options.num_workers} workers"
        return (f"FastLoader({len(self.shards)} shards, batch_size={options.batch_size}, "
                f"image_size={options.image_size}, train={options.train}, {state})")


def _layout(options):
    """The slot layout for ``options`` (a ``LoaderOptions``), and the ``(name, source)`` pairs
    of the declared fields; ValueError for a bad declaration."""
    height, width = options.image_size
    specs = [FieldSpec(IMAGES, (height, width, 3), "uint8")]
    if options.label is not None:
        specs.append(FieldSpec(LABELS, (), "int64"))
    if options.keys:
        specs.append(FieldSpec(KEYS, (), f"S{options.key_length}"))
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
        specs.append(FieldSpec(name, shape, dtype))
        extra.append((name, source))
    return BatchLayout(options.batch_size, tuple(specs)), tuple(extra)
