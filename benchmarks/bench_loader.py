"""Training-loader throughput on an ImageNet-like corpus: the contenders side by side, in one run.

Usage::

    python benchmarks/make_corpus.py /tmp/corpus --images 4000 --shard-size 500
    python benchmarks/bench_loader.py --corpus /tmp/corpus [--workers 2] [--batch-size 256]
        [--seconds 20] [--warmup 5] [--rounds 3] [--plot loader-bench.png] [--record]

The measurement (what the contenders are, how each figure is taken) is
``wdsmp.bench.loader``, which ``wdsmp bench`` runs too; this script runs it from a
checkout and, with ``--record``, appends a dated section with the command,
corpus and table to ``benchmarks/RESULTS.md``. Both draw the run (images/s over
time, time per image by stage) to ``--plot`` when matplotlib is installed
(``pip install 'wdsmp[plot]'``).
"""

import argparse
import datetime
import os
import sys
import textwrap

from wdsmp.bench import loader as benchmark
from wdsmp.cli.bench import add_arguments, timings

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def record(command, corpus, args, text):
    intro = textwrap.fill(
        f"Images per second delivered to the training loop, after {args.warmup:g} s of warm-up, over "
        f"{args.seconds:g} s, best of {args.rounds} interleaved rounds; {args.workers} workers, batches of "
        f"{args.batch_size}, random-resized-crop to {benchmark.CROP_SIZE}x{benchmark.CROP_SIZE} and flip. "
        "First batch: seconds from constructing the loader. CPU: cores busy, this process and its workers "
        "together (psutil). Peak PSS: the largest sum over the same processes. Other load: cores the rest of "
        "the machine kept busy meanwhile.", width=100)
    section = f"""
## Loader: `benchmarks/bench_loader.py`, {datetime.date.today().isoformat()}

{intro}

- Corpus: {corpus.describe()}.
- Machine: {benchmark.machine()}.

Command: `{command}`

{text}
"""
    with open(RESULTS, "a") as stream:
        stream.write(section)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--record", action="store_true", help="append the results to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    timings(args, scaling=False)
    try:
        corpus = benchmark.open_corpus(args.corpus, args.workers)
    except ValueError as exn:
        parser.error(str(exn))
    command = " ".join(["python", "benchmarks/bench_loader.py"] + (sys.argv[1:] if argv is None else list(argv)))
    print(benchmark.header(command, corpus), flush=True)
    rounds = benchmark.run(corpus, args, log=sys.stderr)
    text = benchmark.summary(rounds, corpus)
    print(text)
    print(benchmark.picture(rounds, corpus, args))
    if args.record:
        record(command, corpus, args, text)
        print(f"# recorded in {RESULTS}")


if __name__ == "__main__":
    main()
