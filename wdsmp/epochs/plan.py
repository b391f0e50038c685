"""The plan of an epoch: which stream of which rank reads which samples, in what order.

A rank's epoch is cut into streams: a stream is a run of whole batches of
samples, read front to back with its own seed; the loader runs them in its
workers (one stream per worker when the epoch starts), ``ExactSamples`` in
the DataLoader's. Pure and deterministic: every rank computes the same
global plan from the same arguments and keeps its own streams, so ranks
never need to talk, and a plan can be rebuilt mid-epoch from a
``PlanPosition``. FastLoader and ``ExactSamples`` both follow it.

NOTE [plan: exactly once, equal batches]
    * Order. Shards are permuted by ``random.Random(make_seed(seed, epoch))``
      (kept in order with ``shuffle=False``), the same on every rank. With all
      sample counts known this makes one global sequence of N samples.
    * "samples" mode (all counts known): every rank gets the same budget of P
      samples, a multiple of the batch size B, so every rank yields exactly
      P / B full batches and DDP's collectives line up.
        - ``policy="drop"``: P = floor(floor(N / world) / B) * B. The last
          N - world * P samples of the sequence are read by nobody this epoch
          (``EpochPlan.dropped``); they change with the order every epoch.
        - ``policy="pad"``: P = ceil(ceil(N / world) / B) * B. The sequence is
          extended with world * P - N samples taken again from its start
          (``ShardRange.pad``), as torch's DistributedSampler pads.
      Rank r reads positions [r * P, (r + 1) * P). Ranges split shards at
      sample granularity: a shard may be shared by two ranks or streams, the
      second reading through the first's samples to reach its own.
    * Streams. A rank's batches are dealt round-robin over its S streams:
      batch i comes from stream i % S, as that stream's batch i // S. Each
      stream reads one contiguous run of the rank's positions
      (``StreamPlan.ranges``), its batches one after the other, so it reads
      its shards front to back. The streams are disjoint and cover the
      budget: with the ranks' budgets, every sample of the sequence is read
      exactly once (drop: except ``dropped``; pad: plus the repeats).
    * Delivery order and resume. The loader hands out batches in index order
      (round robin over streams). After d batches stream s has delivered
      ``round_robin_share(d, S)[s]`` batches, its first ones, so
      ``PlanPosition(epoch, d)`` resumes with exactly the rest:
      ``StreamPlan.skip_batches`` counts the delivered ones and
      ``StreamPlan.shards()`` starts after them. A stream that reorders its
      samples (a shuffle buffer) must instead replay ``shards(resume=False)``
      and drop its first ``skip_batches`` batches. Resuming needs the same
      shards, seed, world size, batch size and policy; a position that
      carries per-stream counts (``worker_batches``, named for the loader's
      workers, one per stream when the epoch started) is checked against
      ``num_streams``.
    * Workers. A loader resumed with a different number of workers keeps
      the epoch's streams (as many as the workers it started with) and gives
      each worker whole streams (``streams_of_workers``); a worker with
      several makes their batches interleaved in delivery order. Every stream
      goes on from where it stood, and the batches come in the order of a
      run that was never stopped.
    * Order. ``order="global"`` makes the sequence a permutation of all N
      samples (``SampleSequence``, from ``make_seed(seed, epoch, "samples")``
      through PCG64's raw stream, the same with any numpy) instead of the
      shards' samples in shard order; budgets and positions are the same.
      A stream reads positions (``spans``), one sample each, not shard
      ranges, and needs no run of its own: stream s takes the rank's batches
      s, s + S, ..., so the first d batches a rank delivered are its first
      d * B positions, whatever its number of streams.
    * Elastic. A position with ``origin`` (W, d, S) continues an epoch that
      W ranks of S streams left after d batches each: the rest, the positions
      their streams had not delivered (rank by rank, stream by stream), is the
      sequence now, dealt to this plan's ranks and streams as above (budget
      from its length and the policy, runs of it per stream). Every rank of
      the origin stood at the same place, so any one rank's state gives it
      (in shard order, where the rest follows each stream's run, every rank
      must have had the same number of streams). A rest too small for a batch
      per rank ("drop") leaves an epoch of no batches.
    * "shards" mode (some count unknown, or ``exact=False``): shard
      granularity. The epoch's order is cut into world equal runs of whole
      shards: floor(S / world) each (drop, the rest in ``dropped``) or
      ceil(S / world) (pad, repeated shards marked ``pad``); shard j of a
      rank goes to stream j % S. Every shard is read once, but batch counts
      are unknown and may differ between ranks: for DDP give counts (from an
      index) or use resampled mode. The
      loader delivers round robin, skipping streams that are done, so a
      position needs ``worker_batches`` (what each stream delivered), and a
      stream reads and drops ``StreamPlan.discard`` samples before its first
      batch.
    * "resampled" mode: each stream draws shards with replacement, forever,
      from a generator seeded by (seed, epoch, rank, stream); an epoch is
      ``epoch_batches`` batches per rank, dealt round robin as above. Resume
      skips whole drawn shards by count when counts are known, else discards.
"""

from __future__ import annotations

import bisect
import functools
import random
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from .._internal.seeding import make_seed
from .._internal.validation import count as count_of
from ..shards.index import shard_table

__all__ = [
    "ORDERS",
    "POLICIES",
    "EpochPlan",
    "EpochPlanner",
    "MAX_RANKS",
    "MAX_STREAMS",
    "PlanPosition",
    "SampleSequence",
    "ShardRange",
    "StreamPlan",
    "plan_epoch",
    "round_robin_share",
    "shard_order",
    "streams_in",
    "streams_of_workers",
]

POLICIES = ("drop", "pad")
ORDERS = ("global", "shards")

_Runs = Tuple[Tuple[int, int], ...]  # runs (start, stop) of positions of an epoch's sequence


@dataclass(frozen=True)
class ShardRange:
    """Samples ``[start, stop)`` of shard number ``shard`` (its index in the shard list) at ``url``.

    ``stop`` is None when the shard's sample count is unknown (to the end).
    ``pad`` marks samples repeated to fill a rank's budget.
    """

    shard: int
    url: str
    start: int
    stop: Optional[int]
    pad: bool = False

    @property
    def count(self) -> Optional[int]:
        return None if self.stop is None else self.stop - self.start


@dataclass(frozen=True)
class PlanPosition:
    """Where an epoch stands: ``batches_done`` batches of ``epoch`` delivered on this rank.

    ``worker_batches`` (optional in the exact modes, needed in "shards" mode)
    is how many of them each stream delivered (the loader's state names them
    for its workers, one per stream when the epoch started).
    ``worker_consumed`` (optional) is how many items each stream had taken
    from its samples (after the user's stages and the shuffle buffer) for
    them: with it a resumed stream replays its ranges and drops exactly
    those, so a resume stays exact when stages or the error handler drop
    samples. ``origin`` (``(world_size, batches_done, num_streams)``) marks an
    epoch resumed on another number of ranks: what that many ranks of that
    many streams had not delivered after ``batches_done`` batches each is the
    epoch now, dealt anew (NOTE [plan: exactly once, equal batches], Elastic);
    ``batches_done`` then counts the batches of that rest.
    """

    epoch: int
    batches_done: int = 0
    worker_batches: Optional[Tuple[int, ...]] = None
    worker_consumed: Optional[Tuple[int, ...]] = None
    origin: Optional[Tuple[int, int, int]] = None

    def __post_init__(self) -> None:
        count_of(self.epoch, "epoch")
        count_of(self.batches_done, "batches_done")
        if self.worker_batches is not None:
            streams_in(self.worker_batches, "worker_batches")
            counts = tuple(count_of(n, "worker_batches entries") for n in self.worker_batches)
            if sum(counts) != self.batches_done:
                raise ValueError(f"worker_batches {counts} do not add up to batches_done={self.batches_done}")
            object.__setattr__(self, "worker_batches", counts)
        if self.worker_consumed is not None:
            consumed = tuple(count_of(n, "worker_consumed entries") for n in self.worker_consumed)
            if self.worker_batches is None or len(consumed) != len(self.worker_batches):
                raise ValueError("worker_consumed needs worker_batches, one entry per worker")
            object.__setattr__(self, "worker_consumed", consumed)
        if self.origin is not None:
            try:
                world, done, streams = self.origin
            except (TypeError, ValueError):
                raise ValueError(f"origin must be (world_size, batches_done, num_streams), "
                                 f"not {self.origin!r}") from None
            object.__setattr__(self, "origin", (count_of(world, "origin's world_size", 1, MAX_RANKS),
                                                count_of(done, "origin's batches_done"),
                                                count_of(streams, "origin's num_streams", 1, MAX_STREAMS)))


# The most streams and ranks a plan (or a saved state) may name: far above any real job's,
# and low enough that planning that many, which loops over them, stays quick.
MAX_STREAMS = 1 << 16
MAX_RANKS = 1 << 20


def streams_in(entries: object, what: str) -> int:
    """How many streams a state's per-stream list ``entries`` names: a list or tuple of at most
    ``MAX_STREAMS``, checked before anything loops over it; ValueError naming ``what``."""
    if not isinstance(entries, (list, tuple)) or not 1 <= len(entries) <= MAX_STREAMS:
        shown = f"{len(entries)} entries" if isinstance(entries, (list, tuple)) else repr(entries)[:80]
        raise ValueError(f"{what} must be a list of 1 to {MAX_STREAMS} entries, one per stream, not {shown}")
    return len(entries)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_robin_share(batches: int, num_streams: int) -> Tuple[int, ...]:
    """How many of ``batches`` batches dealt round robin each of ``num_streams`` streams gets."""
    quotient, remainder = divmod(batches, num_streams)
    return tuple(quotient + (s < remainder) for s in range(num_streams))


def streams_of_workers(num_streams: int, num_workers: int) -> Tuple[Tuple[int, ...], ...]:
    """The streams each of ``num_workers`` workers runs, one after the other: stream s goes to
    worker s % num_workers (NOTE [plan: exactly once, equal batches], Workers)."""
    return tuple(tuple(range(w, num_streams, num_workers)) for w in range(num_workers))


def shard_order(nshards: int, seed: object, epoch: int, shuffle: bool = True) -> List[int]:
    """The epoch's order of shard indices: a permutation from ``make_seed(seed, epoch)``."""
    order = list(range(nshards))
    if shuffle:
        random.Random(make_seed(seed, epoch)).shuffle(order)
    return order


@functools.lru_cache(maxsize=2)
def _permutation(total: int, seed: int) -> np.ndarray:
    """A permutation of ``range(total)`` from ``seed``, the same with any numpy: the indices sorted
    by PCG64's raw output (a stream numpy keeps stable), ties (1 in 2**64) by index."""
    keys = np.random.PCG64(seed).random_raw(total)
    order = np.argsort(keys, kind="stable").astype(np.int32 if total < 2**31 else np.int64)
    order.flags.writeable = False
    return order


@dataclass(frozen=True)
class SampleSequence:
    """An epoch's samples in global order: every sample of every shard, permuted by ``seed`` (the
    same on every rank and worker). ``shards``: ``(url, count)`` by shard number. Position ``p``
    of the sequence is sample ``permutation[p]`` of the shards laid end to end; positions past the
    end wrap to its start (padding)."""

    shards: Tuple[Tuple[str, int], ...]
    seed: int

    @functools.cached_property
    def _starts(self) -> np.ndarray:
        return np.cumsum([0] + [count for _, count in self.shards], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def refs(self, start: int, stop: int, chunk: int = 4096) -> Iterator[Tuple[int, int, str, bool]]:
        """``(shard, index, url, pad)`` of positions ``[start, stop)``: sample ``index`` of shard
        number ``shard``, ``pad`` for a position past the end."""
        total, starts = len(self), self._starts
        order = _permutation(total, self.seed)
        for first in range(start, stop, chunk):
            positions = np.arange(first, min(first + chunk, stop), dtype=np.int64)
            ids = order[positions % total]
            shards = np.searchsorted(starts, ids, side="right") - 1
            for position, shard, sample in zip(positions.tolist(), shards.tolist(), (ids - starts[shards]).tolist()):
                yield shard, sample, self.shards[shard][0], position >= total

    def ranges(self, start: int, stop: int) -> Tuple[ShardRange, ...]:
        """The samples of positions ``[start, stop)`` as one-sample ``ShardRange``s (for few)."""
        return tuple(ShardRange(shard, url, index, index + 1, pad) for shard, index, url, pad in self.refs(start, stop))


def _skip(ranges: Iterable[ShardRange], nsamples: int) -> Iterator[ShardRange]:
    """``ranges`` without their first ``nsamples`` samples (counts known)."""
    for r in ranges:
        assert r.count is not None  # "samples" mode: every count is known
        if nsamples >= r.count:
            nsamples -= r.count
            continue
        yield ShardRange(r.shard, r.url, r.start + nsamples, r.stop, r.pad)
        nsamples = 0


@dataclass(frozen=True)
class StreamPlan:
    """One stream of an epoch, number ``stream`` of ``num_streams``; picklable, sent to the
    worker that runs it.

    ``ranges`` is the stream's whole share of the epoch (empty in resampled
    mode, where ``pool`` holds the ``(url, count)`` pairs to draw from);
    ``num_batches`` the batches it makes in the epoch (None: unknown);
    ``skip_batches`` how many of them were delivered before a resume;
    ``discard`` how many samples it must read and drop before its first batch
    (counts unknown); ``consumed`` (None unless resumed from a position that
    has it) how many items of its sample stream, after stages and shuffling,
    the delivered batches took: the stream is then read from the start of its
    ranges and exactly those are dropped instead. ``seed`` seeds its own randomness
    (shuffle buffers, augmentation). See NOTE [plan: exactly once, equal batches].
    """

    mode: str
    epoch: int
    rank: int
    stream: int
    num_streams: int
    batch_size: int
    seed: int
    ranges: Tuple[ShardRange, ...]
    num_batches: Optional[int]
    skip_batches: int
    discard: int
    pool: Tuple[Tuple[str, Optional[int]], ...] = ()
    consumed: Optional[int] = None
    sequence: Optional[SampleSequence] = None
    spans: Tuple[Tuple[int, int], ...] = ()

    @property
    def order(self) -> str:
        """"global" when the stream reads positions of a ``SampleSequence``, else "shards"."""
        return "shards" if self.sequence is None else "global"

    def samples(self, resume: bool = True) -> Iterator[Tuple[int, int, str, bool]]:
        """In global order, ``(shard, index, url, pad)`` of the samples to read, in order; without
        the delivered batches' samples (``resume=False``: from the start of the stream)."""
        skip = self.skip_batches * self.batch_size if resume else 0
        for start, stop in self.spans:
            if skip >= stop - start:
                skip -= stop - start
                continue
            assert self.sequence is not None  # a stream has spans in global order only
            yield from self.sequence.refs(start + skip, stop)
            skip = 0

    def repeated(self) -> Tuple[ShardRange, ...]:
        """The ranges this stream reads a second time in the epoch (``ShardRange.pad``)."""
        if self.sequence is None:
            return tuple(r for r in self.ranges if r.pad)
        total = len(self.sequence)
        return tuple(r for start, stop in self.spans if stop > total
                     for r in self.sequence.ranges(max(start, total), stop))

    def shards(self, resume: bool = True) -> Iterator[ShardRange]:
        """The shard ranges to read, in order; without the delivered batches' samples when they can
        be skipped by count (``resume=False``: from the start of the stream). Infinite in resampled mode.
        In global order, see ``samples``."""
        if self.sequence is not None:
            raise ValueError("a stream in global order reads samples, not shard ranges: see StreamPlan.samples")
        if self.mode == "resampled":
            return self._draws(resume)
        if resume and self.mode == "samples":
            return _skip(self.ranges, self.skip_batches * self.batch_size)
        return iter(self.ranges)

    def _draws(self, resume: bool) -> Iterator[ShardRange]:
        rng = random.Random(make_seed(self.seed, "resampled"))
        known = all(count is not None for _, count in self.pool)
        skip = self.skip_batches * self.batch_size if resume and known else 0
        while True:
            shard = rng.randrange(len(self.pool))
            url, count = self.pool[shard]
            if count is None:
                yield ShardRange(shard, url, 0, None)
            elif skip >= count:
                skip -= count
            else:
                yield ShardRange(shard, url, skip, count)
                skip = 0


@dataclass(frozen=True)
class EpochPlan:
    """One rank's plan of one epoch: its streams, and what no rank reads.

    ``batches_per_rank`` is the same on every rank (None in "shards" mode);
    ``order`` is the epoch's shard order, shared by all ranks; ``dropped``
    the samples (or shards) nobody reads this epoch.
    """

    mode: str
    epoch: int
    rank: int
    world_size: int
    num_streams: int
    batch_size: int
    policy: str
    batches_per_rank: Optional[int]
    batches_done: int
    order: Tuple[int, ...]
    streams: Tuple[StreamPlan, ...]
    dropped: Tuple[ShardRange, ...]
    origin: Optional[Tuple[int, int, int]] = None

    @property
    def remaining(self) -> Optional[int]:
        """Batches left to deliver on this rank (None when unknown)."""
        return None if self.batches_per_rank is None else self.batches_per_rank - self.batches_done

    @property
    def repeated(self) -> Tuple[ShardRange, ...]:
        """The ranges this rank reads a second time in the epoch (``ShardRange.pad``)."""
        return tuple(r for stream in self.streams for r in stream.repeated())

    def notice(self) -> Optional[str]:
        """In "shards" mode, a sentence naming the shards and samples the epoch leaves out (said by
        rank 0 only: every rank has the same) or this rank reads twice; None when there are none
        or the epoch is exact."""
        dropped = self.dropped if self.rank == 0 else ()
        if self.mode != "shards" or not (dropped or self.repeated):
            return None
        parts = [f"{_amount(ranges)} {what}" for ranges, what in ((dropped, "read by no rank"),
                                                                    (self.repeated, f"read twice by rank {self.rank}"))
                 if ranges]
        return (f"epoch {self.epoch} deals out whole shards to ranks (exact=False, or sample counts unknown): "
                f"{' and '.join(parts)}, by policy={self.policy!r}; ranks may hand out different numbers of "
                f"batches. Exact epochs need every shard's sample count (a shard index) and exact=True")


def _range_samples(ranges: Sequence[ShardRange]) -> Optional[int]:
    """The samples of ``ranges``; None when a count is unknown."""
    return None if any(r.count is None for r in ranges) else sum(cast(int, r.count) for r in ranges)


def _amount(ranges: Sequence[ShardRange]) -> str:
    shards, samples = len(ranges), _range_samples(ranges)
    counted = "samples unknown" if samples is None else f"{samples} sample{'s' * (samples != 1)}"
    return f"{shards} shard{'s' * (shards != 1)} ({counted})"


def _slice(entries: Sequence[Tuple[int, str, int]], cum: Sequence[int], start: int,
           stop: int) -> Tuple[ShardRange, ...]:
    """Ranges of global positions ``[start, stop)`` of the sequence ``entries``; positions past its
    end wrap to its start as padding."""
    total, ranges, p = cum[-1], [], start
    while p < stop:
        lap, q = divmod(p, total)
        j = bisect.bisect_right(cum, q) - 1  # the shard holding position q (empty shards skipped)
        shard, url, _ = entries[j]
        take = min(stop - p, cum[j + 1] - q)
        ranges.append(ShardRange(shard, url, q - cum[j], q - cum[j] + take, lap > 0))
        p += take
    return tuple(ranges)


def _consumed(position: PlanPosition, shares: Sequence[int]) -> Tuple[int, ...]:
    """Per-stream delivered batches of an exact-mode position: its ``worker_batches`` (each
    within its stream's ``shares``), else the round-robin share of ``batches_done``."""
    if position.worker_batches is None:
        return round_robin_share(position.batches_done, len(shares))
    done = position.worker_batches
    if len(done) != len(shares) or any(d > n for d, n in zip(done, shares)):
        raise ValueError(f"position's worker_batches {done} do not fit the plan's {len(shares)} streams of "
                         f"{shares} batches: was it saved with other loader settings?")
    return done


def _budget(total: int, world: int, bsize: int, policy: str, empty: bool = False) -> int:
    """Samples per rank (a multiple of ``bsize``) of a sequence of ``total`` samples; ``empty``:
    none may be the answer (the rest of an epoch too small for one batch per rank)."""
    if policy == "drop":
        budget = total // world // bsize * bsize
        if budget == 0 and not empty:
            raise ValueError(f"{total} samples are too few for {world} ranks of batch_size {bsize} "
                             f"with policy='drop' (not one full batch per rank); use policy='pad'")
        return budget
    return _ceil_div(_ceil_div(total, world), bsize) * bsize


def _rest(total: int, origin: Tuple[int, int, int], bsize: int, policy: str, interleaved: bool) -> _Runs:
    """The positions that ``origin``'s ranks had not delivered (NOTE [plan: ...], Elastic): runs
    ``(start, stop)`` of the epoch's sequence, rank by rank (stream by stream unless the streams
    take ``interleaved`` batches: then a rank delivered its first ones, whatever its streams)."""
    world, done, nstreams = origin
    budget = _budget(total, world, bsize, policy)
    if done > budget // bsize:
        raise ValueError(f"the state is past the end of the epoch it was saved in ({budget // bsize} batches "
                         f"per rank on {world} ranks)")
    if interleaved:
        return tuple((rank * budget + done * bsize, (rank + 1) * budget) for rank in range(world)
                     if done * bsize < budget)
    shares, delivered = round_robin_share(budget // bsize, nstreams), round_robin_share(done, nstreams)
    runs = []
    for rank in range(world):
        start = rank * budget
        for share, taken in zip(shares, delivered):
            if taken < share:
                runs.append((start + taken * bsize, start + share * bsize))
            start += share * bsize
    return tuple(runs)


def _within(runs: Sequence[Tuple[int, int]], start: int, stop: int) -> _Runs:
    """Positions ``[start, stop)`` of the runs laid end to end, as runs of the epoch's sequence;
    past their end they wrap to their start."""
    length = sum(b - a for a, b in runs)
    picked, p = [], start
    while p < stop:
        q = p % length
        for a, b in runs:
            if q < b - a:
                take = min(stop - p, b - a - q)
                picked.append((a + q, a + q + take))
                p += take
                break
            q -= b - a
    return tuple(picked)


def _samples_plan(table: Sequence[Tuple[str, int]], order: Sequence[int], position: PlanPosition, rank: int,
                  world: int, nstreams: int, bsize: int, policy: str, sequence: Optional[SampleSequence],
                  ) -> Tuple[int, Tuple[int, ...], Tuple[int, ...], Sequence[Tuple[ShardRange, ...]], Sequence[_Runs],
                         Tuple[ShardRange, ...]]:
    """Budgets and each stream's share of the epoch's sequence of samples: shard ranges in shard
    order (``sequence`` None), else positions of ``sequence`` (spans)."""
    entries = [(i, table[i][0], table[i][1]) for i in order]
    cum = [0]
    for _, _, count in entries:
        cum.append(cum[-1] + count)
    total = cum[-1]
    if total == 0:
        raise ValueError("the shards hold no samples")
    space: Callable[[int, int], _Runs]
    left: _Runs
    if position.origin is None:
        budget = _budget(total, world, bsize, policy)
        space = lambda a, b: ((a, b),)  # noqa: E731  positions of the sequence as they are
        left = ((world * budget, total),) if world * budget < total else ()
    else:  # the rest of an epoch resumed on another number of ranks
        rest = _rest(total, position.origin, bsize, policy, sequence is not None)
        length = sum(b - a for a, b in rest)
        budget = _budget(length, world, bsize, policy, empty=True) if length else 0
        space = functools.partial(_within, rest)
        left = space(world * budget, length) if world * budget < length else ()
    nbatches = budget // bsize
    if position.batches_done > nbatches:
        raise ValueError(f"position {position} is past the end of the epoch ({nbatches} batches per rank)")
    shares = round_robin_share(nbatches, nstreams)
    done = _consumed(position, shares)
    first = rank * budget
    if sequence is None:  # each stream a run of the rank's share: its shards read front to back
        ranges, start = [], first
        for w in range(nstreams):
            runs = space(start, start + shares[w] * bsize)
            ranges.append(tuple(r for a, b in runs for r in _slice(entries, cum, a, b)))
            start += shares[w] * bsize
        dropped = tuple(r for a, b in left for r in _slice(entries, cum, a, b))
        return nbatches, shares, done, ranges, [()] * nstreams, dropped
    # Batch i of the rank from stream i % S: the first d batches are the first d * B positions.
    spans = [tuple(run for i in range(w, nbatches, nstreams)
                   for run in space(first + i * bsize, first + (i + 1) * bsize)) for w in range(nstreams)]
    dropped = tuple(r for a, b in left for r in sequence.ranges(a, b))
    return nbatches, shares, done, [()] * nstreams, spans, dropped


def _shards_plan(table: Sequence[Tuple[str, Optional[int]]], order: Sequence[int], position: PlanPosition,
                 rank: int, world: int, nstreams: int,
                 policy: str) -> Tuple[List[Tuple[ShardRange, ...]], Tuple[ShardRange, ...], Tuple[int, ...]]:
    if position.batches_done and position.worker_batches is None:
        raise ValueError("resuming an epoch whose sample counts are unknown needs the position's "
                         "worker_batches (what each worker delivered)")
    if position.worker_batches is not None and len(position.worker_batches) != nstreams:
        raise ValueError(f"position has worker_batches for {len(position.worker_batches)} workers, "
                         f"the plan has {nstreams} streams")
    nshards = len(order)
    if policy == "drop":
        per_rank = nshards // world
        if per_rank == 0:
            raise ValueError(f"{nshards} shards are too few for {world} ranks with policy='drop'; "
                             f"use policy='pad' or give sample counts")
    else:
        per_rank = _ceil_div(nshards, world)
    sequence = [(i, False) for i in order] + [(order[j % nshards], True) for j in range(per_rank * world - nshards)]
    mine = sequence[rank * per_rank:(rank + 1) * per_rank]
    ranges = [tuple(ShardRange(i, table[i][0], 0, table[i][1], pad) for i, pad in mine[w::nstreams])
               for w in range(nstreams)]
    dropped = tuple(ShardRange(i, table[i][0], 0, table[i][1]) for i, _ in sequence[per_rank * world:])
    done = position.worker_batches or (0,) * nstreams
    return ranges, dropped, done


def plan_epoch(shards: Iterable[Union[str, Tuple[str, Optional[int]]]], position: Union[int, PlanPosition] = 0, *,
               batch_size: int, seed: object = 0, rank: int = 0, world_size: int = 1, num_streams: int = 1,
               policy: str = "drop", shuffle: bool = True, resampled: bool = False,
               epoch_batches: Optional[int] = None, exact: bool = True, order: str = "shards") -> EpochPlan:
    """This rank's plan of an epoch; see NOTE [plan: exactly once, equal batches].

    ``shards``: URLs, or ``(url, count)`` pairs (count None: unknown).
    ``position``: an epoch number, or a ``PlanPosition`` to resume from.
    ``policy``: "drop" or "pad", to give every rank the same number of
    batches. ``resampled=True``: draw shards with replacement, forever; an
    epoch is then ``epoch_batches`` batches per rank (policy and shuffle do
    not apply). ``exact=False``: whole shards per rank ("shards" mode) even
    when every count is known. ``order="global"``: the epoch's sequence is a
    permutation of all samples (``SampleSequence``), not the shards' samples
    in shard order; it needs every count and exact=True.
    """
    plan = _plan_epoch(shards, position, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size,
                       num_streams=num_streams, policy=policy, shuffle=shuffle, resampled=resampled,
                       epoch_batches=epoch_batches, exact=exact, order=order)
    consumed = position.worker_consumed if isinstance(position, PlanPosition) else None
    if consumed is None:
        return plan
    if len(consumed) != plan.num_streams:
        raise ValueError(f"position has worker_consumed for {len(consumed)} workers, the plan has "
                         f"{plan.num_streams} streams")
    return replace(plan, streams=tuple(replace(stream, consumed=n) for stream, n in zip(plan.streams, consumed)))


@dataclass(frozen=True)
class EpochPlanner:
    """``plan_epoch`` with all but the position fixed: one loader's epochs, planned alike by the
    loader and by each of its workers (which get only the position of each epoch). ``shards``:
    ``(url, count)`` pairs; ``num_streams``: the streams of an epoch that starts afresh."""

    shards: Tuple[Tuple[str, Optional[int]], ...]
    batch_size: int
    seed: object = 0
    rank: int = 0
    world_size: int = 1
    num_streams: int = 1
    policy: str = "drop"
    shuffle: bool = True
    resampled: bool = False
    epoch_batches: Optional[int] = None
    exact: bool = True
    order: str = "shards"

    def plan(self, position: Union[int, PlanPosition]) -> EpochPlan:
        """The plan at ``position`` (an epoch number or a ``PlanPosition``); a position that counts
        its streams' batches (``worker_batches``) keeps that number of streams."""
        streams = self.num_streams
        if isinstance(position, PlanPosition) and position.worker_batches is not None:
            streams = len(position.worker_batches)
        return plan_epoch(self.shards, position, batch_size=self.batch_size, seed=self.seed, rank=self.rank,
                          world_size=self.world_size, num_streams=streams, policy=self.policy,
                          shuffle=self.shuffle, resampled=self.resampled, epoch_batches=self.epoch_batches,
                          exact=self.exact, order=self.order)


def _plan_epoch(shards: Iterable[Union[str, Tuple[str, Optional[int]]]], position: Union[int, PlanPosition], *,
                batch_size: int, seed: object, rank: int, world_size: int, num_streams: int, policy: str,
                shuffle: bool, resampled: bool, epoch_batches: Optional[int], exact: bool, order: str) -> EpochPlan:
    table = shard_table(shards)
    position = position if isinstance(position, PlanPosition) else PlanPosition(position)
    bsize = count_of(batch_size, "batch_size", 1)
    world = count_of(world_size, "world_size", 1, MAX_RANKS)
    rank = count_of(rank, "rank")
    nstreams = count_of(num_streams, "num_streams", 1, MAX_STREAMS)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world_size {world}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    epoch = position.epoch
    known = all(count is not None for _, count in table)
    seeds = [make_seed(seed, epoch, rank, w) for w in range(nstreams)]
    if resampled:
        nbatches = count_of(epoch_batches, "epoch_batches (needed with resampled=True)", 1)
        if known and sum(cast(int, count) for _, count in table) == 0:
            raise ValueError("the shards hold no samples")
        if position.batches_done > nbatches:
            raise ValueError(f"position {position} is past the end of the epoch ({nbatches} batches per rank)")
        if position.origin is not None:
            raise ValueError("a resampled epoch has no rest to deal out on another number of ranks")
        shares = round_robin_share(nbatches, nstreams)
        done = _consumed(position, shares)
        streams = tuple(StreamPlan("resampled", epoch, rank, w, nstreams, bsize, seeds[w], (), shares[w], done[w],
                                   0 if known else done[w] * bsize, table) for w in range(nstreams))
        return EpochPlan("resampled", epoch, rank, world, nstreams, bsize, policy, nbatches,
                         position.batches_done, (), streams, ())
    if epoch_batches is not None:
        raise ValueError("epoch_batches applies to resampled=True only; "
                         "without resampling an epoch is every shard once")
    shard_sequence = tuple(shard_order(len(table), seed, epoch, shuffle))
    if order == "global" and not (known and exact):
        raise ValueError("order='global' needs every shard's sample count and exact=True")
    if position.origin is not None and not (known and exact):
        raise ValueError("resuming on another number of ranks needs exact epochs: every shard's sample count "
                         "and exact=True")
    if known and exact:
        counted = cast(Tuple[Tuple[str, int], ...], table)
        sequence = SampleSequence(counted, make_seed(seed, epoch, "samples")) if order == "global" else None
        nbatches, shares, done, ranges, spans, dropped = _samples_plan(
            counted, shard_sequence, position, rank, world, nstreams, bsize, policy, sequence)
        streams = tuple(StreamPlan("samples", epoch, rank, w, nstreams, bsize, seeds[w], ranges[w], shares[w],
                                   done[w], 0, sequence=sequence, spans=spans[w]) for w in range(nstreams))
        return EpochPlan("samples", epoch, rank, world, nstreams, bsize, policy, nbatches,
                         position.batches_done, shard_sequence, streams, dropped, position.origin)
    ranges, dropped, done = _shards_plan(table, shard_sequence, position, rank, world, nstreams, policy)
    streams = tuple(StreamPlan("shards", epoch, rank, w, nstreams, bsize, seeds[w], ranges[w], None,
                               done[w], done[w] * bsize) for w in range(nstreams))
    return EpochPlan("shards", epoch, rank, world, nstreams, bsize, policy, None,
                     position.batches_done, shard_sequence, streams, dropped)
