"""What the subcommands share: input expansion, output checks, JSON summaries, progress.

Progress goes to stderr: a tqdm bar when stderr is a terminal, else a plain
line every ``interval`` seconds with items/s and MB/s, so that logs of batch
jobs show the rate without carriage-return noise. ``--quiet`` silences both.
"""

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Dict, Iterable, List, NoReturn, Optional, TextIO, Tuple

from ..errors import ShardError, ShardNotFoundError
from ..gopen import gopen_schemes, has_opener, local_path, local_shard_stat
from ..shards.index import read_entries
from ..shardlists import expand_urls

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["PARTIAL", "Progress", "add_common", "check_output", "die", "distinct_shards", "expand_inputs", "print_json"]

# Prefix of an output being written: hidden, and not matched by `*.tar`; renamed to its own
# name only when complete (output.py NOTE [failed output], convert.py NOTE [complete outputs]).
PARTIAL = ".partial-"


def add_common(parser: argparse.ArgumentParser, json_summary: bool = True) -> None:
    """The options every subcommand has: ``--quiet``, and ``--json`` where it makes a summary."""
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    if json_summary:
        parser.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")


class CommandError(Exception):
    """A usage or input problem: printed as ``wdsmp <command>: <message>``, exit status 2."""


def die(message: str) -> NoReturn:
    raise CommandError(message)


def _indexed(spec: str) -> List[str]:
    """The shards a shard index (``index.json``, see wdsmp.shards.index) lists."""
    try:
        return [entry["url"] for entry in read_entries(spec)]
    except (OSError, ValueError) as exn:
        die(f"cannot read the shard index {spec}: {exn}")


def _is_glob(spec: str) -> bool:
    return any(char in spec for char in "*?[")


def expand_inputs(specs: Iterable[str], missing_ok: bool = False, indexes: bool = False,
                  index_option: Optional[str] = None) -> List[str]:
    """Shard URLs from command-line inputs: brace patterns, ``::`` lists, local globs, any URL
    gopen reads, ``-`` (stdin), and with ``indexes`` the shards of a shard index (a ``.json``
    input, as FastLoader takes it). Inputs that match nothing are an error, and so is a URL of
    a scheme gopen does not know, and a local file that does not exist unless ``missing_ok``
    (for commands that report it as a problem of that shard and go on with the others). A
    ``.json`` file is never a shard: given by name, it is an error (naming ``index_option``,
    where the command reads an index that way); matched by a glob beside shards (the
    ``classes.json`` of ``create --imagefolder``, an ``index.json``), it is left out."""
    urls: List[str] = []
    for spec in specs:
        if spec == "-":
            urls.append(spec)
            continue
        if indexes and spec.endswith(".json"):
            found = _indexed(spec)
        elif spec.endswith(".json") and not _is_glob(spec):
            how = f"pass it with {index_option}" if index_option else "give the shards it lists"
            die(f"{spec} is a JSON file, not a shard; if it is a shard index, {how}")
        else:
            try:
                found = expand_urls(spec)
            except ValueError as exn:  # a pattern that matches nothing
                die(str(exn))
            if _is_glob(spec):
                found = [url for url in found if not url.endswith(".json")]
                if not found:
                    die(f"{spec!r} matches only JSON files, no shards")
        if not found:
            die(f"no input matches {spec!r}")
        for url in found:
            if not has_opener(url):
                known = ", ".join(s for s in gopen_schemes if not s.startswith("__"))
                die(f"{url}: no opener for its URL scheme (known schemes: {known}; a Python program can add "
                    f"one with wdsmp.gopen.register_scheme)")
            path = local_path(url)
            if path is not None and not missing_ok and not os.path.exists(path):
                die(_absent(path, url))
        urls.extend(found)
    return urls


def _absent(path: str, url: str) -> str:
    """What to say of the local input ``path`` that ``os.path.exists`` does not find: "no such
    file", unless the rule for shard files (``gopen.local_shard_stat``) names something else
    there, a symlink loop or a directory that cannot be searched, which is no missing file."""
    try:
        local_shard_stat(path, url)
    except ShardNotFoundError:
        pass
    except ShardError as exn:
        return str(exn)
    return f"no such file: {path}"


def distinct_shards(urls: Iterable[str]) -> Tuple[List[str], List[List[str]]]:
    """``(unique, repeated)``: ``urls`` with each shard once, by the first name given for it, and
    the names of each shard given more than once, as lists in input order. One shard: the same
    URL, or local paths of the same file (``./``, ``..`` and symlinks resolved)."""
    names: Dict[str, List[str]] = {}
    for url in urls:
        path = local_path(url) if url != "-" else None
        names.setdefault(os.path.realpath(path) if path is not None else url, []).append(url)
    return [group[0] for group in names.values()], [group for group in names.values() if len(group) > 1]


def check_output(path: str, force: bool = False) -> None:
    """Refuse to overwrite an existing local ``path`` unless ``force`` (tar would; wdsmp does
    not). ``-`` and remote URLs pass."""
    local = local_path(path) if path != "-" else None
    if local is not None and os.path.exists(local) and not force:
        die(f"{local} exists; remove it or pass --force")


def print_json(summary: object) -> None:
    json.dump(summary, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


class Progress:
    """Counts items and bytes of long work and shows the rate on stderr (see the module
    docstring). Use as a context manager; ``update(items, nbytes)`` as work is done."""

    def __init__(self, description: str, total: Optional[int] = None, unit: str = "samples", quiet: bool = False,
                 interval: float = 10.0, stream: Optional[TextIO] = None) -> None:
        self.description, self.total, self.unit = description, total, unit
        self.items = self.bytes = 0
        self.stream = sys.stderr if stream is None else stream
        self.quiet, self.interval = quiet, interval
        self.started = self.logged = time.monotonic()
        self.bar: "Optional[tqdm]" = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=description, unit=unit[:-1] if unit.endswith("s") else unit,
                            file=self.stream, dynamic_ncols=True)

    def update(self, items: int = 1, nbytes: int = 0) -> None:
        self.items += items
        self.bytes += nbytes
        if self.bar is not None:
            self.bar.update(items)
        elif not self.quiet and time.monotonic() - self.logged >= self.interval:
            self.logged = time.monotonic()
            self._line()

    def _line(self, final: bool = False) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        of = f"/{self.total:,}" if self.total is not None else ""
        print(f"wdsmp {self.description}: {self.items:,}{of} {self.unit}, {self.items / elapsed:,.0f} {self.unit}/s, "
              f"{self.bytes / elapsed / 1e6:,.1f} MB/s{', done' if final else ''} ({elapsed:,.1f} s)",
              file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet and exc[0] is None:
            self._line(final=True)
