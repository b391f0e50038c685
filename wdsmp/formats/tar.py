"""Tar format facts and the cold paths shared by the native splitter and its twin.

The hot loop (header checksum, numeric fields, copying member data) lives twice:
in ``src/ext/_tarsplit.pyx`` and, in Python, here (``header_number``,
``checksum_ok``, used by ``wdsmp/native/tarsplit_py.py`` and by the cache's file-type
check). Everything that runs rarely lives here once, so both report identical
errors and agree on pax headers by construction.
"""

import posixpath
from typing import Any, Dict, Optional, Sequence, Tuple

from .._internal import env
from ..errors import TarFormatError
from .._internal.validation import positive_int

BLOCK = 512
MAX_MEMBER_SIZE = 1 << 56  # beyond any real member; keeps size arithmetic in range
# Memory is allocated for at most this much of a member before its data has arrived: a
# damaged or hostile 512-byte header may claim gigabytes.
UNTRUSTED_CHUNK = 1 << 25

# The most one member may hold, unless the reader is told otherwise: wdsmp holds each member
# in memory, and a gzip-compressed shard of a few MB can expand to members of gigabytes.
DEFAULT_MAX_MEMBER_SIZE = 1 << 30
# Hard and symbolic links are resolved to the data of one of the last LINK_MEMBERS members
# read, as long as those hold at most LINK_WINDOW bytes (the oldest are forgotten first; the
# newest is always held): NOTE [tar links].
LINK_MEMBERS = 64
LINK_WINDOW = 16 << 20

# Type flags (POSIX ustar, GNU and pax).
REGULAR_TYPES = (b"0", b"\0", b"7")
HARD_LINK = b"1"
SYMBOLIC_LINK = b"2"
DIRECTORY = b"5"
SPECIAL_TYPES = {b"3": "character device", b"4": "block device", b"6": "FIFO"}  # no file data
SKIPPED_TYPES = (b"g", b"V", b"D")  # pax global header, GNU volume label and dump directory: metadata
GNU_LONGNAME = b"L"
GNU_LONGLINK = b"K"
GNU_SPARSE = b"S"
PAX_HEADER = b"x"
PAX_GLOBAL = b"g"

GZIP_MAGIC = b"\x1f\x8b"


def header_number(field: bytes) -> int:
    """A numeric header field: octal text or GNU base-256; -1 when invalid."""
    if field[0] & 0x80:
        if field[0] == 0xFF:
            return -1
        value = int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
        return value if value < MAX_MEMBER_SIZE else -1
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if any(c < 48 or c > 55 for c in text):
        return -1
    value = int(text, 8)
    return value if value <= MAX_MEMBER_SIZE * 8 else -1


def checksum_ok(header: bytes) -> bool:
    """The stored checksum of a header block matches its bytes, the checksum field
    counted as spaces (some old writers summed signed chars: either sum will do)."""
    stored = header_number(header[148:156])
    rest = header[:148] + header[156:]
    unsigned = sum(rest) + 8 * 32
    signed = unsigned - 256 * sum(1 for c in rest if c > 127)
    return stored >= 0 and stored in (unsigned, signed)


def member_size_limit(value: Optional[int] = None, name: str = "max_member_size") -> int:
    """The cap on one member's size (or a decompressed field's): ``value`` (the argument
    ``name``), else ``WDSMP_MAX_MEMBER_SIZE``, else :data:`DEFAULT_MAX_MEMBER_SIZE`."""
    if value is None:
        value = env.max_member_size() or DEFAULT_MAX_MEMBER_SIZE
    return min(positive_int(value, name), MAX_MEMBER_SIZE)


def decode_name(raw: bytes) -> str:
    """Member names are bytes in the archive; undecodable bytes survive a round trip."""
    return raw.decode("utf-8", "surrogateescape")


def parse_pax(data: bytes, url: Optional[str], offset: int) -> Dict[str, Any]:
    """Parse a pax extended header into ``{"path": str, "linkpath": str, "size": int}``
    (only those keys).

    Records are ``"LEN key=value\\n"``, LEN counting the whole record.
    """
    result: Dict[str, Any] = {}
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:  # NUL padding after the last record
            break
        space = data.find(b" ", pos)
        if space < 0:
            raise bad_pax(url, offset)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise bad_pax(url, offset) from None
        end = pos + length
        if length <= 0 or end > n or data[end - 1:end] != b"\n":
            raise bad_pax(url, offset)
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq:
            raise bad_pax(url, offset)
        if key in (b"path", b"linkpath"):
            result[key.decode()] = decode_name(value)
        elif key == b"size":
            try:
                result["size"] = int(value)
            except ValueError:
                raise bad_pax(url, offset) from None
            if not 0 <= result["size"] < MAX_MEMBER_SIZE:
                raise bad_pax(url, offset)
        pos = end
    return result


# NOTE [tar links]: GNU tar stores a file that is a hard link to one already archived as a
# link member (type 1) naming it, with no data: its data is the earlier member's. Readers
# that skip such members (webdataset's does) hand out samples missing fields. Both splitters
# keep the data of the last LINK_MEMBERS members read, within LINK_WINDOW bytes (a ring on
# the hot path, natively in C), and give a hard link, or a symbolic link (type 2) naming a
# member by a path inside the archive, that member's data under its own name
# (``resolve_link``); a link to a member further back, or out of the archive, is a
# TarFormatError saying how to write the shard without links. ``links`` lists what was
# resolved, for ``wdsmp verify``, ``info`` and ``index`` to report: other readers drop them.
# Directories are skipped (they hold no data); devices and FIFOs, and type flags no standard
# defines, are TarFormatErrors naming the member, never silently dropped.


def resolve_link(url: Optional[str], typeflag: bytes, name: str, target: str, offset: int,
                 recent: Sequence[Tuple[str, Optional[bytes], int]]) -> Tuple[Optional[bytes], int]:
    """``(data, size)`` of link member ``name`` (``typeflag`` 1 or 2) naming ``target``, from
    ``recent``: ``[(name, data, size)]`` of the members a splitter holds, oldest first (NOTE
    [tar links]; ``data`` is None where only headers are read). A TarFormatError when the
    target is out of the archive or not held."""
    kind = "hard link" if typeflag == HARD_LINK else "symbolic link"
    path = posixpath.normpath(target if typeflag == HARD_LINK else posixpath.join(posixpath.dirname(name), target))
    if typeflag == SYMBOLIC_LINK and (target.startswith("/") or path == ".." or path.startswith("../")):
        raise TarFormatError(f"{kind} to {target!r}, outside the archive: the shard does not hold its data "
                             f"(write it with tar -h, which stores the files links point to)", url, name, offset)
    for held, data, size in reversed(recent):
        if held == target or posixpath.normpath(held) == path:
            return data, size
    raise TarFormatError(f"{kind} to {target!r}, a member not among the last {LINK_MEMBERS} members and "
                         f"{LINK_WINDOW >> 20} MiB read (wdsmp keeps that much to resolve links): write the "
                         f"shard without links (tar --hard-dereference for hard links, tar -h for symbolic ones)",
                         url, name, offset)


# Errors. Each names the shard and the byte offset (in the decompressed stream)
# of the header block where the problem starts.


def empty_file(url: Optional[str]) -> TarFormatError:
    return TarFormatError("empty file (0 bytes): not a tar archive", url, offset=0)


def not_a_tar(url: Optional[str], head: bytes) -> TarFormatError:
    return TarFormatError(f"not a tar archive (starts with {bytes(head[:24])!r})", url, offset=0)


def bad_checksum(url: Optional[str], offset: int) -> TarFormatError:
    return TarFormatError("bad tar header checksum: corrupt archive", url, offset=offset)


def bad_number(url: Optional[str], offset: int, field: str) -> TarFormatError:
    return TarFormatError(f"bad tar header: invalid {field} field", url, offset=offset)


def bad_pax(url: Optional[str], offset: int) -> TarFormatError:
    return TarFormatError("bad pax extended header", url, offset=offset)


def unsupported_sparse(url: Optional[str], name: Optional[str], offset: int) -> TarFormatError:
    return TarFormatError("unsupported tar member type: GNU sparse file", url, name, offset)


def unsupported_type(url: Optional[str], name: Optional[str], offset: int, typeflag: bytes) -> TarFormatError:
    """A member that is no file (a device, a FIFO) or of a type no standard defines."""
    what = SPECIAL_TYPES.get(typeflag, "an unknown type")
    return TarFormatError(f"unsupported tar member type {typeflag.decode('latin-1')!r} ({what}): not file data "
                          f"a sample can hold", url, name, offset)


def member_too_large(url: Optional[str], name: Optional[str], offset: int, size: int,
                     limit: int) -> TarFormatError:
    return TarFormatError(f"member of {size} bytes, more than the {limit} bytes one member may hold "
                          f"(max_member_size, or WDSMP_MAX_MEMBER_SIZE): refusing to read it", url, name, offset)


def truncated_header(url: Optional[str], offset: int, got: int) -> TarFormatError:
    return TarFormatError(
        f"truncated tar archive: stream ended inside a header block ({got} of {BLOCK} bytes)",
        url,
        offset=offset,
    )


def truncated_member(url: Optional[str], name: Optional[str], offset: int, got: int,
                     need: int) -> TarFormatError:
    """``need`` counts the member's data and its padding to a whole block."""
    return TarFormatError(
        f"truncated tar archive: member ended after {got} of {need} bytes (data and padding)",
        url,
        name,
        offset,
    )


def missing_end_marker(url: Optional[str], offset: int) -> TarFormatError:
    return TarFormatError(
        "truncated tar archive: stream ended at a member boundary "
        "without the end-of-archive marker",
        url,
        offset=offset,
    )
