"""``wdsmp verify``: read shards as wdsmp's loaders do and report every problem found.

Shards go through wdsmp's own tar reader and sample grouping, so what verify calls damaged
is exactly what stops a loader (or, with a skipping handler, silently drops samples). A
loader stops at the first problem; verify goes on: after tar damage it reports the damaged
member and moves to the next shard (a damaged tar stream cannot be resumed), after a sample
problem (members split apart, duplicated) it goes on with the next sample. A shard that
cannot be opened (a missing file, an HTTP error) is a problem of that shard like any other.
Each problem names the shard, the member and its byte offset where there is one.

``--index`` compares sample counts, sizes and sha256 digests with a manifest (see
:mod:`wdsmp.shards.index`); the digest comes from the same pass that reads the tar. A
manifest without sizes or digests (one written by ``ShardWriter(index=...)`` holds counts
only) cannot catch a changed byte: the summary then says which checks were not made.
``--decode`` decodes every image with the loaders' image decoder, and every JPEG once more
with strict libjpeg-turbo, because Pillow decodes JPEGs with corrupt entropy data into
wrong pixels without a word (JPEG has no checksum: damage libjpeg-turbo does not notice
goes unseen).
"""

import argparse
import hashlib
import io
import os
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union

from ..autodecode import ImageHandler
from ..errors import SampleError, TarFormatError
from ..images.size import is_jpeg
from ..gopen import gopen, local_path
from ..shards.index import read_entries
from ..tariterators import base_plus_ext, group_by_keys, tar_file_expander
from .common import Progress, add_common, die, distinct_shards, expand_inputs, print_json

_T = TypeVar("_T")

__all__ = ["Problem", "ShardReport", "add_parser", "check_shard", "open_counted", "run"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a shard. ``kind``: ``read`` (cannot be opened or read), ``tar``
    (damaged archive), ``sample`` (members that do not group into samples), ``decode`` (an
    image that does not decode), ``index`` (disagrees with the manifest) or ``dali`` (cannot
    be described by a DALI index file, see :mod:`wdsmp.cli.index`)."""

    shard: str
    kind: str
    message: str
    member: Optional[str] = None
    offset: Optional[int] = None

    @classmethod
    def from_error(cls, shard: str, exn: BaseException) -> "Problem":
        """From an error of the reader, which carries member and offset (wdsmp.errors)."""
        kind = "tar" if isinstance(exn, TarFormatError) else "sample" if isinstance(exn, SampleError) else "read"
        return cls(shard, kind, getattr(exn, "problem", None) or str(exn),
                   getattr(exn, "member", None), getattr(exn, "offset", None))

    def __str__(self) -> str:
        where = "".join([f", member {self.member!r}" if self.member is not None else "",
                         f", offset {self.offset}" if self.offset is not None else ""])
        return f"{self.shard}{where}: {self.message}"


@dataclass
class ShardReport:
    """What reading one shard found. ``complete``: read to its end without tar damage, so
    ``samples`` is the shard's count; ``size`` and ``sha256`` (when asked for) cover every
    byte of the file, also after damage; None when it could not be read to its end.
    ``notes``: what wdsmp reads but other readers may not (link members), kind ``link``;
    they are said, but are no problem."""

    url: str
    samples: int = 0
    size: Optional[int] = None
    sha256: Optional[str] = None
    problems: List[Problem] = field(default_factory=list)
    notes: List[Problem] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not any(p.kind in ("read", "tar") for p in self.problems)

    def record(self, exn: BaseException) -> bool:
        """The reader's ``handler``: note the problem and go on; anything else than damage
        (a bug, not the data) is raised."""
        if not isinstance(exn, (OSError, ValueError)):
            raise exn
        self.problems.append(Problem.from_error(self.url, exn))
        return True


class _Counted(io.RawIOBase):
    """A shard's bytes as read, counted and optionally hashed, so that size and sha256 come
    from the pass that checks the tar. Closing it leaves the source open: :meth:`finish`
    reads what the tar reader left unread (after damage) and closes it."""

    def __init__(self, source: IO[bytes], hashed: bool) -> None:
        super().__init__()
        self.source = source
        self.size = 0
        self.hash = hashlib.sha256() if hashed else None

    def readable(self) -> bool:
        return True

    # BufferedReader passes a memoryview, finish() a bytearray: narrower than RawIOBase's writable buffers
    def readinto(self, buffer: Union[bytearray, memoryview]) -> int:  # type: ignore[override]
        chunk = self.source.read(len(buffer))
        n = len(chunk)
        memoryview(buffer).cast("B")[:n] = chunk
        self.size += n
        if self.hash is not None:
            self.hash.update(chunk)
        return n

    def finish(self) -> Tuple[Optional[int], Optional[str]]:
        """``(size, sha256 or None)`` of the whole source, or ``(None, None)`` when the rest
        cannot be read (the read error was already reported by the tar reader)."""
        buffer = bytearray(1 << 20)
        try:
            try:
                while self.readinto(buffer):
                    pass
            finally:
                self.source.close()  # a pipe's status may raise here
        except OSError:
            return None, None
        return self.size, self.hash.hexdigest() if self.hash is not None else None


def open_counted(url: str, hashed: bool = False) -> Tuple[io.BufferedReader, _Counted]:
    """``url`` opened with gopen, as ``(buffered stream, counter)``; see ``_Counted``."""
    counter = _Counted(gopen(url), hashed)
    return io.BufferedReader(counter, 1 << 16), counter


def _noted(members: Iterable[_T], report: ShardReport) -> Iterator[_T]:
    """Members passed through; each link member is noted in ``report`` (NOTE [tar links] in
    ``wdsmp.formats.tar``): wdsmp gives it the data of the member it names, other readers drop it."""
    for member in members:
        if isinstance(member, dict) and "__link__" in member:
            report.notes.append(Problem(report.url, "link", f"link member read as {member['__link__']!r}, "
                                        f"whose data it shares; webdataset, DALI and other readers drop it: "
                                        f"write shards without links (tar --hard-dereference, tar -h)",
                                        member["fname"], member["__offset__"]))
        yield member


def _located(members: Iterable[_T], places: Dict[Tuple[str, str], Tuple[str, int]]) -> Iterator[_T]:
    """Members passed through, each member's name and offset noted by (key, field), so that
    a field that fails to decode can be named as the reader names damage."""
    for member in members:
        if isinstance(member, dict):
            key, ext = base_plus_ext(member["fname"])
            if key is not None:
                assert ext is not None  # base_plus_ext gives an extension with every key
                places[key, ext.lower()] = (member["fname"], member["__offset__"])
        yield member


_IMAGES = ImageHandler("rgb8")


def _jpeg_damage(data: bytes) -> Optional[str]:
    """What strict libjpeg-turbo says against a JPEG the lenient decoders accepted, or None.
    Decoded at 1/8 scale: the entropy data is read whole, and that is where damage shows."""
    import simplejpeg

    try:
        colorspace = simplejpeg.decode_jpeg_header(data)[2]
        simplejpeg.decode_jpeg(data, colorspace="CMYK" if colorspace in ("CMYK", "YCCK") else "GRAY",
                               strict=True, min_height=1, min_width=1)
    except ValueError as exn:
        return str(exn)
    return None


def _decode_problems(url: str, sample: Mapping[str, Any],
                     places: Dict[Tuple[str, str], Tuple[str, int]]) -> Iterator[Problem]:
    """Problems of the images in ``sample``, each named by its member and offset."""
    from PIL import UnidentifiedImageError

    key = sample["__key__"]
    for name, data in sample.items():
        if name.startswith("__"):
            continue
        member, offset = places.pop((key, name), (f"{key}.{name}", None))
        try:
            if _IMAGES(name, data) is None:
                continue
        except UnidentifiedImageError:
            yield Problem(url, "decode", f"cannot decode the image: not an image format Pillow knows (it starts "
                                         f"{data[:8]!r})", member, offset)
            continue
        except Exception as exn:  # Pillow raises many kinds of error for bad data
            yield Problem(url, "decode", f"cannot decode the image: {type(exn).__name__}: {exn}", member, offset)
            continue
        damage = _jpeg_damage(data) if is_jpeg(data) else None
        if damage is not None:
            yield Problem(url, "decode", f"damaged JPEG data (libjpeg-turbo: {damage})", member, offset)


def check_shard(url: str, decode: bool = False, hashed: bool = False) -> ShardReport:
    """Read the shard at ``url`` as the loaders do; a :class:`ShardReport`."""
    report = ShardReport(url)
    try:
        stream, counter = open_counted(url, hashed)
    except (OSError, ValueError) as exn:
        report.record(exn)
        return report
    places: Dict[Tuple[str, str], Tuple[str, int]] = {}
    members = tar_file_expander([{"url": url, "stream": stream}], handler=report.record, boundaries=True)
    members = _noted(members, report)
    if decode:
        members = _located(members, places)
    for sample in group_by_keys(members, handler=report.record):
        report.samples += 1
        if decode:
            report.problems.extend(_decode_problems(url, sample, places))
    report.size, report.sha256 = counter.finish()
    return report


def _place(url: str) -> str:
    """A shard's identity for matching it with a manifest entry."""
    path = local_path(url)
    return os.path.abspath(path) if path is not None else url


def _index_problems(report: ShardReport, entry: Optional[Mapping[str, Any]], index: str) -> Iterator[Problem]:
    url = report.url
    if entry is None:
        yield Problem(url, "index", f"not listed in the index {index}")
        return
    if report.complete and entry["samples"] != report.samples:
        yield Problem(url, "index", f"{report.samples} samples, the index says {entry['samples']}")
    if report.size is not None and "size" in entry and entry["size"] != report.size:
        yield Problem(url, "index", f"{report.size} bytes, the index says {entry['size']}")
    if report.sha256 is not None and "sha256" in entry and entry["sha256"] != report.sha256:
        yield Problem(url, "index", f"sha256 {report.sha256}, the index says {entry['sha256']}")


def _unchecked(entries: Mapping[str, Mapping[str, Any]], urls: Iterable[str]) -> Optional[str]:
    """What the manifest could not check in the shards ``urls``, as a sentence, or None."""
    listed = [entries[_place(url)] for url in urls if _place(url) in entries]
    missing = [f"{what} ({sum(key not in e for e in listed)} of {len(listed)} shards)" if any(key in e for e in listed)
               else what for key, what in (("size", "sizes"), ("sha256", "sha256 digests"))
               if any(key not in e for e in listed)]
    if not missing:
        return None
    return (f"the index has no {' and no '.join(missing)}: those checks were not made, a changed byte would "
            f"pass unseen (`wdsmp index` writes a manifest with both)")


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "verify", help="check shards: tar structure, samples, images, against an index",
        description="Read shards as wdsmp's loaders do and report every problem: tar damage (truncation, "
                    "bad checksums, not a tar, empty files), members that do not group into samples, "
                    "with --index disagreements with a manifest, with --decode images that do not "
                    "decode, and files that cannot be read (missing ones included). Each problem names "
                    "shard, member and byte offset. A shard given twice is checked once. The status is 1 "
                    "if anything is wrong.")
    parser.add_argument("shards", nargs="*", metavar="SHARD",
                        help="shards (paths, URLs, brace patterns, globs); default: those the index lists")
    parser.add_argument("--index", metavar="INDEX", help="a manifest (wdsmp index) to check counts, sizes "
                        "and sha256 against")
    parser.add_argument("--decode", action="store_true", help="decode every image (JPEG strictly)")
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.shards and args.index is None:
        die("give the shards to check, or --index to check the shards it lists")
    entries: Optional[Dict[str, Dict[str, Any]]] = None
    if args.index is not None:
        entries = {_place(entry["url"]): entry for entry in read_entries(args.index)}
    if args.shards:  # a missing file is a problem of its shard, reported with the others'
        urls = distinct_shards(expand_inputs(args.shards, missing_ok=True, index_option='--index'))[0]
    else:
        assert entries is not None  # no shards: --index gives them, as checked above
        urls = [entry["url"] for entry in entries.values()]
    hashed = entries is not None and any("sha256" in entry for entry in entries.values())
    unchecked = _unchecked(entries, urls) if entries is not None else None
    problems: List[Problem]
    notes: List[Problem]
    problems, notes, samples, nbytes, bad = [], [], 0, 0, 0
    with Progress("verify", total=len(urls), unit="shards", quiet=args.quiet) as progress:
        for url in urls:
            report = check_shard(url, decode=args.decode, hashed=hashed)
            if entries is not None:
                report.problems.extend(_index_problems(report, entries.get(_place(url)), args.index))
            samples += report.samples
            nbytes += report.size or 0
            bad += bool(report.problems)
            problems.extend(report.problems)
            notes.extend(report.notes)
            if not args.json:
                for problem in report.problems:
                    print(problem, flush=True)
                for note in report.notes:
                    print(f"note: {note}", flush=True)
            progress.update(1, report.size or 0)
    if args.json:
        print_json({"shards": len(urls), "samples": samples, "bytes": nbytes, "bad_shards": bad,
                    "problems": [asdict(p) for p in problems], "notes": [asdict(n) for n in notes],
                    "unchecked": unchecked})
    else:
        verdict = (f"{len(problems)} problem{'s' * (len(problems) != 1)} in {bad} shard{'s' * (bad != 1)}"
                   if problems else "no problems")
        if notes:
            verdict += f" ({len(notes)} note{'s' * (len(notes) != 1)})"
        print(f"verified {len(urls)} shard{'s' * (len(urls) != 1)}, {samples} samples, {nbytes:,} bytes: {verdict}")
        if unchecked is not None:
            print(f"note: {unchecked}")
    return 1 if problems else 0
