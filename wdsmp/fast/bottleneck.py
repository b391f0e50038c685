"""The loader's bottleneck in words a user can act on, from its stage figures (``stats.py``).

The training loop either waits for data or it does not. When it waits less
than ``WAITING`` of its time, training is the bottleneck. Otherwise the
workers' largest share of time names it: reading shards (input-bound, with
advice by where the shards are), decoding and resizing (decode-bound), the
user's stages, or waiting for free slots while the training loop waits too
(the main process hands batches out slowly). Workers busy less than ``IDLE``
of the time are said too: more workers would not help then either.
"""

import os
from typing import Any, Dict, Optional, Sequence
from urllib.parse import urlsplit

from .options import default_workers

__all__ = ["WAITING", "diagnose", "shard_source"]

WAITING = 0.15  # the share of its time the training loop may wait for data and still be the bottleneck
IDLE = 0.5  # workers busy less than this while the training loop waits: said, with the likely causes
MOSTLY_IDLE = 0.2  # ... and less than this: no stage is the bottleneck, starting and turning over are


def shard_source(urls: Sequence[str]) -> str:
    """Where shards ``urls`` are, for the advice: ``local files in DIR`` or ``scheme://host``
    of the first remote one."""
    remote = [url for url in urls if "://" in url and not url.startswith("file:") or url.startswith("pipe:")]
    if not remote:
        first = urls[0] if urls else "."
        path = urlsplit(first).path if first.startswith("file:") else first
        return f"local files in {os.path.dirname(os.path.abspath(path))}"
    url = remote[0]
    if url.startswith("pipe:"):
        return "pipe: commands"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _share(value: float) -> str:
    return f"{value:.0%}"


def _input_advice(figures: Dict[str, Any], source: str, cache_dir: Optional[str]) -> str:
    if source.startswith("local files"):
        return "the disk is slow for this rate: put the shards on a faster disk, or where the page cache holds them"
    if cache_dir is None:
        return "use cache_dir= on a local disk, so that later epochs read local copies"
    if figures["shards"]["cache_misses"]:
        return f"the shards are being fetched into cache_dir ({cache_dir}); later epochs read the local copies"
    return f"the disk holding cache_dir ({cache_dir}) is slow for this rate"


def _decode_advice(figures: Dict[str, Any], num_workers: int) -> str:
    cpus = default_workers()
    more = (f"more workers ({num_workers} now, {cpus} CPUs for this process)" if num_workers < cpus
            else "more CPUs")
    advice = f"{more} or smaller JPEGs would help"
    decode = figures["decode"]
    if decode["jpeg"] and not decode["region"]:
        advice += ("; region decoding is off (wdsmp was built without libjpeg-turbo's headers, or "
                   "WDSMP_PUREPYTHON=1): see `wdsmp doctor`")
    return advice


def _idle(busy: float) -> str:
    if busy >= IDLE:
        return ""
    return (f"; the workers were idle {_share(1 - busy)} of the time (epochs of fewer batches than workers, "
            f"or starting and ending often)")


def diagnose(figures: Dict[str, Any], *, num_workers: int, source: str, cache_dir: Optional[str] = None) -> str:
    """The bottleneck of ``figures`` (``LoaderStats``'s, with ``batches``) in one sentence,
    beginning with its name: ``training-bound``, ``transfer-bound``, ``input-bound``,
    ``decode-bound``, ``stage-bound``, ``delivery-bound``, ``loader-bound`` or ``startup-bound`` (or
    ``starting`` before the second batch: the first one's wait is start-up)."""
    sentence = _diagnose(figures, num_workers, source, cache_dir)
    if figures.get("pinned") is False:
        sentence += (f"; .cuda() stages every batch through a pinned copy, the ring could not be pinned "
                     f"({figures.get('pin_error')})")
    return sentence


def _diagnose(figures: Dict[str, Any], num_workers: int, source: str, cache_dir: Optional[str]) -> str:
    main = figures["wait_s"] + figures["training_s"] + figures["transfer_s"]
    if not figures["batches"] or main <= 0:
        return "starting: too few batches handed out to tell"
    waited, busy = figures["wait_fraction"], figures["workers_busy"]
    if waited < WAITING:
        if figures["transfer_s"] > figures["training_s"]:
            return (f"transfer-bound: copies to the GPU took {_share(figures['transfer_s'] / main)} of the time, "
                    f"waiting for data {_share(waited)}: the loader keeps up; see .cuda()'s depth= and dtype=")
        return (f"training-bound: the training loop held the batches {_share(figures['training_s'] / main)} of "
                f"the time and waited for data {_share(waited)}, workers busy {_share(busy)}: the loader keeps up, "
                f"more workers would not help")
    if busy < MOSTLY_IDLE:
        return (f"startup-bound: training waited {_share(waited)} of the time while the workers were busy only "
                f"{_share(busy)}: the run is mostly workers starting and epochs turning over (a short run, or "
                f"epochs of few batches per worker); measure longer, or with fewer workers")
    return _loader_bound(figures, f"training waited {_share(waited)} of the time", num_workers, source,
                         cache_dir) + _idle(busy)


def _loader_bound(figures: Dict[str, Any], waiting: str, num_workers: int, source: str,
                  cache_dir: Optional[str]) -> str:
    """The sentence for a run whose training loop waited for data: the workers' largest share."""
    seconds = {name: stage["seconds"] for name, stage in figures["stages"].items()}
    work = sum(seconds.values()) - seconds["slot_wait"]
    if work <= 0 or seconds["slot_wait"] > work:
        return (f"delivery-bound: {waiting} while workers waited for free slots: the main process hands "
                f"batches out slowly (copy=True copies, .cuda() transfers)")
    groups = {"input": seconds["fetch"] + seconds["split"], "decode": seconds["decode"] + seconds["resize"],
              "stages": seconds["stages"], "other": seconds["write"] + seconds["other"]}
    largest = max(groups, key=groups.__getitem__)
    if largest == "input":
        if seconds["fetch"] >= seconds["split"]:
            return (f"input-bound: {_share(seconds['fetch'] / work)} of worker time is reading shards from "
                    f"{source}, {waiting}: {_input_advice(figures, source, cache_dir)}")
        return (f"input-bound: {_share(seconds['split'] / work)} of worker time is unpacking shards (tar, gzip), "
                f"{waiting}: uncompressed shards or more workers would help")
    if largest == "decode":
        return (f"decode-bound: workers busy {_share(figures['workers_busy'])}, {waiting}: "
                f"{_decode_advice(figures, num_workers)}")
    if largest == "stages":
        return (f"stage-bound: {_share(seconds['stages'] / work)} of worker time is in the stages= given, "
                f"{waiting}: make them cheaper, or use more workers")
    return (f"loader-bound: {_share(groups['other'] / work)} of worker time is spent writing labels and fields "
            f"and handing batches over, {waiting}: fewer or smaller fields, or more workers")
