"""``wdsmp convert``: offline processing of shards, one output shard per input shard.

WebDataset's documentation augments a dataset offline by running a function over each shard
(``dask.delayed(augment_wds)`` over input/output pairs); this is that, as a command::

    wdsmp convert --map augment:flip -o out/ 'train-{000000..000146}.tar'

The map function, ``module:function`` (a dotted attribute path after the colon works too),
takes a sample as the tar reader gives it, ``__key__``, ``__url__`` and the raw bytes of each
field, named by its extension lower-cased (``img.JPG`` arrives as ``jpg``; ``cat`` and ``split``
copy members as they are, case kept), and returns:

- a dict: the output sample. Values are bytes or str, or anything wdsmp's writer encodes by
  the field's extension (an image for ``jpg``, an int for ``cls``, ...); fields starting
  with ``_`` are not written;
- None: the sample is dropped;
- a list or tuple of dicts: several output samples (augmented copies, crops), each with its
  own ``__key__`` (a key written twice in one shard is an error: readers would merge them).

Its module must be importable here and where the work runs: installed, on ``PYTHONPATH``, or
(for the local pool) in the current directory, which is put on the path as ``python -m`` does.

Each input ``.../NAME.tar`` becomes ``OUTDIR/NAME.tar`` (compressed when the name says so:
``.tar.gz``, ``.tgz``). Samples stream through one at a time; a shard is never held in
memory. NOTE [complete outputs]: an output is written as ``OUTDIR/.partial-NAME``, synced to
disk, and renamed to ``NAME`` only once the whole shard is done, so a file with an output's
name is always complete: a rerun skips it (``--force`` writes it again, replacing it only when
the new one is complete), a failure removes its partial file, and a run that was killed leaves
one that the next run overwrites. Two runs must not write to one OUTDIR at the same time.

The work is one task per shard, on a local pool of processes (``--workers``, one per core by
default, started by a forkserver that has imported wdsmp once), or with ``--scheduler
tcp://host:port`` on a Dask distributed cluster (``pip install 'wdsmp[dask]'``): its workers
need wdsmp and the map module importable, the inputs readable and OUTDIR on a file system
they share; threads of one worker run shards side by side, so the function must be
thread-safe there. A shard that fails (an error in the function, named with the sample's key
and the function's traceback, ``SystemExit`` included, or a damaged input) fails alone: the others go on and keep their
outputs, and the exit status is 1. A local worker that dies (killed, out of memory) breaks the
pool: the shards it was running fail, those not started are counted as such, and a rerun goes
on from there.
"""

import argparse
import contextlib
import importlib
import multiprocessing
import os
import re
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Iterable, List, Sequence, Set, Tuple, Type, Union

from .._internal.atomic import atomic_write
from ..errors import WdsmpError
from ..fast.options import default_workers
from ..gopen import local_path
from .._internal.liveness import exit_with_parent
from ..tariterators import tarfile_samples
from ..writer import TarWriter
from .common import PARTIAL, Progress, add_common, die, expand_inputs, print_json

if TYPE_CHECKING:
    from dask.distributed import Client
    from dask.distributed import Future as DaskFuture

__all__ = ["MapError", "add_parser", "convert_shard", "load_function", "output_name", "run"]

_Task = Tuple[str, str, str]  # (url, output, spec): the arguments of convert_shard

_SHARD_NAME = re.compile(r"[\w.+-]+\.(?:tar|tgz|tar\.gz|tar\.bz2|tar\.xz)(?![\w.])")


class MapError(WdsmpError, RuntimeError):
    """The map function failed on a sample, or returned something that cannot be written.

    Names the shard and the sample; carries the function's traceback as text, because the
    error crosses process (and, with Dask, machine) boundaries where the traceback is lost.
    """

    def __init__(self, problem: str, url: str, key: str, details: str = "") -> None:
        self.problem, self.url, self.key, self.details = problem, url, key, details
        super().__init__(f"{problem} (shard {url!r}, sample {key!r})")

    def __reduce__(self) -> Tuple[Type["MapError"], Tuple[str, str, str, str]]:
        return (type(self), (self.problem, self.url, self.key, self.details))


def load_function(spec: str) -> Callable[[Dict[str, Any]], Any]:
    """The callable that ``module:function`` names (``function`` may be a dotted path)."""
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    function = importlib.import_module(module)
    for name in attribute.split("."):
        function = getattr(function, name)
    if not callable(function):
        raise TypeError(f"{spec} is a {type(function).__name__}, not a function")
    return function


def output_name(url: str) -> str:
    """The file name of the shard ``url`` names: a local file's name, else the last
    ``NAME.tar`` (``.tgz``, ``.tar.gz``, ...) in the URL, as in ``pipe:curl -s .../NAME.tar``."""
    path = local_path(url)
    if path is not None:
        return os.path.basename(path)
    names = _SHARD_NAME.findall(url)
    if not names:
        raise ValueError(f"cannot name the output of {url!r}: no NAME.tar in it")
    return names[-1]


def _samples_out(result: object) -> Sequence[Dict[str, Any]]:
    """The output samples a map function's result stands for (see the module docstring)."""
    if result is None:
        return ()
    if isinstance(result, dict):
        return (result,)
    if isinstance(result, (list, tuple)) and all(isinstance(sample, dict) for sample in result):
        return result
    raise TypeError(f"{result!r:.60}, not a sample dict, None or a list of sample dicts")


def convert_shard(url: str, output: str, spec: str) -> Dict[str, Any]:
    """Convert one shard (the task a worker runs): ``{"shard", "samples_in", "samples_out", "bytes"}``.

    Writes ``output`` as NOTE [complete outputs] says; raises MapError, or the reader's
    error for a damaged input, leaving no file behind.
    """
    function = load_function(spec)
    directory, name = os.path.split(output)
    partial = os.path.join(directory, PARTIAL + name)
    counts: Dict[str, Any] = {"shard": url, "samples_in": 0, "samples_out": 0}
    written: Set[str] = set()  # keys only: a key repeated in a shard would not read back as two samples
    with atomic_write(output, partial), TarWriter(partial) as sink:
        for sample in tarfile_samples([url]):
            counts["samples_in"] += 1
            key = sample["__key__"]
            try:
                result = function(sample)
            except KeyboardInterrupt:  # Ctrl-C reaches the workers too: the run stops, not the shard
                raise
            except BaseException as exn:  # sys.exit() in the function fails this shard, not the worker
                assert exn.__traceback__ is not None  # an exception being handled has its traceback
                where = exn.__traceback__.tb_next  # the function's frames, not this one
                details = "".join(traceback.format_exception(type(exn), exn, where))
                raise MapError(f"--map {spec} raised {type(exn).__name__}: {exn}", url, key, details) from exn
            try:
                outputs = _samples_out(result)
                for out in outputs:
                    if out.get("__key__") in written:
                        raise ValueError(f"output key {out['__key__']!r} written twice in this shard")
                    sink.write(out)
                    written.add(out["__key__"])
            except (TypeError, ValueError) as exn:
                raise MapError(f"--map {spec} returned what cannot be written: {exn}", url, key) from exn
            counts["samples_out"] += len(outputs)
    counts["bytes"] = os.path.getsize(output)
    return counts


def _local_pool(tasks: Iterable[_Task],
                workers: int) -> Generator[Tuple[_Task, "Future[Dict[str, Any]]"], None, None]:
    """Run ``tasks`` on a pool of ``workers`` processes; yields ``(task, future)`` as each one ends.

    Only as many tasks as there are workers are ever handed to the pool, so that Ctrl-C, which
    reaches the workers too, stops the work at once (a queued task would start after it), and a
    pool broken by a worker that died (killed, out of memory) starts nothing more: the tasks
    not started are not yielded. Workers exit when this process dies, even by SIGKILL
    (``liveness.exit_with_parent``); the fork server and resource tracker then exit too, as
    nothing holds them open any more.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # workers fork from a process that imported wdsmp
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=exit_with_parent)  # none outlives the run
    running: Dict[Future[Dict[str, Any]], _Task]
    todo, running, broken = iter(tasks), {}, False
    try:
        while True:
            while not broken and len(running) < workers:
                task = next(todo, None)
                if task is None:
                    break
                running[pool.submit(convert_shard, *task)] = task
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                broken = broken or isinstance(future.exception(), BrokenProcessPool)
                yield running.pop(future), future
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _dask_client(address: str) -> "Client":
    """A client of the Dask scheduler at ``address``; a usage error when it cannot be reached."""
    try:
        from dask.distributed import Client
    except ImportError as exn:
        die(f"--scheduler needs Dask's distributed scheduler ({exn}): pip install 'wdsmp[dask]'")
    try:
        return Client(address, timeout="10s")
    except OSError as exn:  # TimeoutError included
        die(f"cannot reach the Dask scheduler at {address}: {exn}")


def _dask(tasks: Iterable[_Task],
          client: "Client") -> Generator[Tuple[_Task, "DaskFuture[Dict[str, Any]]"], None, None]:
    """Run ``tasks`` with the Dask ``client``, closed at the end; yields ``(task, future)`` as
    each one finishes."""
    from dask.distributed import as_completed as dask_completed

    with client:
        futures = {client.submit(convert_shard, *task, pure=False): task for task in tasks}
        try:
            for future in dask_completed(futures):
                yield futures[future], future
        finally:
            client.cancel(list(futures))


def _plan(args: argparse.Namespace) -> Tuple[str, List[_Task], int]:
    """``(outdir, tasks, skipped)``: ``(url, output, spec)`` to run, and how many inputs have a
    complete output already. Makes nothing: OUTDIR is made once the work can start."""
    outdir = local_path(args.output)
    if outdir is None or args.output == "-":
        die("-o must be a local directory: outputs are renamed into place when complete")
    outdir = os.path.abspath(outdir)
    urls = expand_inputs(args.shards)
    if "-" in urls:
        die("convert reads shards by name, not from stdin")
    outputs: Dict[str, str] = {}
    for url in urls:
        path = local_path(url)
        if path is not None:
            url = os.path.abspath(path)  # the same file for workers with another working directory
        try:
            output = os.path.join(outdir, output_name(url))
        except ValueError as exn:
            die(str(exn))
        if output in outputs:
            die(f"{outputs[output]} and {url} would both be written to {output}")
        if path is not None and os.path.realpath(output) == os.path.realpath(url):
            die(f"{url} is in the output directory: it would be its own output")
        outputs[output] = url
    tasks = [(url, output, args.map) for output, url in outputs.items() if args.force or not os.path.exists(output)]
    return outdir, tasks, len(outputs) - len(tasks)


def _failure(url: str, exn: BaseException) -> Tuple[str, Dict[str, Any]]:
    """What to print, and the JSON entry, for a shard that failed."""
    if isinstance(exn, BrokenProcessPool):  # which worker died is not known: this shard's, or another's
        text = f"a worker process died (killed, out of memory, a crash) while shard {url!r} was converting"
    elif getattr(exn, "url", None) == url:
        text = str(exn)
    else:
        text = f"{type(exn).__name__}{f': {exn}' if str(exn) else ''} (shard {url!r})"
    entry = {"shard": url, "sample": getattr(exn, "key", None), "error": text}
    details = getattr(exn, "details", "")
    return text + (f"\n{details.rstrip()}" if details else ""), entry


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "convert", help="run a function over every sample, writing one output shard per input shard",
        description="Run --map module:function over every sample of SHARDS, writing OUTDIR/NAME for each input "
        "NAME, on a local process pool or a Dask cluster. The function returns a sample dict, None (drop "
        "the sample) or a list of samples. Complete outputs are skipped on a rerun.")
    parser.add_argument("shards", nargs="+", metavar="SHARDS", help="shard paths, brace patterns, globs or URLs")
    parser.add_argument("--map", required=True, metavar="MODULE:FUNCTION", help="sample dict -> sample dict, "
                        "None or a list of sample dicts; MODULE must be importable by the workers")
    parser.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="a local directory, made if missing")
    parser.add_argument("--workers", type=int, metavar="N", help="processes of the local pool (default: one per core)")
    parser.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run on this Dask distributed scheduler")
    parser.add_argument("-f", "--force", action="store_true", help="convert again shards whose output is complete")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.scheduler is not None and args.workers is not None:
        die("--workers sizes the local pool; a Dask cluster has its own workers")
    if args.workers is not None and args.workers < 1:
        die(f"--workers must be at least 1, not {args.workers}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        load_function(args.map)
    except KeyboardInterrupt:
        raise
    except BaseException as exn:  # the user's module runs at import: anything can happen, sys.exit() too
        die(f"--map {args.map}: {type(exn).__name__}: {exn}")
    outdir, tasks, skipped = _plan(args)
    summary: Dict[str, Any] = {"output": outdir, "shards": len(tasks) + skipped, "skipped": skipped,
               "done": 0, "failed": 0, "samples_in": 0, "samples_out": 0, "bytes_out": 0, "failures": []}
    start = time.monotonic()
    if tasks:
        client = _dask_client(args.scheduler) if args.scheduler is not None else None
        try:
            os.makedirs(outdir, exist_ok=True)  # only now: a run that cannot start leaves nothing behind
        except BaseException:
            if client is not None:
                client.close()
            raise
        finished: Union[Generator[Tuple[_Task, Future[Dict[str, Any]]], None, None],
                        Generator[Tuple[_Task, DaskFuture[Dict[str, Any]]], None, None]]
        if client is not None:
            finished = _dask(tasks, client)
        else:
            finished = _local_pool(tasks, min(args.workers or default_workers(), len(tasks)))
        with contextlib.closing(finished), Progress("convert", total=len(tasks), unit="shards",
                                                    quiet=args.quiet) as progress:
            for (url, _, _), future in finished:
                try:
                    counts = future.result()
                except KeyboardInterrupt:
                    raise
                except BaseException as exn:  # SystemExit too: a failure of this shard, never the end of the run
                    text, entry = _failure(url, exn)
                    print(f"wdsmp convert: {text}", file=sys.stderr, flush=True)
                    summary["failed"] += 1
                    summary["failures"].append(entry)
                    progress.update(1)
                    continue
                summary["done"] += 1
                summary["samples_in"] += counts["samples_in"]
                summary["samples_out"] += counts["samples_out"]
                summary["bytes_out"] += counts["bytes"]
                progress.update(1, counts["bytes"])
    summary["not_started"] = len(tasks) - summary["done"] - summary["failed"]
    summary["seconds"] = round(time.monotonic() - start, 3)
    if args.json:
        print_json(summary)
    else:
        not_started = f", {summary['not_started']} not started" if summary["not_started"] else ""
        done = f"{summary['done']} shard{'s' * (summary['done'] != 1)}"
        print(f"{done} converted, {skipped} skipped (already complete), {summary['failed']} failed{not_started}; "
              f"{summary['samples_in']:,} samples in, {summary['samples_out']:,} out -> {summary['output']}")
    return 1 if summary["failed"] or summary["not_started"] else 0
