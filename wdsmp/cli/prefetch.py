"""``wdsmp cache``: fetch shards into the shard cache before training needs them.

The cache is the one ``cache_dir=`` of WebDataset, FastLoader and ExactSamples reads
(:class:`wdsmp.cache.FileCache`, same directory, same file names), so a prefetched shard
is never fetched again by a loader. Each shard is fetched through the cache and read by
wdsmp's tar reader, as a loader's first pass would: the cache adds a file only once it
passed the reader's checks, and reading it here is what names the damage when it does
not (a bare download would only learn that nothing was added). Local files are never
cached (loaders read them in place). Fetches run in threads (``--jobs``): they wait on
the network, not on the processor.

A shard already in the cache is read through the tar reader too (a local read, far
cheaper than the fetch it saves): a loader only checks a cache file's first block, so a
file cut short (a full disk, a copy of the directory that stopped halfway) would pass
there and stop training later. A damaged one is removed, under the entry's exclusive
lock (NOTE [cache entry], in :mod:`wdsmp.storage.cacheentry`), and fetched again, and the
shard's line says so. The size the source announces would be cheaper to compare but is
not there for every source (``pipe:``, chunked HTTP), and matches a file whose bytes are
damaged.
"""

import argparse
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Dict, List, Mapping

from .._internal.atomic import remove_if_present
from ..storage.cacheentry import CachedFile, EntryLock
from ..cache import FileCache, islocal
from ..errors import ShardError
from ..tariterators import tar_file_iterator
from .common import Progress, add_common, die, expand_inputs, print_json

__all__ = ["add_parser", "prefetch", "run"]


def _read_through(stream: IO[bytes], url: str) -> None:
    """Read ``stream`` to its end with the tar reader, then close it."""
    try:
        for _ in tar_file_iterator(stream, url=url):
            pass
    finally:
        stream.close()


def _remove_entry(url: str, path: str, timeout: float) -> None:
    """Remove ``url``'s cache file at ``path`` under its exclusive lock, waiting at most
    ``timeout`` seconds for its readers (loaders hold it shared) to close it: ShardError then."""
    lock = EntryLock(path)
    deadline, delay = time.monotonic() + timeout, 0.01
    while not lock.acquire(exclusive=True):
        if time.monotonic() >= deadline:
            raise ShardError(f"cannot replace the cache file {path}: another process kept reading it for "
                             f"{timeout:g} s", url=url)
        time.sleep(delay)
        delay = min(2 * delay, 0.25)
    try:
        remove_if_present(path)
    finally:
        lock.release()


def prefetch(cache: FileCache, url: str) -> Dict[str, Any]:
    """Bring ``url`` into ``cache`` (a FileCache that opens every entry: ``validator=None``);
    a dict with ``url``, ``status`` (``fetched``, ``cached``: already there, ``local``: not
    cached, ``failed``), ``path`` and ``bytes``; ``error`` when it failed; ``damaged`` (what
    the tar reader said) when a damaged cache file was removed to fetch the shard again."""
    if islocal(url):
        return {"url": url, "status": "local", "path": None, "bytes": None}
    result: Dict[str, Any] = {"url": url, "status": "fetched", "path": None, "bytes": None}
    try:
        path = cache.entry_path(url)
        stream = cache.open(url)
        if isinstance(stream, CachedFile):  # in the cache already: read it as a loader would
            try:
                _read_through(stream, url)
                return dict(result, status="cached", path=path, bytes=os.path.getsize(path))
            except (OSError, ValueError) as exn:
                result["damaged"] = str(exn)
            _remove_entry(url, path, cache.lock_timeout)
            stream = cache.open(url)
        _read_through(stream, url)
        if not os.path.exists(path):
            raise ShardError(f"not added to the cache at {path} (see the warnings above)", url=url)
    except (OSError, ValueError) as exn:
        return dict(result, status="failed", error=str(exn))
    return dict(result, path=path, bytes=os.path.getsize(path))


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "cache", help="prefetch shards into the shard cache of cache_dir=",
        description="Fetch shards into the shard cache that cache_dir= of WebDataset, FastLoader and "
                    "ExactSamples reads, checking each with wdsmp's tar reader. Shards already cached "
                    "are read (locally) to check them too, and fetched again if damaged; local files are "
                    "left where they are. The status is 1 if any shard could not be cached.")
    parser.add_argument("shards", nargs="+", metavar="SHARD", help="shard URLs (brace patterns, globs)")
    parser.add_argument("--cache-dir", required=True, help="the cache directory (made if missing; it must be "
                        "writable)")
    parser.add_argument("-j", "--jobs", type=int, default=4, help="shards fetched at once (default 4)")
    add_common(parser)
    parser.set_defaults(func=run)


def _line(result: Mapping[str, Any]) -> str:
    status, url = result["status"], result["url"]
    if status == "local":
        return f"local   {url} (read in place, never cached)"
    if status == "failed":
        text = f"FAILED  {url}: {result['error']}"
    else:
        text = f"{status:<8}{url} ({result['bytes']:,} bytes)"
    if "damaged" in result:
        text += f"; the cache file was damaged ({result['damaged']}), so it was fetched again"
    return text


def _cache_directory(directory: str) -> None:
    """Make ``directory`` if missing; a usage error if it cannot be one, or cannot be written."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        die(f"--cache-dir {directory} is not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exn:
        die(f"--cache-dir {directory}: cannot make the directory: {exn.strerror or exn}")
    if not os.access(directory, os.W_OK | os.X_OK):
        die(f"--cache-dir {directory}: the directory is not writable")


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        die(f"--jobs must be at least 1, not {args.jobs}")
    urls = list(dict.fromkeys(expand_inputs(args.shards)))  # each shard once, in order
    _cache_directory(args.cache_dir)
    cache = FileCache(args.cache_dir, validator=None)  # prefetch reads every cache file whole instead
    results: List[Dict[str, Any]] = []
    with Progress("cache", total=len(urls), unit="shards", quiet=args.quiet) as progress, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(functools.partial(prefetch, cache), urls):
            results.append(result)
            progress.update(1, result["bytes"] if result["status"] == "fetched" else 0)
            if not args.json:
                print(_line(result), flush=True)
    counts = {status: sum(r["status"] == status for r in results)
              for status in ("fetched", "cached", "local", "failed")}
    fetched = sum(r["bytes"] for r in results if r["status"] == "fetched")
    if args.json:
        print_json(dict(counts, cache_dir=args.cache_dir, bytes_fetched=fetched, shards=results))
    else:
        print(f"{counts['fetched']} fetched ({fetched:,} bytes), {counts['cached']} already cached, "
              f"{counts['local']} local, {counts['failed']} failed")
    return 1 if counts["failed"] else 0
