"""FastLoader: decoded, cropped, batched images from WebDataset shards, made by worker processes
straight into shared memory.

The front end of the fast path (DESIGN.md §3): it checks its arguments
(``options.py``), plans each epoch (``epochplan.py``), creates the ring
(``ring.py``), runs the workers (``worker.py`` in a ``pool.py``, held with the
ring in ``resources.py``), and hands out each slot as tensors without copying
(``delivery.py``, ``batches.py``; on a GPU ``transfer.py``).

NOTE [loader protocol]
    * Queues: each worker has a task queue (the ``StreamPlan`` tuple of each epoch, or
      ``Stop``) and a queue of its free slots; all workers announce on one
      ready queue (``BatchReady``, ``WorkerDone``, ``WorkerFailed``,
      ``WorkerWarning``: warnings are issued again in the main process). Each
      producer's messages arrive in the order it sent them.
    * Slots belong to workers: worker w owns ``prefetch`` slots, and a slot
      the loader is done with goes back to its owner. Batches are delivered
      in a fixed order (below), so with one shared free list the fast
      workers could take every slot while the loader waits for a slow
      worker's batch, which then has nowhere to go: a deadlock. Owned slots
      rule it out; the ring has ``prefetch * num_workers`` slots.
    * Order: the next batch comes from the stream (a worker's part of the
      plan), among those not finished, that has delivered the fewest batches
      (the lowest index first). With known counts that is the plan's round
      robin, batch k from stream k % W (NOTE [plan: exactly once, equal
      batches]); with unknown counts it is round robin skipping finished
      streams. It depends only on the counts delivered, so a resumed epoch
      continues in the same order, also on another number of workers: a
      worker then runs several streams, making their batches in this order.
    * Waiting: every wait has a short timeout after which the workers'
      liveness is checked: a worker that died is reported within a second,
      naming its exit code or signal, and the awaited worker's signs of life
      are sampled (NOTE [stalled workers] in ``delivery.py``).
    * Workers persist across epochs. An epoch left unfinished (``break``,
      an error, a new ``iter()``) restarts them: their slots and queues are
      in an unknown state, and restarting is cheap (forked from the fork server).
      An epoch whose batches were all handed out is finished, also when its
      end was never asked for (``zip(range(len(loader)), loader)``): the next
      ``iter()`` takes the workers' end-of-epoch messages first
      (``DeliveryState.leave``).

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
    ``close()`` (also run by ``with``, garbage collection and interpreter
    exit, through one ``weakref.finalize``): set the stop event and send
    ``Stop`` to every worker; join them for a few seconds, then terminate,
    then kill; close the queues; unregister pinned memory; then unlink the
    ring, exactly once (NOTE [ring ownership]). Workers also exit by
    themselves when the loader's process is gone (parent watch), and a new
    FastLoader unlinks rings whose owner died without closing.
"""

import functools
import os
import threading
import warnings
import weakref

from ..validation import is_int
from ..epochplan import PlanPosition, plan_epoch, streams_of_workers
from ..handlers import reraise_exception
from ..shardcount import known_counts
from . import pool as _pool
from .batches import Batch, SlotTensors
from .bottleneck import shard_source
from .delivery import EpochIterator
from .epochstart import EpochStart, release_after
from .layout import BatchLayout, FieldSpec
from .options import IMAGE_KEYS, DecodeOptions, LoaderOptions
from .resources import LoaderResources
from .ring import DEFAULT_PREFIX, Ring, cleanup_stale
from .stats import LoaderStats
from .worker import IMAGES, KEYS, LABELS, WorkerConfig, make_first_batch, may_make_first_batch

__all__ = ["FORK_SERVER_DELAY", "IMAGE_KEYS", "Batch", "FastLoader"]

# Seconds after construction a loader that makes its first batch itself starts the fork server,
# unless iter() came first (NOTE [first batch here] in worker.py).
FORK_SERVER_DELAY = 0.1


class FastLoader:
    """Batches of decoded, cropped images (and labels) from WebDataset shards, made by a pool of
    worker processes in shared memory; a replacement for DataLoader over a WebDataset.

    ::

        for images, labels in FastLoader("shards/train-{000000..000146}.tar", batch_size=256):
            ...                                    # images: uint8 (256, 224, 224, 3), labels: int64 (256,)
        for images, labels in FastLoader(urls, batch_size=256).cuda(mean=..., std=...):
            ...                                    # on the GPU, normalised, float32

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
    Functions must pickle: define them at module level (workers are started by a fork
    server, as with DataLoader under ``spawn``). The first loader of a process starts the
    fork server, which imports the worker's modules once, not torch (NOTE [light workers]
    in ``pool.py``); ``start_method="fork"`` starts workers without it, from a process
    without threads or locks that matter.

    Order: ``seed`` and the epoch fix the shard order (``shuffle``), each worker's
    ``shuffle_buffer`` and every crop; each ``iter()`` runs epoch ``epoch`` and then counts
    it up (``set_epoch`` sets it). Ranks: ``rank``/``world_size`` default to
    torch.distributed's, else ``RANK``/``WORLD_SIZE``; ``policy`` ("drop" or "pad") evens
    out ranks. ``resampled=True`` draws shards with replacement forever, ``epoch_batches``
    per epoch.

    Remote shards (``http(s)://``, ``s3://``, ``pipe:``, ...) are streamed; with ``cache_dir``
    each is fetched whole into it before its first sample is read, and read from there
    afterwards (one copy per directory, shared by workers and processes); one that cannot be
    cached (too large for the cache's size limit, no room, another process fetching it for
    too long) is read directly, with a warning.

    Memory: an image is refused (a ``DecodeError`` for ``handler``) when it would decode to
    more than ``max_image_pixels`` pixels (default ``WDSMP_MAX_IMAGE_PIXELS``, else the larger
    of 64 Mi and 256 times the output's pixels; JPEGs are decoded at reduced size first), and a
    tar member larger than ``WDSMP_MAX_MEMBER_SIZE`` (1 GiB) is a ``TarFormatError``.

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
                 start_method="forkserver", progress=False, cache_dir=None, max_image_pixels=None, exact=True):
        if _pool.starting_a_worker():  # NOTE [main module] in pool.py
            raise RuntimeError("a FastLoader was made while a worker process was starting and importing the main "
                               "script: a function given to the loader is defined in that script, so workers "
                               "import it; put the script's code under if __name__ == '__main__':, or define "
                               "the function in a module of its own")
        options = LoaderOptions(
            batch_size, DecodeOptions(train, scale, ratio, flip, resize_ratio, dct_scaling,
                                      max_pixels=max_image_pixels), num_workers=num_workers,
            image_size=image_size, seed=seed, label=label, image_keys=image_keys, keys=keys, key_length=key_length,
            fields=fields, stages=stages, handler=handler, shuffle=shuffle, shuffle_buffer=shuffle_buffer, rank=rank,
            world_size=world_size, policy=policy, resampled=resampled, epoch_batches=epoch_batches,
            channels_first=channels_first, copy=copy, prefetch=prefetch, timeout=timeout,
            stall_timeout=stall_timeout, start_method=start_method, progress=progress, cache_dir=cache_dir)
        self._options = options
        self.batch_size, self.num_workers, self.prefetch = options.batch_size, options.num_workers, options.prefetch
        self.image_size, self.train, self.seed = options.image_size, options.train, options.seed
        self.shuffle, self.rank, self.world_size = options.shuffle, options.rank, options.world_size
        self.policy, self.resampled, self.epoch_batches = options.policy, options.resampled, options.epoch_batches
        self.copy, self.channels_first, self.timeout = options.copy, options.channels_first, options.timeout
        self.progress = options.progress  # seconds between reports on stderr, or None
        if not isinstance(exact, bool):
            raise ValueError(f"exact must be True or False, not {exact!r}")
        self.exact = exact
        layout, extra = _layout(options)
        mp_context = _pool.context(start_method)  # a bad start method fails here, not at the first batch
        # Unknown counts leave ranks unequal (a resampled epoch is a number of batches; one rank is alone).
        required = exact and not self.resampled and self.world_size > 1
        self.shards = known_counts(
            urls, index, cache_dir=options.cache_dir, handler=options.handler,
            required_by=f"FastLoader on {self.world_size} ranks" if required else None,
            otherwise="pass exact=False for epochs of whole shards per rank (which may then hand out "
                      "different numbers of batches)")
        self.plan(0)  # bad plan arguments (rank, policy, too few samples) fail here too
        cleanup_stale(DEFAULT_PREFIX)
        _pool.sweep_semaphores()
        self._ring = Ring.create(layout, self.num_workers * self.prefetch)  # last: nothing after it fails
        self._config = WorkerConfig(
            ring=self._ring.name, layout=layout, image_keys=options.image_keys, label=options.label, fields=extra,
            keys=options.keys, stages=options.stages, handler=options.handler, decode=options.decode,
            shuffle_buffer=options.shuffle_buffer, cache_dir=options.cache_dir,
            counts=tuple(count for _, count in self.shards))
        self._mp_context = mp_context
        main = _pool.refers_to_main(self._config)
        self._server_timer = None
        if main or not may_make_first_batch(self._config, [url for url, _ in self.shards]):
            # The fork server imports the workers' modules (or the script, NOTE [light workers] in
            # pool.py) from now on.
            _pool.start_server(mp_context, main)
        else:  # after the first batch, which it would slow, unless the script does other things first
            self._server_timer = threading.Timer(FORK_SERVER_DELAY, _pool.start_server, (mp_context, main))
            self._server_timer.daemon = True
            self._server_timer.start()
        self._resources = LoaderResources(self._ring)
        if self._server_timer is not None:
            self._resources.on_close(self._server_timer.cancel)
        self._finalizer = weakref.finalize(self, self._resources.close)
        self._slots = SlotTensors(self._ring, copy=self.copy, channels_first=self.channels_first)
        self._stats = LoaderStats(report_every=self.progress, num_workers=self.num_workers,
                                  source=shard_source([url for url, _ in self.shards]), cache_dir=options.cache_dir)
        self.epoch = 0
        self._resume = None
        self._delivery = None  # the current epoch's DeliveryState (never its iterator: see there)

    # -- epochs -------------------------------------------------------------------------

    def plan(self, position=None):
        """This rank's ``EpochPlan`` of epoch ``position`` (default: the next one; or a
        ``PlanPosition``): what each stream reads (see ``epochplan.py``). A position counts the
        streams the epoch started with; a new epoch has one per worker."""
        if position is None:
            position = self.epoch
        streams = self.num_workers
        if isinstance(position, PlanPosition) and position.worker_batches is not None:
            streams = len(position.worker_batches)
        return plan_epoch(self.shards, position, batch_size=self.batch_size, seed=self.seed, rank=self.rank,
                          world_size=self.world_size, num_streams=streams, policy=self.policy,
                          shuffle=self.shuffle, resampled=self.resampled, epoch_batches=self.epoch_batches,
                          exact=self.exact)

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
        """Start the next epoch: the workers get their plans (unless they went ahead with this
        very epoch, NOTE [next epoch ahead] in ``epochstart.py``); the iterator delivers the batches."""
        self._resources.check_open()
        if self._server_timer is not None:
            self._server_timer.cancel()  # NOTE [first batch here] in worker.py
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
        workers, ahead = self._resources.workers, None
        if workers is not None and not workers.broken:
            ahead, workers.ahead = workers.ahead, None
            if ahead is not None and ahead.plan != plan:
                workers.shutdown()  # they went ahead with another epoch than this one
                ahead = None
        fresh = workers is None or workers.broken
        if fresh:
            workers = self._resources.new_workers(self._config, self.num_workers, self.prefetch,
                                                    self._options.start_method)
        self._stats.start()
        # A fresh generation's first batch is made here, its processes start behind it (NOTE [first
        # batch here] in worker.py).
        try:
            start = ahead or self._start_epoch(workers, plan, here=fresh)
            if start.made_here and workers.ctx.get_start_method() != "fork":
                workers.start(background=True, then=functools.partial(release_after, start, workers.stop_event))
            else:
                workers.start()
                if start.made_here:  # forked now: nobody but the loop's next request would release them
                    start.release()
            iterator = EpochIterator(start, resources=self._resources, slots=self._slots, stats=self._stats,
                                     timeout=self.timeout, stall_timeout=self._options.stall_timeout,
                                     ahead=weakref.WeakMethod(self._next_epoch_ahead))
        except BaseException:
            # Tasks may be queued that no iterator follows (or for processes that never ran): these
            # workers go, and the next iter() runs this very epoch (or loaded state) afresh.
            workers.shutdown()
            self._resume, self.epoch = before
            raise
        self._delivery = self._resources.delivery = iterator.state
        return iterator

    def _start_epoch(self, workers, plan, here=False):
        """Send ``workers`` the tasks of ``plan``; the first batch is made by as many threads as
        there are workers and cores, unless rows call the user's functions (NOTE [first batch
        together] in ``worker.py``), and by this process while fresh workers start (``here``,
        NOTE [first batch here] there)."""
        threads = 1 if self._config.rows_call_user_code else min(self.num_workers, len(os.sched_getaffinity(0)))

        def make_first(worker, stream, threads):
            return make_first_batch(worker, self._config, stream, self._ring, workers.free[worker],
                                    workers.stop_event, threads)

        return EpochStart(workers, plan, streams_of_workers(plan.num_streams, self.num_workers), threads,
                          make_first if here else None)

    def _next_epoch_ahead(self, current):
        """Send the workers the next epoch's tasks now, as the last batch of epoch ``current`` is
        delivered; its ``EpochStart``, or None where none can go ahead (NOTE [next epoch ahead]
        in ``epochstart.py``)."""
        workers = self._resources.workers
        if (self._resume is not None or self.epoch == current or workers is None or workers.broken
                or self._resources.closed):
            return None  # a loaded state, or set_epoch back to this very epoch, comes next
        workers.ahead = self._start_epoch(workers, self.plan(PlanPosition(self.epoch)))
        return workers.ahead

    def state_dict(self):
        """Where this loader stands: the epoch and the batches handed out in it (also after an
        error ended it). Give it to ``load_state_dict`` of a loader with the same shards and
        settings to go on with exactly the batches not yet seen, also when stages or the
        handler drop samples (each worker's position in its sample stream is part of the
        state), and also with another ``num_workers`` (the epoch's streams are then shared
        out whole, ``epochplan.streams_of_workers``), in the order the batches would have come."""
        delivery = self._delivery
        if self._resume is not None:
            epoch, delivered, consumed = self._resume.epoch, self._resume.worker_batches, self._resume.worker_consumed
        elif delivery is not None and not delivery.handed_out:
            epoch, delivered, consumed = delivery.epoch, tuple(delivery.handed), tuple(delivery.consumed)
        else:
            epoch, delivered, consumed = self.epoch, (0,) * self.num_workers, (0,) * self.num_workers
        return {"epoch": epoch, "batches_done": sum(delivered), "worker_batches": list(delivered),
                "worker_consumed": None if consumed is None else list(consumed),
                "batch_size": self.batch_size, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "exact": self.exact}

    def load_state_dict(self, state):
        """Make the next ``iter()`` continue where ``state`` (from ``state_dict``) stood."""
        for name in ("batch_size", "seed", "rank", "world_size", "exact"):
            if name == "exact" and name not in state:
                continue  # saved before whole-shard epochs were a setting of their own
            if state.get(name) != getattr(self, name):
                raise ValueError(f"state was saved with {name}={state.get(name)!r}, this loader has "
                                 f"{getattr(self, name)!r}: resuming exactly needs the same settings")
        consumed = state.get("worker_consumed")
        position = PlanPosition(state["epoch"], state["batches_done"], tuple(state["worker_batches"]),
                                None if consumed is None else tuple(consumed))
        self.plan(position)  # fails now if the position does not fit
        self._resume = position
        self.epoch = position.epoch
        if position.batches_done:  # its first batch is the workers' to make: their server starts now
            _pool.start_server(self._mp_context, _pool.refers_to_main(self._config))

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
        ``transfer_s`` (``.cuda()``) and ``wait_fraction``; from the workers ``workers_busy``
        (the share of their time spent on batches), ``worker_busy_s``, ``stages`` (``{stage:
        {"seconds", "ms_per_image"}}`` for fetch, split, stages, decode, resize, write,
        slot_wait and other), the same per worker in ``workers``, ``decode`` (JPEGs decoded, by
        region, DCT-scaled) and ``shards`` (opened, cache hits and misses); and ``bottleneck``,
        the sentence ``progress=`` prints."""
        return self._stats.snapshot(max(self.epoch - 1, 0))

    def cuda(self, device=None, *, mean=None, std=None, dtype=None, channels_last=True, depth=2):
        """Batches on a CUDA device, copied from pinned shared memory on a side stream; see
        ``transfer.CudaLoader`` for the arguments."""
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

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.num_workers} workers"
        return (f"FastLoader({len(self.shards)} shards, batch_size={self.batch_size}, "
                f"image_size={self.image_size}, train={self.train}, {state})")


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
