"""The ``wdsmp`` command: make, inspect, check, cache and convert WebDataset shards.

Each subcommand lives in a module of this package with ``add_parser(subparsers)``
(its arguments, with ``run`` as the parser's ``func``) and ``run(args)``, which
returns the exit status. Conventions, as tar and tarp have them: outputs need
``-o`` and an existing output is never overwritten without ``--force``; ``-``
is stdin or stdout; inputs take brace patterns, globs and any URL gopen reads;
the status is non-zero on any integrity failure; ``--json`` prints a
machine-readable summary on stdout; long work shows a progress bar on a
terminal and plain periodic lines otherwise (``Progress``, in ``common.py``). ``run``
finds the command line it was given, for a summary to quote, in ``args.argv``.
"""

import argparse
import sys
from typing import Iterable, Optional

__all__ = ["main"]

_MODULES = ("create", "reshard", "listing", "index", "verify", "prefetch", "convert", "bench", "doctor")


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="wdsmp", description="Make, inspect, check, cache and convert "
                                     "WebDataset shards (POSIX tar files of samples).")
    parser.add_argument("--version", action="version", version=f"wdsmp {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from importlib import import_module

    for name in _MODULES:
        import_module(f"{__name__}.{name}").add_parser(subparsers)
    return parser


def main(argv: Optional[Iterable[object]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); the exit status."""
    from ..errors import WdsmpError
    from .common import CommandError

    words = [str(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    args = _parser().parse_args(words)
    args.argv = words
    try:
        return args.func(args)
    except CommandError as exn:
        print(f"wdsmp {args.command}: {exn}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `wdsmp ls ... | head`: the reader has all it wanted
        _quiet_stdout()
        return 141
    except (WdsmpError, OSError, ValueError) as exn:
        print(f"wdsmp {args.command}: error: {exn}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("wdsmp: interrupted", file=sys.stderr)
        return 130


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of a closed pipe
    prints nothing more."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)

