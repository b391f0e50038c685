"""``wdsmp ls`` (members and sizes) and ``wdsmp info`` (samples, fields, sizes) of shards.

Both read every shard to its end, so they double as a check: a damaged shard is reported on
stderr with the problem and where it is (wdsmp's reader says shard, member and byte offset), the
other shards are still read, and the status is 1.
"""

import argparse
import collections
import sys
from typing import Any, Container, Dict, Iterable, Iterator, List, MutableMapping, Sequence, Tuple, TypeVar

from ..errors import WdsmpError
from ..gopen import gopen
from ..tariterators import base_plus_ext, group_by_keys, tar_file_expander, tar_file_iterator, url_opener
from .common import Progress, add_common, expand_inputs, print_json

_T = TypeVar("_T")

_READER_FIELDS = ("__url__", "__local_path__")  # what group_by_keys adds to a sample


def _tallied(members: Iterable[_T], tally: MutableMapping[str, Any]) -> Iterator[_T]:
    """Members, unchanged, counting them, those outside any sample (no extension) and link
    members (which the reader gives the data of the member they name)."""
    for member in members:
        if isinstance(member, dict):
            tally["members"] += 1
            if base_plus_ext(member["fname"])[0] is None:
                tally["outside"] += 1
            if "__link__" in member:
                tally["links"] += 1
                tally.setdefault("first_link", (member["fname"], member["__link__"]))
        yield member


def link_note(count: int, first: Tuple[str, str]) -> str:
    """What to say about a shard's link members: wdsmp reads them, other readers drop them."""
    name, target = first
    return (f"{count} link member{'s' * (count != 1)} (hard or symbolic, e.g. {name!r} -> {target!r}), read "
            f"as the members they name; webdataset, DALI and other readers drop them: write shards without "
            f"links (tar --hard-dereference, tar -h)")


def read_samples(urls: Sequence[str], tally: MutableMapping[str, Any]) -> Iterator[Dict[str, Any]]:
    """The samples of ``urls`` exactly as stored: ``__key__`` and one entry per field, field names
    with their case kept. ``tally`` (a Counter) gets ``members`` and ``outside`` (members that
    belong to no sample); ``__name__`` metadata members are skipped, as readers skip them.
    Damage raises wdsmp's errors, naming the shard."""
    members = tar_file_expander(url_opener(urls), boundaries=True)
    for sample in group_by_keys(_tallied(members, tally), lcase=False):
        for name in _READER_FIELDS:
            sample.pop(name, None)
        yield sample


def _reported(command: str, exn: BaseException) -> None:
    print(f"wdsmp {command}: error: {exn}", file=sys.stderr)


def human(size: float) -> str:
    """A byte count for people: 1.2 MB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable: the last unit returns")


def _table(rows: Sequence[Sequence[str]], right: Container[int] = ()) -> List[str]:
    """Rows of text in columns, ``right`` ones aligned right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(width) if i in right else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ls = subparsers.add_parser("ls", help="list the members of shards with their sizes",
                               description="List every regular member of shards, one per line: shard, "
                               "member name and size in bytes, tab-separated (--json: a list).")
    ls.add_argument("shards", nargs="+", metavar="SHARDS",
                    help="paths, brace patterns, globs, URLs, '-', or a shard index (.json)")
    add_common(ls)
    ls.set_defaults(func=run_ls)
    info = subparsers.add_parser("info", help="count the samples, fields and sizes of shards",
                                 description="Read shards and report their samples, the fields "
                                 "(extensions) with counts and sizes, total and mean sample sizes, "
                                 "and the samples of each shard.")
    info.add_argument("shards", nargs="+", metavar="SHARDS",
                      help="paths, brace patterns, globs, URLs, '-', or a shard index (.json)")
    add_common(info)
    info.set_defaults(func=run_info)


def _members(url: str) -> Iterator[Tuple[str, int, int]]:
    with gopen(url) as stream:
        for member in tar_file_iterator(stream, skip_meta=None, url=url):
            yield member["fname"], len(member["data"]), member["__offset__"]


def run_ls(args: argparse.Namespace) -> int:
    urls = expand_inputs(args.shards, indexes=True)
    listing: List[Dict[str, Any]]
    listing, failed = [], 0
    for url in urls:
        try:
            for name, size, offset in _members(url):
                if args.json:
                    listing.append(dict(shard=url, member=name, size=size, offset=offset))
                else:
                    print(f"{url}\t{name}\t{size}")
        except BrokenPipeError:  # stdout closed (`| head`): the command's end, not the shard's fault
            raise
        except (WdsmpError, OSError, ValueError) as exn:
            failed += 1
            _reported("ls", exn)
    if args.json:
        print_json(listing)
    return 1 if failed else 0


def _shard_info(url: str, fields: Dict[str, List[int]], progress: Progress) -> Dict[str, Any]:
    """Read one shard, adding ``{extension: [samples, bytes]}`` to ``fields``; the shard's entry."""
    entry: Dict[str, Any] = dict(url=url, samples=0, bytes=0)
    tally: Dict[str, Any] = collections.Counter()  # counts, and first_link (a pair of names)
    try:
        for sample in read_samples([url], tally):
            size = 0
            for name, data in sample.items():
                if name != "__key__":
                    counts = fields.setdefault(name, [0, 0])
                    counts[0] += 1
                    counts[1] += len(data)
                    size += len(data)
            entry["samples"] += 1
            entry["bytes"] += size
            progress.update(1, size)
    except (WdsmpError, OSError, ValueError) as exn:
        entry["error"] = str(exn)
        _reported("info", exn)
    entry.update(members=tally["members"], outside=tally["outside"], links=tally["links"])
    if tally["links"]:
        print(f"wdsmp info: note: {url}: {link_note(tally['links'], tally['first_link'])}", file=sys.stderr)
    return entry


def run_info(args: argparse.Namespace) -> int:
    urls = expand_inputs(args.shards, indexes=True)
    fields: Dict[str, List[int]] = {}
    with Progress("info", quiet=args.quiet) as progress:
        shards = [_shard_info(url, fields, progress) for url in urls]
    samples = sum(shard["samples"] for shard in shards)
    total = sum(shard["bytes"] for shard in shards)
    mean = total / samples if samples else 0
    damaged = sum("error" in shard for shard in shards)
    members = sum(shard["members"] for shard in shards)
    outside = sum(shard["outside"] for shard in shards)
    links = sum(shard["links"] for shard in shards)
    if args.json:
        print_json(dict(
            shards=shards, samples=samples, bytes=total, mean_sample_bytes=mean, damaged=damaged,
            members=members, outside=outside, links=links,
            extensions={name: dict(samples=n, bytes=size, mean_bytes=size / n)
                        for name, (n, size) in sorted(fields.items())}))
    else:
        lines = [f"shards    {len(shards)}" + (f" ({damaged} damaged)" if damaged else ""),
                 f"samples   {samples}",
                 f"members   {members}" + "".join(f" ({n} {what})" for n, what in
                                                  ((outside, "outside any sample"), (links, "links")) if n),
                 f"data      {human(total)} total, {human(mean)} mean per sample", ""]
        rows = [("extension", "samples", "bytes", "mean")]
        rows += [(name, str(n), human(size), human(size / n)) for name, (n, size) in sorted(fields.items())]
        lines += _table(rows, right=(1, 2, 3)) + [""]
        rows = [("shard", "samples", "bytes", "")]
        rows += [(shard["url"], str(shard["samples"]), human(shard["bytes"]), "DAMAGED" if "error" in shard else "")
                 for shard in shards]
        lines += _table(rows, right=(1, 2))
        print("\n".join(lines))
    return 1 if damaged else 0
