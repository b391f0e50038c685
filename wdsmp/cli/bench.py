"""``wdsmp bench``: the loader benchmark (``wdsmp.benchmark``) from an installed wdsmp.

The options live here, light to import, and ``benchmarks/bench_loader.py`` adds them to its
own parser (with ``--record``), so the script and the subcommand take the same arguments and
run the same measurement.
"""

import argparse
import shlex
import sys

from .common import add_common, die, print_json

__all__ = ["add_arguments", "add_parser", "run"]


def _number(kind, what, valid):
    """An argparse type: ``kind(text)``, refused with "is not ``what``" unless ``valid(value)``."""

    def convert(text):
        value = kind(text)
        if not valid(value):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" message
    return convert


def add_arguments(parser):
    """The benchmark's options, on ``parser``."""
    positive_int = _number(int, "a positive integer", lambda value: value > 0)
    parser.add_argument("--corpus", required=True, help="a directory written by benchmarks/make_corpus.py")
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes of each loader")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--seconds", type=_number(float, "a positive number", lambda value: value > 0), default=20.0,
                        help="timed window per contender and round")
    parser.add_argument("--warmup", type=_number(float, "a number >= 0", lambda value: value >= 0), default=5.0,
                        help="seconds after the first batch, not timed")
    parser.add_argument("--rounds", type=positive_int, default=3, help="the best round of each contender is reported")
    parser.add_argument("--swap-import", action="store_true",
                        help="also run a user's WebDataset pipeline with webdataset and with wdsmp imported as wds")
    parser.add_argument("--plot", metavar="PNG", default="loader-bench.png",
                        help="where to draw images/s over time and time per image by stage (needs matplotlib: "
                        "pip install 'wdsmp[plot]'); default %(default)s")


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "bench", help="measure loader throughput: FastLoader, the DataLoader pipeline, the decode ceiling",
        description="Images per second, CPU and memory of FastLoader and of the DataLoader pipeline on an "
        "ImageNet-like corpus, beside the machine's decode-only ceiling (see wdsmp.benchmark).")
    add_arguments(parser)
    add_common(parser)
    parser.set_defaults(func=run)


def run(args):
    from .. import benchmark

    try:
        corpus = benchmark.open_corpus(args.corpus, args.workers)
    except ValueError as exn:
        die(str(exn))
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
