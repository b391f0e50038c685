"""Fuzz target: the native tar splitter (src/ext/_tarsplit.pyx) against its pure-Python twin.

Each input is one control byte and a byte stream. The control byte chooses whether
every non-zero 512-byte block gets a valid header checksum first (so that mutations
reach what lies behind the checksum test: sizes, names, type flags, pax records), the
native splitter's buffer size, and the stream both read from (BytesIO, a raw stream
returning a few bytes per readinto, an object with only read, a BufferedReader over
such a raw stream) with its chunk size. Both splitters must yield the same members
and then fail the same way: the same TarFormatError (message, member, offset), the
only error a damaged archive may raise (RELIABILITY.md), and stop for good after it.
Anything else, and any crash or ASan report, is a finding.

``--skip-huge-claims`` skips inputs in which a 512-byte block's size field, or a pax
``size`` record, claims more than 1 MiB (inputs are at most a few KiB, so such a
claim can only be a cut archive). Such a claim makes the splitters allocate up to
``tarformat.UNTRUSTED_CHUNK`` (32 MiB) per read, which is slow under ASan: the flag
trades those inputs for speed. (Before that bound, such a claim ended in MemoryError:
crashes/README.md.)

    tests/fuzz/run.sh tarsplit -max_total_time=600 CORPUS_DIR
    python tests/fuzz/fuzz_tarsplit.py -runs=100000      # the installed wdsmp, Python coverage only
"""

import io
import re
import sys
import tarfile

import fuzzsupport

BLOCK = 512
HUGE = 1 << 20
PAX_SIZE = re.compile(rb"size=([0-9]+)")
BUFSIZES = (2048, 4096, 8192, 1 << 20)
CHUNKS = (1, 3, 100, 511, 512, 513, 4096, 1 << 16)


class RawChunks(io.RawIOBase):
    """A pipe-like raw stream: at most ``n`` bytes per readinto."""

    def __init__(self, data, n):
        self.data, self.pos, self.n = data, 0, n

    def readable(self):
        return True

    def readinto(self, buffer):
        k = min(len(buffer), self.n, len(self.data) - self.pos)
        buffer[:k] = self.data[self.pos:self.pos + k]
        self.pos += k
        return k


class ReadOnly:
    """A stream object with only ``read``, returning at most ``n`` bytes per call."""

    def __init__(self, data, n):
        self.stream, self.n = io.BytesIO(data), n

    def read(self, size=-1):
        return self.stream.read(self.n if size < 0 else min(size, self.n))


STREAMS = (
    lambda data, n: io.BytesIO(data),
    RawChunks,
    ReadOnly,
    lambda data, n: io.BufferedReader(RawChunks(data, n), buffer_size=max(n, 1)),
)


def fix_checksums(data):
    """``data`` with a valid header checksum in every non-zero 512-byte block (tar
    headers always start at a multiple of 512)."""
    out = bytearray(data)
    for at in range(0, len(out) - BLOCK + 1, BLOCK):
        block = out[at:at + BLOCK]
        if any(block):
            block[148:156] = b" " * 8
            out[at + 148:at + 156] = b"%06o\0 " % sum(block)
    return bytes(out)


def claims_huge(data):
    """Whether any 512-byte block's size field, read as the splitters read it, or any pax
    ``size`` record claims more than HUGE bytes."""
    for at in range(0, len(data) - BLOCK + 1, BLOCK):
        field = data[at + 124:at + 136]
        if field[0] & 0x80:
            if field[0] != 0xFF and int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big") > HUGE:
                return True
        else:
            text = field.split(b"\0", 1)[0].strip(b" ")
            if text and all(48 <= c <= 55 for c in text) and int(text, 8) > HUGE:
                return True
    return any(int(m.group(1)) > HUGE for m in PAX_SIZE.finditer(data))


def outcome(cls, data, stream, chunk, bufsize, error_class):
    """The members a splitter yields, then how it ends: None (the end-of-archive marker)
    or its error, as comparable values."""
    members = []
    splitter = cls(STREAMS[stream](data, chunk), "fuzz.tar", bufsize=bufsize)
    try:
        for name, payload, offset in splitter:
            assert type(name) is str and type(payload) is bytes and type(offset) is int, (name, offset)
            members.append((name, payload, offset))
    except Exception as exn:  # compared below: same type, message and location on both sides
        if not isinstance(exn, error_class):
            raise AssertionError(f"{cls.__module__}: {type(exn).__name__} from a damaged archive, "
                                 f"not TarFormatError") from exn
        ending = (type(exn).__name__, str(exn), exn.url, exn.member, exn.offset)
    else:
        ending = None
    try:
        next(splitter)
    except StopIteration:
        pass
    else:
        raise AssertionError(f"{cls.__module__}: yielded a member after the end or an error")
    return members, ending


def main():
    argv = list(sys.argv)
    skip_huge_claims = "--skip-huge-claims" in argv
    if skip_huge_claims:
        argv.remove("--skip-huge-claims")
    (native, twin, errors), coverage = fuzzsupport.load_wdsmp(argv, ["_tarsplit", "_tarsplit_py", "errors"])
    if coverage is not None:
        coverage.add(native)

    def test_one_input(data):
        if not data:
            return
        control, body = data[0], data[1:]
        if control & 1:
            body = fix_checksums(body)
        if skip_huge_claims and claims_huge(body):
            return
        bufsize = BUFSIZES[(control >> 1) & 3]
        stream = (control >> 3) & 3
        chunk = CHUNKS[control >> 5]
        a = outcome(native.TarSplitter, body, stream, chunk, bufsize, errors.TarFormatError)
        b = outcome(twin.TarSplitter, body, stream, chunk, bufsize, errors.TarFormatError)
        if a != b:
            raise AssertionError(f"the native splitter and its twin disagree:\n native: {a!r}\n twin:   {b!r}")

    fuzzsupport.fuzz(argv, test_one_input, seeds(), coverage)


def _tar(members, fmt=tarfile.GNU_FORMAT, extra=None):
    """A tar archive of ``[(name, data)]`` without tarfile's padding to 10240 bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        if extra is not None:
            extra(tar)
    data = buf.getvalue()
    end = -(-len(data.rstrip(b"\0")) // BLOCK) * BLOCK
    return data[:end] + bytes(2 * BLOCK)


def _header(name, size_field, typeflag=b"0"):
    """One raw header block (its checksum is filled in by fix_checksums)."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[124:136] = size_field
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    return bytes(h)


def _pax_record(text):
    length = len(text) + 2
    while len(b"%d %s\n" % (length, text)) != length:
        length += 1
    return b"%d %s\n" % (length, text)


def seeds():
    """Control byte + archive: every format and member kind the splitter handles."""
    def links(tar):
        for kind, name in [(tarfile.DIRTYPE, "dir"), (tarfile.SYMTYPE, "sym"), (tarfile.LNKTYPE, "hard")]:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "a.txt"
            tar.addfile(info)

    end = bytes(2 * BLOCK)
    pax = _pax_record(b"path=pax/renamed.txt") + _pax_record(b"size=3")
    archives = [
        _tar([("a/000.jpg", b"\xff\xd8" + b"x" * 700), ("a/000.cls", b"3"), ("a/001.txt", b"")]),
        _tar([("b/" + "long" * 40 + ".txt", b"long name"), ("k.bin", bytes(range(256)) * 5)]),
        _tar([("b/" + "long" * 40 + ".txt", b"long name")], fmt=tarfile.PAX_FORMAT),
        _tar([("d" * 120 + "/file.txt", b"x")], fmt=tarfile.USTAR_FORMAT),
        _tar([("\u00fcn\u00efcode/\u043a.txt", "text".encode())], fmt=tarfile.PAX_FORMAT),
        _tar([("a.txt", b"a")], extra=links),
        fix_checksums(_header(b"x.txt", b"\x80" + (5).to_bytes(11, "big")) + b"hello".ljust(BLOCK, b"\0") + end),
        fix_checksums(_header(b"PaxHeader", b"%011o\0" % len(pax), b"x") + pax.ljust(BLOCK, b"\0")
                      + _header(b"short.txt", b"%011o\0" % 3) + b"abc".ljust(BLOCK, b"\0") + end),
        fix_checksums(_header(b"sparse", b"%011o\0" % 0, b"S") + end),
        fix_checksums(_header(b"volume", b"%011o\0" % 700, b"V") + bytes(2 * BLOCK)
                      + _header(b"ok.txt", b"%011o\0" % 2) + b"ok".ljust(BLOCK, b"\0") + end),
        fix_checksums(_header(b"dir/", b"%011o\0" % 0) + _header(b"dir/x.txt", b"%011o\0" % 1)
                      + b"x".ljust(BLOCK, b"\0") + end),
        b"<!DOCTYPE html><html><body>403 Forbidden</body></html>",
    ]
    controls = (0x00, 0x01, 0x03 | 2 << 5, 0x09 | 1 << 5, 0x11 | 3 << 5, 0x19 | 4 << 5)
    return [bytes([controls[i % len(controls)]]) + archive for i, archive in enumerate(archives)] + [
        bytes([0x01]) + archives[0][:BLOCK + 300], bytes([0x00]) + archives[1][:5 * BLOCK]]


if __name__ == "__main__":
    main()
