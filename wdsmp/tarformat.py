"""Tar format facts and the cold paths shared by the native splitter and its twin.

The hot loop (header checksum, numeric fields, copying member data) lives twice:
in ``src/ext/_tarsplit.pyx`` and, in Python, here (``header_number``,
``checksum_ok``, used by ``wdsmp/_tarsplit_py.py`` and by the cache's file-type
check). Everything that runs rarely lives here once, so both report identical
errors and agree on pax headers by construction.
"""

from .errors import TarFormatError

BLOCK = 512
MAX_MEMBER_SIZE = 1 << 56  # beyond any real member; keeps size arithmetic in range
# Memory is allocated for at most this much of a member before its data has arrived: a
# damaged or hostile 512-byte header may claim gigabytes.
UNTRUSTED_CHUNK = 1 << 25

# Type flags (POSIX ustar, GNU and pax).
REGULAR_TYPES = (b"0", b"\0", b"7")
LINK_AND_SPECIAL_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")  # carry no data
GNU_LONGNAME = b"L"
GNU_LONGLINK = b"K"
GNU_SPARSE = b"S"
PAX_HEADER = b"x"
PAX_GLOBAL = b"g"

GZIP_MAGIC = b"\x1f\x8b"


def header_number(field):
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


def checksum_ok(header):
    """The stored checksum of a header block matches its bytes, the checksum field
    counted as spaces (some old writers summed signed chars: either sum will do)."""
    stored = header_number(header[148:156])
    rest = header[:148] + header[156:]
    unsigned = sum(rest) + 8 * 32
    signed = unsigned - 256 * sum(1 for c in rest if c > 127)
    return stored >= 0 and stored in (unsigned, signed)


def decode_name(raw):
    """Member names are bytes in the archive; undecodable bytes survive a round trip."""
    return raw.decode("utf-8", "surrogateescape")


def parse_pax(data, url, offset):
    """Parse a pax extended header into ``{"path": str, "size": int}`` (only those keys).

    Records are ``"LEN key=value\\n"``, LEN counting the whole record.
    """
    result = {}
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
        if key == b"path":
            result["path"] = decode_name(value)
        elif key == b"size":
            try:
                result["size"] = int(value)
            except ValueError:
                raise bad_pax(url, offset) from None
            if not 0 <= result["size"] < MAX_MEMBER_SIZE:
                raise bad_pax(url, offset)
        pos = end
    return result


# Errors. Each names the shard and the byte offset (in the decompressed stream)
# of the header block where the problem starts.


def empty_file(url):
    return TarFormatError("empty file (0 bytes): not a tar archive", url, offset=0)


def not_a_tar(url, head):
    return TarFormatError(f"not a tar archive (starts with {bytes(head[:24])!r})", url, offset=0)


def bad_checksum(url, offset):
    return TarFormatError("bad tar header checksum: corrupt archive", url, offset=offset)


def bad_number(url, offset, field):
    return TarFormatError(f"bad tar header: invalid {field} field", url, offset=offset)


def bad_pax(url, offset):
    return TarFormatError("bad pax extended header", url, offset=offset)


def unsupported_sparse(url, name, offset):
    return TarFormatError("unsupported tar member type: GNU sparse file", url, name, offset)


def truncated_header(url, offset, got):
    return TarFormatError(
        f"truncated tar archive: stream ended inside a header block ({got} of {BLOCK} bytes)",
        url,
        offset=offset,
    )


def truncated_member(url, name, offset, got, need):
    """``need`` counts the member's data and its padding to a whole block."""
    return TarFormatError(
        f"truncated tar archive: member ended after {got} of {need} bytes (data and padding)",
        url,
        name,
        offset,
    )


def missing_end_marker(url, offset):
    return TarFormatError(
        "truncated tar archive: stream ended at a member boundary "
        "without the end-of-archive marker",
        url,
        offset=offset,
    )
