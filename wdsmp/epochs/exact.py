"""Exact, resumable epochs for the reference path: ``DataPipeline`` and ``WebLoader`` under
``torchrun``, with FastLoader's plan.

webdataset splits whole shards between nodes and workers, so ranks end an
epoch with different numbers of batches (DDP then waits forever on the rank
that ran out) and a stopped run cannot say where it was. ``ExactSamples`` is
a pipeline source that reads this rank's streams of the plan of
``wdsmp/epochs/plan.py`` instead (each DataLoader worker its share of their
batches): every sample once per epoch, the same number of full batches on
every rank. A pipeline on it counts the batches it hands out, so
``state_dict()`` says where the epoch stands and ``load_state_dict()`` goes
on from there.

NOTE [exact epochs in the reference path]
    * Streams. An epoch is planned for S streams, S being the number of
      DataLoader workers when the epoch starts (1 without workers). Stream s
      is stream s of the plan for S streams: a whole number of batches of
      samples, read front to back, through a buffer shuffle seeded by
      (seed, epoch, rank, s) when ``shuffle_buffer`` > 1. Batch d of the
      rank's epoch is batch d // S of stream d % S.
    * Workers. With D batches handed out, the m-th remaining batch
      (d = D + m) is made by worker m % W of the W workers now running: it
      yields samples [k * B, (k + 1) * B) of the batch's stream and reads
      past (never yields) those of other workers' batches. The workers'
      shares differ by at most one, the first ones having more, so the
      DataLoader's round robin hands out batches D, D + 1, ...: the order of
      a run that was never stopped, whatever W is after a restart.
    * The contract. A batch must be ``batch_size`` consecutive samples of the
      source: the stages up to ``batched(batch_size)`` map one sample to one
      (decode, to_tuple, map). A stage or handler that drops samples shifts
      the batches: the pipeline then still hands out the planned number of
      batches, repeating the last one, with a warning (so no DDP rank waits),
      but a resume is no longer exact. Shuffle with ``shuffle_buffer``: a
      later ``.shuffle()`` mixes samples across batches and is refused.
    * State. ``{"epoch", "batches_done", "streams", ...}``, counted where the
      batches are handed out: the pipeline iterated in the main process, or
      the ``WebLoader`` around the DataLoader (no stage may follow the
      DataLoader there: it would hold or regroup batches the count has
      passed). An epoch handed out to its end moves the source to the next
      one; an epoch left before its end (``break``, an error) goes on from
      where it was at the next iteration.
    * Order. It follows from the seed, the epoch, the rank and the number of
      streams, i.e. of workers when the epoch started; in global order
      (``order``) the stream's samples are positions of a permutation of all
      samples, read each at its offset.
    * Rank. Worker processes do not inherit torch.distributed's process
      group, so the rank and world size are fixed in the main process when
      the source is pickled for them.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from itertools import islice
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

from torch.utils.data import DataLoader, get_worker_info

from ..stages.base import Curried
from .._internal.validation import count as count_of, is_int
from .._internal.versions import check_version, versioned
from .plan import MAX_STREAMS, ORDERS, POLICIES, EpochPlan, StreamPlan, plan_epoch
from ..filters import detshuffle, shuffle
from ..handlers import reraise_exception
from ..pipeline import CountedSource
from .spans import SpanReader, locate_samples
from .stream import stream_samples, stream_start
from .counts import known_counts
from .. import utils

__all__ = ["ExactSamples"]

# The format of the states ExactSamples saves: a pipeline's state_dict() and WebLoader's.
STATE_FORMAT = "wdsmp.ExactSamples"
STATE_VERSION = 1


class _PlanStream:
    """One stream of the plan (its ``StreamPlan``), read forward batch by batch through the reader
    FastLoader's workers use (``stream.stream_samples``)."""

    def __init__(self, plan: StreamPlan, shuffle_buffer: int, handler: Callable[[Exception], Any],
                 cache_dir: Optional[str], first_batch: int, counts: List[Optional[int]],
                 spans: Optional[SpanReader]) -> None:
        self.batch_size = plan.batch_size
        plan = replace(plan, skip_batches=first_batch)
        start = stream_start(plan, shuffle_buffer)
        # The readers under stream_samples call the handler with Exceptions only.
        self.samples = stream_samples(plan, start, shuffle_buffer=shuffle_buffer, spans=spans,
                                      handler=cast(Callable[[BaseException], bool], handler),
                                      cache_dir=cache_dir, counts=counts)
        self.position = first_batch * self.batch_size

    def batch(self, k: int) -> Iterator[Dict[str, Any]]:
        """The samples of the stream's batch ``k`` (``k`` never below an earlier call's)."""
        start = k * self.batch_size
        for _ in islice(self.samples, start - self.position):
            pass
        self.position = start + self.batch_size
        return islice(self.samples, self.batch_size)

    def close(self) -> None:
        self.samples.close()  # type: ignore[attr-defined]  # a generator: its files close with it


class ExactSamples(CountedSource):
    """Pipeline source for exact epochs: this rank's and worker's samples of the epoch's plan, in
    the order that makes every rank's batches the same in number and resumable; see NOTE [exact
    epochs in the reference path].

    ::

        source = wds.ExactSamples("shards/index.json", batch_size=64, shuffle_buffer=1000)
        dataset = wds.DataPipeline(source, wds.decode("pil"), wds.to_tuple("jpg", "cls"),
                                   wds.map_tuple(transform, None), wds.batched(64, partial=False))
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=4)
        if checkpoint is not None:                    # when resuming
            loader.load_state_dict(checkpoint["loader"])
        for epoch in range(start_epoch, epochs):
            loader.set_epoch(epoch)
            for images, labels in loader: ...         # len(loader) batches on every rank
            checkpoint = {"loader": loader.state_dict()}

    ``urls``: a shard spec or URLs, ``(url, count)`` pairs, or a shard index
    (``.json``, as ``ShardWriter(index=...)`` writes; ``index=`` names one for
    the given URLs): sample counts are what make the split exact. Local shards
    count themselves (their tar headers, kept in a cache under ``cache_dir``
    or the user's cache directory); remote ones take theirs from the index
    beside them (``index.json``), and without one the source refuses, giving
    the ``wdsmp index`` command that writes it.
    ``policy``: "drop" (every rank reads floor(N / world) samples, rounded
    down to whole batches; the rest, different each epoch, is read by nobody)
    or "pad" (rounded up; samples from the start of the epoch's order fill
    it). ``shuffle``: shard order from (seed, epoch). ``shuffle_buffer``:
    samples shuffled within each stream. ``rank``/``world_size``: default
    from torch.distributed or ``RANK``/``WORLD_SIZE``. ``cache_dir``: keep a
    local copy of each remote shard read (per node, shared by its workers).
    ``order``: "auto" (the default) shuffles every sample of the epoch, not just
    the shards, when ``shuffle`` is on and every shard is a local uncompressed
    file (each sample is then read at its offset); "global" insists (remote
    shards are fetched into ``cache_dir`` first); "shards" reads shard by shard
    (NOTE [sample order] in ``wdsmp/fast/loader.py``). ``self.order`` says which.
    """

    def __init__(self, urls: Union[str, Sequence[Union[str, Tuple[str, Optional[int]]]]], batch_size: int, *,
                 index: Optional[str] = None, seed: Any = 0, policy: str = "drop", shuffle: bool = True,
                 shuffle_buffer: int = 0, handler: Callable[[Exception], Any] = reraise_exception,
                 rank: Optional[int] = None, world_size: Optional[int] = None, cache_dir: Optional[str] = None,
                 order: str = "auto") -> None:
        super().__init__()
        self.shards = known_counts(urls, index, cache_dir=cache_dir, handler=handler, required_by="ExactSamples")
        if order not in ("auto",) + ORDERS:
            raise ValueError(f"order must be one of {('auto',) + ORDERS}, not {order!r}")
        if order == "global" and not shuffle:
            raise ValueError("order='global' shuffles every sample: it needs shuffle=True")
        self.files, self.order = None, "shards"
        if order != "shards" and shuffle:
            self.files, why = locate_samples([url for url, _ in self.shards], cache_dir, handler,
                                             fetch=order == "global")
            if self.files is None and order == "global":
                raise ValueError(f"order='global' reads each sample at its offset, and a shard cannot be read "
                                 f"so: {why}")
            if self.files is not None:
                self.order = "global"
                self.shards = tuple((url, count) for (url, _), count in zip(self.shards, self.files.counts))
        if not is_int(batch_size, 1):
            raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
        if not is_int(shuffle_buffer, 0):
            raise ValueError(f"shuffle_buffer must be an int >= 0, not {shuffle_buffer!r}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.batch_size, self.seed, self.policy = batch_size, seed, policy
        self.shuffle, self.shuffle_buffer = bool(shuffle), shuffle_buffer
        self.handler, self.cache_dir = handler, cache_dir
        self._rank, self._world_size = rank, world_size
        self.epoch = 0
        self.resume: Optional[Dict[str, Any]] = None  # a loaded state, for its epoch
        self.plan(1)  # bad arguments (rank, too few samples) fail here, not in a worker

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled for DataLoader workers, which do not inherit the process group: with this
        process's rank and world size fixed (NOTE [exact epochs ...], Rank)."""
        state = dict(self.__dict__)
        state["_rank"], state["_world_size"] = self.node()
        return state

    def node(self) -> Tuple[int, int]:
        """``(rank, world_size)``: as given, else from torch.distributed or the environment."""
        rank, world_size, _, _ = utils.pytorch_worker_info()
        return (rank if self._rank is None else self._rank,
                world_size if self._world_size is None else self._world_size)

    def plan(self, streams: int, epoch: Optional[int] = None) -> EpochPlan:
        """This rank's plan of ``epoch`` (default: the current one) for ``streams`` streams
        (``epochplan.EpochPlan``)."""
        rank, world_size = self.node()
        return plan_epoch(self.shards, self.epoch if epoch is None else epoch, batch_size=self.batch_size,
                          seed=self.seed, rank=rank, world_size=world_size, num_streams=streams,
                          policy=self.policy, shuffle=self.shuffle, order=self.order)

    def __len__(self) -> int:
        """Batches per rank in an epoch (the same on every rank)."""
        batches = self.plan(1).batches_per_rank
        assert batches is not None  # exact: known_counts gave every shard's count (required_by)
        return batches

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``; a loaded state of another epoch is dropped."""
        self.epoch = int(epoch)
        if self.resume is not None and self.resume["epoch"] != self.epoch:
            self.resume = None

    def start(self, num_workers: int) -> Tuple[int, int]:
        """``(batches_done, streams)`` where the current epoch starts with ``num_workers``
        DataLoader workers (0: none): a loaded state's, else the beginning."""
        if self.resume is not None and self.resume["epoch"] == self.epoch:
            return self.resume["batches_done"], self.resume["streams"]
        return 0, max(1, num_workers)

    def state(self, epoch: int, batches_done: int, streams: int) -> Dict[str, Any]:
        """The state a pipeline saves after ``batches_done`` batches of ``epoch``."""
        rank, world_size = self.node()
        return versioned(STATE_FORMAT, STATE_VERSION, {
            "epoch": epoch, "batches_done": batches_done, "streams": streams,
            "batch_size": self.batch_size, "seed": self.seed, "policy": self.policy,
            "shards": len(self.shards), "rank": rank, "world_size": world_size, "order": self.order})

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (``state_dict()`` of a pipeline on an identical source) at the
        next iteration; ValueError if it was saved with other settings, in another format or
        version, or does not fit."""
        check_version(state, STATE_FORMAT, (STATE_VERSION,), "state")
        mine = self.state(0, 0, 1)
        missing = [name for name in mine if name not in state]
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}: it is not a whole state_dict()")
        for name in ("batch_size", "seed", "policy", "shards", "rank", "world_size", "order"):
            if state.get(name) != mine[name]:
                raise ValueError(f"state was saved with {name}={state.get(name)!r}, this source has "
                                 f"{mine[name]!r}: resuming exactly needs the same shards and settings")
        epoch, done, streams = state["epoch"], state["batches_done"], state["streams"]
        streams = count_of(streams, "state's streams", 1, MAX_STREAMS)
        epoch = count_of(epoch, "state's epoch")
        total = self.plan(streams, epoch).batches_per_rank
        if not is_int(done, 0) or done > total:
            raise ValueError(f"state has batches_done={done!r}, not within the epoch's {total} batches")
        self.epoch = int(epoch)
        self.resume = {"epoch": self.epoch, "batches_done": done, "streams": streams}

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        _, _, worker, num_workers = utils.pytorch_worker_info()
        inside = get_worker_info() is not None
        done, nstreams = self.start(num_workers if inside else 0)
        worker, num_workers = (worker, num_workers) if inside else (0, 1)
        plan = self.plan(nstreams)
        assert plan.batches_per_rank is not None  # exact: known_counts gave every shard's count (required_by)
        streams = {}
        files = self.files
        spans = None if files is None else SpanReader(files.paths, files.spans, files=files.files)
        try:
            for d in range(done + worker, plan.batches_per_rank, num_workers):
                s, k = d % nstreams, d // nstreams
                if s not in streams:
                    streams[s] = _PlanStream(plan.streams[s], self.shuffle_buffer, self.handler, self.cache_dir, k,
                                             [count for _, count in self.shards], spans)
                yield from streams[s].batch(k)
        finally:
            for stream in streams.values():
                stream.close()
            if spans is not None:
                spans.close()

    def check_stage(self, pipeline: Any, stage: Any) -> None:
        """Refuse a shuffle appended to a pipeline on ``ExactSamples``, and any stage after a
        DataLoader over one (NOTE [exact epochs ...], The contract and State)."""
        if isinstance(pipeline.pipeline[0], DataLoader):
            raise ValueError(f"no stage may follow the DataLoader of a WebLoader over ExactSamples ({stage!r}): "
                             f"the batch count that state_dict() saves is taken there; put the stage in the "
                             f"dataset's pipeline instead")
        shuffles = (isinstance(stage, Curried) and stage.f is shuffle.f) or isinstance(stage, detshuffle)
        if shuffles and pipeline.pipeline[0] is self:
            raise ValueError("a .shuffle() stage after ExactSamples mixes samples across batches, so epochs "
                             "are no longer exact nor resumable: use ExactSamples(..., shuffle_buffer=n)")

    def hand_out(self, pipeline: Any, batches: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The pipeline's batches for one epoch, counted into ``pipeline.position`` (the next epoch's
        start once all are out); exactly the planned number of them (NOTE [exact epochs in the
        reference path])."""
        loader = pipeline.pipeline[0]
        num_workers = loader.num_workers if isinstance(loader, DataLoader) else 0
        if isinstance(loader, DataLoader):
            if loader.persistent_workers:
                raise ValueError("persistent_workers=True keeps the workers' copy of the dataset from the first "
                                 "epoch, so set_epoch() and load_state_dict() would not reach it: with "
                                 "ExactSamples leave persistent_workers off")
            if not getattr(loader, "in_order", True):
                raise ValueError("in_order=False hands batches out in whatever order workers make them, so "
                                 "state_dict() could not say which were handed out: leave it on with ExactSamples")
            dataset: Any = loader.dataset  # this source's pipeline, a CountedSource
            dataset.counted_outside = True  # iterated in this process (no workers): count here only
        done, streams = self.start(num_workers)
        total = len(self)
        epoch = self.epoch
        pipeline.position = (epoch, done, streams)
        last, iterator, complete = None, batches(), False
        try:
            for batch in iterator:
                if done == total:
                    warnings.warn(f"the pipeline made more than the {total} batches planned for epoch {epoch}: "
                                  f"does it end with batched({self.batch_size})? The rest are not handed out")
                    break
                done += 1
                pipeline.position = (epoch, done, streams)
                last = batch
                yield batch
            if done < total:
                if last is None:
                    raise ValueError(f"the pipeline made no batch of the {total} planned for epoch {epoch}")
                warnings.warn(f"the pipeline made {total - done} fewer batches than the {total} planned for "
                              f"epoch {epoch} (a stage or the handler dropped samples): the last batch is "
                              f"repeated so that every rank hands out {total}, and a resume from this "
                              f"epoch is no longer exact")
                while done < total:
                    done += 1
                    pipeline.position = (epoch, done, streams)
                    yield last
            complete = True
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            if complete:  # the next iteration runs the next epoch
                self.epoch, self.resume = epoch + 1, None
                pipeline.position = (epoch + 1, 0, max(1, num_workers))
            else:  # left early: the next iteration goes on from here
                self.resume = {"epoch": epoch, "batches_done": done, "streams": streams}
