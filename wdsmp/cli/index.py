"""``wdsmp index``: the shard manifest wdsmp's loaders read, or DALI's index files.

The manifest (:mod:`wdsmp.shards.index`) gives each shard's sample count, which is what
exact epochs and ``len()`` need, with its size and sha256 for ``wdsmp verify --index``.
Samples are counted by wdsmp's own reader, so the counts are the ones the loaders see;
a shard the reader finds damaged gets no entry and no manifest is written, since
counts that are wrong would break exact epochs later, far from the cause.

``--format dali`` writes one index file per shard for NVIDIA DALI's
``fn.readers.webdataset(paths=..., index_paths=...)``. The format is DALI's version
1.2, as its ``tools/wds2idx.py`` writes it and ``webdataset_loader.cc`` parses it: a
first line ``v1.2 <samples>``, then one line per sample with, for each of its
members, ``<ext> <offset> <size> <member name>``, separated by spaces, where
``offset`` is where the member's data (not its header) starts in the tar file. DALI
seeks to those offsets, so the shard must be an uncompressed tar, and it splits the
line at whitespace, so a member name may not contain any; DALI also refuses an
index of no samples. Samples are grouped as wdsmp groups them, so a DALI epoch and
a wdsmp epoch see the same samples.
"""

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

from ..gopen import local_path
from ..native.core import tar_splitter_class
from ..shards.index import INDEX_NAME, relative_url, write_atomic, write_index
from ..formats.tar import BLOCK, GZIP_MAGIC
from ..tariterators import _META_FILES, SHARD_END, ShardFailed, base_plus_ext, group_by_keys
from .common import Progress, add_common, check_output, die, distinct_shards, expand_inputs, print_json
from .verify import Problem, ShardReport, check_shard, open_counted

if TYPE_CHECKING:
    from ..native.tarsplit_py import TarSplitter
    from ..tariterators import _Boundary

__all__ = ["add_parser", "dali_index", "run"]

DALI_VERSION = "v1.2"


def _components(splitter: "TarSplitter", url: str,
                report: ShardReport) -> Iterator[Union[Dict[str, Any], "_Boundary"]]:
    """Members for group_by_keys whose ``data`` is the DALI component ``(ext, data offset,
    size, name)`` and the header's offset, instead of the bytes; then the shard's end marker.
    The data offset is where the splitter stands after the member, less its padded size."""
    try:
        for name, data, offset in splitter:
            if re.match(_META_FILES, name):
                continue  # skipped by wdsmp's reader too
            if splitter.links and splitter.links[-1][2] == offset:
                report.problems.append(Problem(url, "dali", f"a link member (to {splitter.links[-1][1]!r}): its "
                                               f"data is stored under another name, which DALI's index "
                                               f"cannot describe", name, offset))
            assert data is not None  # a TarSplitter reads every member's data (TarHeaders would not)
            padded = (len(data) + BLOCK - 1) // BLOCK * BLOCK
            component = (base_plus_ext(name)[1], splitter.position - padded, len(data), name, offset)
            yield {"fname": name, "data": component, "__offset__": offset, "__url__": url}
    except (OSError, ValueError) as exn:
        report.record(exn)
        yield ShardFailed(getattr(exn, "member", None))
        return
    yield SHARD_END


def dali_index(url: str) -> Tuple[Optional[str], ShardReport]:
    """``(text of the DALI index file, ShardReport)`` for the shard at ``url``; the text is
    None when the shard has problems (they are in the report)."""
    report = ShardReport(url)
    try:
        stream, counter = open_counted(url)
    except (OSError, ValueError) as exn:
        report.record(exn)
        return None, report
    lines: List[str] = []
    try:
        if stream.peek(2)[:2] == GZIP_MAGIC:
            report.problems.append(Problem(url, "dali", "gzip-compressed: DALI's reader needs an uncompressed tar"))
        else:
            members = _components(tar_splitter_class()(stream, url), url, report)
            for sample in group_by_keys(members, handler=report.record):
                components = [value for name, value in sample.items() if not name.startswith("__")]
                for _, _, _, name, offset in components:
                    if any(c.isspace() for c in name):
                        report.problems.append(Problem(url, "dali", "whitespace in the member name, which "
                                                       "DALI's index format cannot hold", name, offset))
                lines.append(" ".join(f"{ext} {start} {size} {name}" for ext, start, size, name, _ in components))
    finally:
        stream.close()
    report.samples = len(lines)
    report.size = counter.finish()[0]
    if not report.problems and not lines:
        report.problems.append(Problem(url, "dali", "no samples: DALI refuses an index of none"))
    if report.problems:
        return None, report
    return "".join(f"{line}\n" for line in [f"{DALI_VERSION} {len(lines)}"] + lines), report


def _shard_name(url: str) -> str:
    """A shard's name up to its first dot, as DALI's wds2idx names index files."""
    path = local_path(url)
    return os.path.basename(path if path is not None else urlsplit(url).path).split(".", 1)[0]


def _dali_paths(output: str, urls: Iterable[str]) -> Dict[str, str]:
    """Where each shard's index file goes: ``output`` with ``{name}`` replaced by the shard's
    name (up to its first dot), or ``output/<name>.idx`` when it has no ``{name}``."""
    paths: Dict[str, str] = {}
    for url in urls:
        name = _shard_name(url)
        if not name:
            die(f"cannot name an index file after {url!r}")
        path = output.replace("{name}", name) if "{name}" in output else os.path.join(output, f"{name}.idx")
        if path in paths.values():
            other = next(u for u, p in paths.items() if p == path)
            die(f"{other} and {url} would both write {path}; give -o a pattern that tells them apart")
        paths[url] = path
    return paths


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "index", help="write the shard manifest (sample counts, sizes, sha256), or DALI index files",
        description="Count the samples of each shard with wdsmp's reader and write the manifest its "
                    "loaders read (index.json: url, samples, size, sha256 per shard; paths relative to the "
                    "manifest when the shards are beside or below it, absolute otherwise). With --format "
                    "dali, write instead one index file per shard for DALI's fn.readers.webdataset("
                    "index_paths=...). Damaged shards are reported and get no index; the status is then 1. "
                    "A shard given twice is refused.")
    parser.add_argument("shards", nargs="+", metavar="SHARD", help="shards (paths, URLs, brace patterns, globs)")
    parser.add_argument("-o", "--output",
                        help=f"the manifest to write (default: {INDEX_NAME} beside the shards, where the loaders "
                             f"look for it, when they are local files in one directory); with --format dali a "
                             f"directory, or a pattern with {{name}} (the shard's name up to its first dot), "
                             f"e.g. 'idx/{{name}}.idx'")
    parser.add_argument("--format", choices=("json", "dali"), default="json",
                        help="json: wdsmp's manifest (default); dali: DALI's per-shard index files")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite existing output")
    add_common(parser)
    parser.set_defaults(func=run)


def _count(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _report_problems(reports: Sequence[ShardReport]) -> int:
    """Print the problems and notes on stderr; the number of shards that have problems."""
    for report in reports:
        for problem in report.problems:
            print(f"wdsmp index: {problem}", file=sys.stderr)
        for note in report.notes:
            print(f"wdsmp index: note: {note}", file=sys.stderr)
    return sum(bool(report.problems) for report in reports)


def _default_output(urls: Sequence[str], args: argparse.Namespace) -> str:
    """Where the manifest goes without ``-o``: ``index.json`` in the local shards' directory."""
    if args.format == "dali":
        die("--format dali needs -o: a directory, or a pattern with {name}")
    paths = [local_path(url) for url in urls]
    directories = {os.path.dirname(os.path.abspath(path)) for path in paths if path is not None}
    if None in paths or len(directories) != 1:
        die(f"give -o: the shards are not local files in one directory (e.g. -o {INDEX_NAME}, then put it "
            f"beside the shards as {INDEX_NAME}, where the loaders look for it)")
    return os.path.join(directories.pop(), INDEX_NAME)


def run(args: argparse.Namespace) -> int:
    urls = expand_inputs(args.shards)
    if args.output is None:
        args.output = _default_output(urls, args)
    if local_path(args.output) is None:
        die(f"-o must be a local path, not {args.output!r}")
    if "-" in urls:
        die("an index lists shards by URL: stdin cannot be indexed")
    repeated = distinct_shards(urls)[1]
    if repeated:
        names = "; ".join(" and ".join(group) for group in repeated)
        die(f"the same shard given more than once ({names}): an index lists each shard once, or the "
            f"loaders would count its samples again")
    if args.format == "dali":
        paths = _dali_paths(args.output, urls)
    else:
        paths = {url: args.output for url in urls}
    for path in set(paths.values()):
        check_output(path, args.force)
    reports = []
    with Progress("index", total=len(urls), unit="shards", quiet=args.quiet) as progress:
        for url in urls:
            if args.format == "dali":
                text, report = dali_index(url)
                if text is not None:
                    write_atomic(paths[url], text)
            else:
                report = check_shard(url, hashed=True)
            reports.append(report)
            progress.update(1, report.size or 0)
    bad = _report_problems(reports)
    if args.format == "json" and not bad:
        write_index(args.output, [{"url": relative_url(args.output, r.url), "samples": r.samples,
                                   "size": r.size, "sha256": r.sha256} for r in reports])
    if bad:
        outcome = f"{args.output} not written" if args.format == "json" else "they got no index file"
        print(f"wdsmp index: {_count(bad, 'shard')} with problems; {outcome}", file=sys.stderr)
    good = [r for r in reports if not r.problems]
    written = sorted({paths[r.url] for r in good}) if args.format == "dali" or not bad else []
    samples = sum(r.samples for r in good)
    if args.json:
        print_json({"format": args.format, "written": written, "shards": len(good), "samples": samples,
                    "bytes": sum(r.size for r in good), "failed": [r.url for r in reports if r.problems]})
    elif not args.quiet and written:
        what = args.output if args.format == "json" else _count(len(written), "DALI index file")
        print(f"wdsmp index: wrote {what}: {_count(len(good), 'shard')}, {_count(samples, 'sample')}",
              file=sys.stderr)
    return 1 if bad else 0
