"""``wdsmp bench``: the loader benchmark (``wdsmp.bench.loader``) from an installed wdsmp.

The options live here, light to import, and ``benchmarks/bench_loader.py`` adds them to its
own parser (with ``--record``), so the script and the subcommand take the same arguments and
run the same measurement.
"""

import argparse
import os
import shlex
import sys
from typing import Callable, Iterable, TypeVar

from ..errors import ShardError
from ..gopen import local_path, local_shard_stat
from .output import positive_int
from .common import add_common, check_output, die, expand_inputs, print_json

__all__ = ["add_arguments", "add_parser", "run", "timings"]

_N = TypeVar("_N", int, float)


def _number(kind: Callable[[str], _N], what: str, valid: Callable[[_N], bool]) -> Callable[[str], _N]:
    """An argparse type: ``kind(text)``, refused with "is not ``what``" unless ``valid(value)``."""

    def convert(text: str) -> _N:
        value = kind(text)
        if not valid(value):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" message
    return convert


def add_arguments(parser: argparse.ArgumentParser, corpus_required: bool = True) -> None:
    """The benchmark's options, on ``parser``."""
    parser.add_argument("--corpus", required=corpus_required,
                        help="a directory written by benchmarks/make_corpus.py: DataLoader pipeline, FastLoader "
                        "and the decode ceiling side by side")
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes of each loader")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="images per batch")
    parser.add_argument("--seconds", type=_number(float, "a positive number", lambda value: value > 0), default=None,
                        help="timed window per contender and round (default 20; 5 per worker count with SHARDS)")
    parser.add_argument("--warmup", type=_number(float, "a number >= 0", lambda value: value >= 0), default=None,
                        help="seconds after the first batch, not timed (default 5; 2 with SHARDS)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="the best round of each contender is reported")
    parser.add_argument("--swap-import", action="store_true",
                        help="also run a user's WebDataset pipeline with webdataset and with wdsmp imported as wds")
    parser.add_argument("--plot", metavar="PNG", default=None,
                        help="where to draw images/s over time and time per image by stage (needs matplotlib: "
                        "pip install 'wdsmp[plot]'); default loader-bench.png, or wdsmp-bench.png with SHARDS")


def timings(args: argparse.Namespace, scaling: bool) -> None:
    """Fill in the defaults of ``--seconds``, ``--warmup`` and ``--plot``, which differ between
    the corpus benchmark and a run on your own shards (``scaling``)."""
    if args.seconds is None:
        args.seconds = 5.0 if scaling else 20.0
    if args.warmup is None:
        args.warmup = 2.0 if scaling else 5.0
    if args.plot is None:
        args.plot = "wdsmp-bench.png" if scaling else "loader-bench.png"


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "bench", help="measure loader throughput: on your shards, or FastLoader against the DataLoader pipeline",
        description="With SHARDS: FastLoader on your shards at 1, 2, 4, ... workers, with the bottleneck and the "
        "cores a rate needs (see wdsmp.bench.shards). With --corpus: images per second, CPU and memory of "
        "FastLoader and of the DataLoader pipeline on an ImageNet-like corpus, beside the machine's decode-only "
        "ceiling (see wdsmp.bench.loader).")
    parser.add_argument("shards", nargs="*", metavar="SHARDS",
                        help="shards to measure FastLoader on: brace patterns, files, a shard index (.json), URLs")
    add_arguments(parser, corpus_required=False)
    parser.add_argument("--max-workers", type=_number(int, "a positive integer", lambda value: value > 0),
                        default=None, help="with SHARDS: the largest worker count (default: the CPUs here)")
    parser.add_argument("--rate", type=_number(float, "a positive number", lambda value: value > 0), default=3000.0,
                        help="with SHARDS: the images/s to say the cores for (default %(default)g)")
    parser.add_argument("--image", default=None, help="with SHARDS: the image extension (default: found in the "
                        "first sample)")
    parser.add_argument("--label", default=None, help="with SHARDS: the label extension (default: cls if the first "
                        "sample has it, else none)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the picture if it exists")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.shards and args.corpus:
        die("give SHARDS or --corpus, not both")
    if not args.shards and not args.corpus:
        die("give SHARDS (your shards, a shard index or URLs) or --corpus DIR (a generated corpus)")
    timings(args, scaling=bool(args.shards))
    if args.shards:
        return _run_scaling(args)
    from ..bench import loader as benchmark

    try:
        corpus = benchmark.open_corpus(args.corpus, args.workers)
    except ValueError as exn:
        die(str(exn))
    check_output(args.plot, args.force)
    command = shlex.join(["wdsmp", *args.argv])
    if not args.json:
        print(benchmark.header(command, corpus), flush=True)
    rounds = benchmark.run(corpus, args, log=None if args.quiet else sys.stderr)
    drawn = benchmark.picture(rounds, corpus, args)
    if args.json:
        print_json({"command": command, "corpus": corpus.describe(), "machine": benchmark.machine(),
                    "region_decoding": benchmark.region_decoding(), "results": benchmark.as_json(rounds)})
    else:
        print(benchmark.summary(rounds, corpus))
    if not args.quiet:
        print(drawn, file=sys.stderr)
    return 0


def _run_scaling(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..bench import plot as benchplot
    from ..bench import shards as shardbench
    from ..bench.loader import CROP_SIZE
    from ..shards.index import is_index, shard_counts

    check_output(args.plot, args.force)
    if len(args.shards) == 1 and is_index(args.shards[0]):
        source = args.shards[0]
        try:
            urls = [url for url, _ in shard_counts(source)]
        except (OSError, ValueError) as exn:
            die(f"cannot read the shard index {source}: {exn}")
    else:
        source = urls = expand_inputs(args.shards)
    _check_local_shards(urls)
    if args.image is None:
        try:
            args.image, found_label = shardbench.find_fields(urls)
        except Exception as exn:  # noqa: BLE001 - any reading error: say which shard
            die(str(exn))
        args.label = args.label or found_label
    command = shlex.join(["wdsmp", *args.argv])
    if not args.quiet:
        print(f"# {command}: {len(urls)} shards, image .{args.image}, label "
              f"{'.' + args.label if args.label else 'none'}", file=sys.stderr, flush=True)
    rows = shardbench.scaling(source, args, log=None if args.quiet else sys.stderr)
    measured = {f"{workers} worker{'s' * (workers > 1)}": result for workers, result in rows
                if not isinstance(result, Exception)}
    title = (f"FastLoader on {len(urls)} shards ({os.path.dirname(urls[0]) or '.'}), batches of {args.batch_size}, "
             f"crop to {CROP_SIZE}; {os.cpu_count()} cores")
    try:
        benchplot.draw(measured, args.plot, title)
        drawn = f"# picture: {args.plot}"
    except ImportError as exn:
        drawn = f"# no picture: {exn}"
    if args.json:
        print_json({"command": command, "shards": len(urls), "image": args.image, "label": args.label,
                    "rate": args.rate, "cores_for_rate": shardbench.cores_for(args.rate, rows),
                    "busy_machine": bool(shardbench.busy_counts(rows)),
                    "runs": [{"workers": workers, **({"error": f"{type(r).__name__}: {r}"} if isinstance(r, Exception)
                                                     else dict(asdict(r), series=None))} for workers, r in rows]})
    else:
        print(shardbench.report(rows, args.rate))
    if not args.quiet:
        print(drawn, file=sys.stderr)
    return 0 if measured else 1


def _check_local_shards(urls: Iterable[str]) -> None:
    """A usage error for the first local shard that is not a regular file, named for what it is
    (``gopen.local_shard_stat``), before anything reads the shards: finding the image field reads
    the first one, and a FIFO would block that read for good."""
    for url in urls:
        path = local_path(url)
        if path is not None:
            try:
                local_shard_stat(path, url)
            except ShardError as exn:
                die(str(exn))
