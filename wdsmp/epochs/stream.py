"""How a stream reads its stretch of an epoch plan: the one reader that ExactSamples and
FastLoader's workers both run, so that both paths make the same samples in the same order and
resume at the same place.

A stream (a ``StreamPlan``) resumed after ``skip_batches`` delivered batches either skips
them by count (nothing reorders its samples: the plan leaves them out) or, where the order of
what follows depends on everything before, replays its stretch from the start and drops what
the delivered batches took: with a shuffle buffer (its state is everything read before), or
with ``consumed``, a position that counted the items that stages and the handler left (NOTE
[plan: exactly once, equal batches] in ``plan.py``). :func:`stream_start` decides which;
:func:`stream_samples` reads accordingly.
"""

import random
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

from .._internal.seeding import make_seed
from ..handlers import reraise_exception
from .plan import ShardRange, StreamPlan
from .ranges import buffer_shuffled, read_ranges
from .spans import SpanReader, read_positions

__all__ = ["StreamStart", "stream_samples", "stream_start"]

Sample = Dict[str, Any]
Stage = Callable[[Iterator[Sample]], Iterator[Sample]]


@dataclass(frozen=True)
class StreamStart:
    """Where a stream's reading starts: ``replay`` (read its stretch from the start, else skip the
    delivered batches by count), ``drop`` (items dropped after the stages and the buffer), and
    what is behind the start, counted from the stretch's start: ``taken`` items, ``read`` samples."""

    replay: bool
    drop: int
    taken: int
    read: int


def stream_start(plan: StreamPlan, shuffle_buffer: int) -> StreamStart:
    """How ``plan`` (a stream, perhaps resumed) starts reading with a buffer of ``shuffle_buffer``."""
    replay = shuffle_buffer > 1 or plan.consumed is not None
    delivered = plan.skip_batches * plan.batch_size
    if plan.consumed is not None:
        drop = plan.consumed
    else:
        drop = delivered if replay else plan.discard
    return StreamStart(replay, drop, drop if replay else delivered, 0 if replay else delivered)


def stream_samples(plan: StreamPlan, start: StreamStart, *, shuffle_buffer: int = 0,
                   stages: Sequence[Stage] = (), spans: Optional[SpanReader] = None,
                   handler: Callable[[BaseException], bool] = reraise_exception, cache_dir: Optional[str] = None,
                   clock: Any = None, counts: Optional[Sequence[Optional[int]]] = None,
                   shards: Callable[[Iterable[ShardRange]], Iterable[ShardRange]] = iter,
                   positions: Optional[Callable[[Iterable[Tuple[int, int, str, bool]]],
                                                Iterable[Tuple[int, int, str]]]] = None,
                   watch: Callable[[Iterator[Sample]], Iterator[Sample]] = iter) -> Iterator[Sample]:
    """The samples of ``plan`` from ``start``: read by span in global order (``spans``), else by
    shard range (``cache_dir``, ``clock`` and ``counts`` as ``read_ranges`` takes them); then
    ``stages``, the shuffle buffer, and the drop. ``shards`` and ``positions`` see the ranges and
    the sample positions on their way to the reader, ``watch`` the samples read, before the stages
    (FastLoader's workers announce and time them)."""
    resume = not start.replay
    if plan.order == "global":
        if spans is None:
            raise ValueError("a stream in global order reads its samples by span: it needs the SpanReader")
        refs = plan.samples(resume=resume)
        triples = _without_pad(refs) if positions is None else positions(refs)
        samples = watch(read_positions(spans, triples, handler))
    else:
        samples = watch(read_ranges(shards(plan.shards(resume=resume)), handler, cache_dir, clock, counts))
    for stage in stages:
        samples = stage(samples)
    if shuffle_buffer > 1:
        samples = buffer_shuffled(samples, shuffle_buffer, random.Random(make_seed(plan.seed, "shuffle")))
    return _dropped(samples, start.drop)


def _dropped(samples: Iterator[Sample], drop: int) -> Iterator[Sample]:
    """``samples`` without the first ``drop``; closing it closes ``samples`` (their files with them)."""
    try:
        yield from islice(samples, drop, None)
    finally:
        close = getattr(samples, "close", None)
        if close is not None:
            close()


def _without_pad(refs: Iterable[Tuple[int, int, str, bool]]) -> Iterator[Tuple[int, int, str]]:
    return ((shard, index, url) for shard, index, url, _ in refs)
