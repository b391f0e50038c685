"""``wdsmp cat`` and ``wdsmp split``: copy the samples of shards into one archive or a new series.

Samples are copied as stored: the same key, the same field names (extensions keep their case)
and the same bytes; only tar headers are rewritten (wdsmp's deterministic ones). Members outside
any sample are not copied: those without an extension (counted in a warning) and ``__name__``
metadata files, which readers skip too.

``--shuffle`` shuffles the order of the input shards, then the samples through a buffer of
``--buffer`` samples, all from ``--seed`` (default 0), so a run is repeatable. The buffer is filled
before the first sample comes out: with ``--buffer`` at least the number of samples, the output
is an exact uniform permutation, at the price of holding every sample in memory. ``--memory SIZE``
gives that exact permutation of any amount of data holding about SIZE of it at once: the samples
go through temporary shards on disk first (``scatter.py``).
"""

import argparse
import collections
import os
import random
import sys
import time
from typing import Iterable, Optional, cast

from ..filters import shuffle
from .common import Progress, add_common, die, expand_inputs, print_json
from ..gopen import local_path
from .output import Output, add_output_options, check_summary_target, is_pattern, parse_size, positive_int
from .listing import read_samples
from .scatter import bucket_count, scatter_shuffled

DEFAULT_BUFFER = 1000


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    for name, series, summary in (
        ("cat", False, "Concatenate the samples of shards into one archive"),
        ("split", True, "Reshard samples into a series of shards (-o out-%06d.tar)"),
    ):
        parser = subparsers.add_parser(
            name, help=summary[0].lower() + summary[1:].replace("%", "%%"),
            description=f"{summary}. Keys, field names and bytes are preserved; --shuffle is seeded "
            "(repeatable); with --buffer at least the number of samples the shuffle is exact (every "
            "sample held in memory).")
        parser.add_argument("shards", nargs="+", metavar="SHARDS",
                            help="input shards: paths, brace patterns, globs, URLs, '-'")
        add_output_options(parser, series=series)
        parser.add_argument("--shuffle", action="store_true", help="shuffle shards, then samples")
        parser.add_argument("--seed", type=int, help="the shuffle's seed (default 0)")
        parser.add_argument("--buffer", type=positive_int, metavar="N",
                            help=f"samples held for shuffling (default {DEFAULT_BUFFER})")
        parser.add_argument("--memory", type=parse_size, metavar="SIZE",
                            help="shuffle uniformly, whatever the data's size, holding about SIZE (e.g. 4G) of "
                                 "samples at once; temporary shards go beside the output (or in the current directory)")
        add_common(parser)
        parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    series = args.command == "split"
    if series != is_pattern(args.output):
        die("split writes a series: give -o a pattern such as out-%06d.tar" if series else
            "cat writes one archive; for a series of shards use wdsmp split")
    if not args.shuffle and (args.seed is not None or args.buffer is not None or args.memory is not None):
        die("--seed, --buffer and --memory go with --shuffle")
    if args.buffer is not None and args.memory is not None:
        die("--memory shuffles every sample: it takes no --buffer")
    check_summary_target(args)
    urls = expand_inputs(args.shards)
    started = time.monotonic()
    tally: "collections.Counter[str]" = collections.Counter()
    if args.shuffle:
        rng = random.Random(0 if args.seed is None else args.seed)
        rng.shuffle(urls)
        if args.memory is not None:
            samples = scatter_shuffled(read_samples(urls, tally), args.memory, rng, _scratch(args.output),
                                       bucket_count(_local_bytes(urls), args.memory))
        else:
            size = args.buffer or DEFAULT_BUFFER
            samples = shuffle(size, initial=size, rng=rng)(read_samples(urls, tally))
    else:
        samples = read_samples(urls, tally)
    limits = dict(maxcount=args.maxcount, maxsize=args.maxsize) if series else {}
    with Progress(args.command, quiet=args.quiet) as progress, \
            Output(args.output, args.force, inputs=urls, command=args.command, **limits) as output:
        for sample in samples:
            progress.update(1, output.write(sample))
    if tally["outside"]:
        print(f"wdsmp {args.command}: warning: {tally['outside']} members outside any sample (no extension) "
              "were not copied", file=sys.stderr)
    if args.json:
        print_json(dict(command=args.command, inputs=len(urls), samples=output.samples, bytes=output.bytes,
                        outputs=output.summary(), skipped_members=tally["outside"],
                        seconds=round(time.monotonic() - started, 3)))
    return 0


def _local_bytes(urls: Iterable[str]) -> Optional[int]:
    """The inputs' size in bytes when all are local files, else None."""
    paths = [local_path(url) for url in urls]
    if any(path is None or not os.path.isfile(path) for path in paths):
        return None
    return sum(os.path.getsize(cast(str, path)) for path in paths)  # none is None: checked above


def _scratch(output: str) -> str:
    """Where temporary shards go: beside a local output (the same disk), else in the current
    directory (not the system's temporary directory, often memory)."""
    path = local_path(output % 0 if is_pattern(output) else output)
    directory = os.path.dirname(os.path.abspath(path)) if path is not None and output != "-" else os.getcwd()
    return directory if os.path.isdir(directory) else os.getcwd()
