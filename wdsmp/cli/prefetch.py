"""``wdsmp cache``: fetch shards into the shard cache before training needs them.

The cache is the one ``cache_dir=`` of WebDataset, FastLoader and ExactSamples reads
(:class:`wdsmp.cache.FileCache`, same directory, same file names), so a prefetched shard
is never fetched again by a loader. Each shard is fetched through the cache and read by
wdsmp's tar reader, as a loader's first pass would: the cache adds a file only once it
passed the reader's checks, and reading it here is what names the damage when it does
not (a bare download would only learn that nothing was added). Shards already in the
cache are skipped; local files are never cached (loaders read them in place).
Fetches run in threads (``--jobs``): they wait on the network, not on the processor.
"""

import functools
import os
from concurrent.futures import ThreadPoolExecutor

from ..cache import FileCache, check_tar_format, islocal
from ..errors import ShardError
from ..tariterators import tar_file_iterator
from .common import Progress, add_common, die, expand_inputs, print_json

__all__ = ["add_parser", "prefetch", "run"]


def prefetch(cache, url):
    """Bring ``url`` into ``cache`` (a FileCache); a dict with ``url``, ``status``
    (``fetched``, ``cached``: already there, ``local``: not cached, ``failed``),
    ``path`` and ``bytes``, or ``error`` when it failed."""
    if islocal(url):
        return {"url": url, "status": "local", "path": None, "bytes": None}
    try:
        path = cache.entry_path(url)
        if os.path.exists(path) and check_tar_format(path):
            return {"url": url, "status": "cached", "path": path, "bytes": os.path.getsize(path)}
        stream = cache.open(url)
        try:
            for _ in tar_file_iterator(stream, url=url):
                pass
        finally:
            stream.close()
        if not os.path.exists(path):
            raise ShardError(f"not added to the cache at {path} (see the warnings above)", url=url)
    except (OSError, ValueError) as exn:
        return {"url": url, "status": "failed", "path": None, "bytes": None, "error": str(exn)}
    return {"url": url, "status": "fetched", "path": path, "bytes": os.path.getsize(path)}


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "cache", help="prefetch shards into the shard cache of cache_dir=",
        description="Fetch shards into the shard cache that cache_dir= of WebDataset, FastLoader and "
                    "ExactSamples reads, checking each with wdsmp's tar reader. Shards already cached "
                    "are skipped, local files are left where they are. The status is 1 if any shard "
                    "could not be cached.")
    parser.add_argument("shards", nargs="+", metavar="SHARD", help="shard URLs (brace patterns, globs)")
    parser.add_argument("--cache-dir", required=True, help="the cache directory (created if needed)")
    parser.add_argument("-j", "--jobs", type=int, default=4, help="shards fetched at once (default 4)")
    add_common(parser)
    parser.set_defaults(func=run)


def _line(result):
    if result["status"] == "failed":
        return f"FAILED  {result['url']}: {result['error']}"
    if result["status"] == "local":
        return f"local   {result['url']} (read in place, never cached)"
    return f"{result['status']:<8}{result['url']} ({result['bytes']:,} bytes)"


def run(args):
    if args.jobs < 1:
        die(f"--jobs must be at least 1, not {args.jobs}")
    urls = list(dict.fromkeys(expand_inputs(args.shards)))  # each shard once, in order
    cache = FileCache(args.cache_dir)
    results = []
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
