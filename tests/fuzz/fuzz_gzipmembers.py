"""Fuzz target: gzip-compressed shards and ``.gz`` fields, with wdsmp's caps on what they expand to.

Each input is one control byte and a byte stream. The control byte chooses what the stream
is: a tar archive (every header checksum made valid or not) that the target compresses and
cuts at a fraction of its length, as a cut ``.tgz`` download is; or a gzip stream as it
stands (mutations then reach the deflate data, the trailer, concatenated members). Both are
read through ``tariterators.tar_file_iterator`` (gzip recognised by its magic, the splitter
behind it) with the native splitter and with its twin, and with a small member cap
(``max_member_size``). The stream is also decoded as a ``.gz`` field by
``autodecode.gunzip`` under a small cap.

What must hold: both splitters deliver the same members, each within the cap, then end the
same way: the end of the stream, or the same TarFormatError (message, member, offset),
never another error (a cut or corrupt gzip stream is a TarFormatError naming the shard, and
the member it cut); the damage lies past every member delivered. ``gunzip`` returns
what ``gzip.decompress`` returns when that fits the cap, raises DecodeError past the cap,
and otherwise only EOFError or zlib.error, the errors of damaged gzip data; it never
returns more than the cap. Run it with ``-rss_limit_mb``: a cap that does not hold is a
memory blow-up, which libFuzzer reports.

    tests/fuzz/run.sh gzipmembers -max_total_time=600 -rss_limit_mb=2048 CORPUS_DIR
    python tests/fuzz/fuzz_gzipmembers.py -runs=10000      # the installed wdsmp, Python coverage only
"""

import gzip
import io
import os
import sys
import zlib

import fuzzsupport

CAP = 64 << 10
CUTS = (1.0, 0.97, 0.75, 0.5, 0.3, 0.1, 0.02, 0.0)


def outcome(tariterators, errors, data, native):
    """Members (name, data, offset, link) and the ending, as comparable values."""
    os.environ["WDSMP_PUREPYTHON"] = "" if native else "1"
    members = []
    try:
        for member in tariterators.tar_file_iterator(io.BytesIO(data), skip_meta=None, url="fuzz.tgz",
                                                     max_member_size=CAP):
            assert len(member["data"]) <= CAP, (member["fname"], len(member["data"]))
            members.append((member["fname"], member["data"], member["__offset__"], member.get("__link__")))
    except Exception as exn:  # noqa: BLE001 - compared below
        if not isinstance(exn, errors.TarFormatError):
            raise AssertionError(f"{'native' if native else 'twin'}: {type(exn).__name__} from a damaged "
                                 f"gzip shard, not TarFormatError: {exn}") from exn
        if exn.offset is not None and members:  # the damage lies past every member delivered
            assert exn.offset > members[-1][2], ("a damaged member was delivered", exn.offset, members[-1][2])
        return members, (str(exn), exn.member, exn.offset)
    return members, None


def check_gunzip(autodecode, errors, data):
    try:
        got = autodecode.gunzip(data, CAP)
    except errors.DecodeError:
        return
    except (EOFError, zlib.error):
        return
    assert len(got) <= CAP
    try:
        expected = gzip.decompress(data)
    except (EOFError, OSError, zlib.error):  # gzip.decompress is stricter on headers and trailers
        return
    assert got == expected, (len(got), len(expected))


def main():
    argv = list(sys.argv)
    (native, tariterators, errors, autodecode), coverage = fuzzsupport.load_wdsmp(
        argv, ["_tarsplit", "tariterators", "errors", "autodecode"])
    if coverage is not None:
        coverage.add(native)
    import fuzz_tarsplit

    def test_one_input(data):
        if not data:
            return
        control, body = data[0], data[1:]
        if control & 1:
            archive = fuzz_tarsplit.fix_checksums(body) if control & 2 else body
            packed = gzip.compress(archive, compresslevel=1, mtime=0)
            stream = packed[:int(len(packed) * CUTS[(control >> 2) & 7])]
        else:
            stream = body
        a = outcome(tariterators, errors, stream, native=True)
        b = outcome(tariterators, errors, stream, native=False)
        if a != b:
            raise AssertionError(f"the native splitter and its twin disagree on a gzip shard:\n native: {a!r}\n"
                                 f" twin:   {b!r}")
        check_gunzip(autodecode, errors, stream)

    fuzzsupport.fuzz(argv, test_one_input, seeds(fuzz_tarsplit), coverage)


def seeds(fuzz_tarsplit):
    """Tar seeds to be compressed (odd control bytes), the same compressed as they stand, and
    gzip streams that expand past the cap or hold several members."""
    import tarfile

    tars = [seed[1:] for seed in fuzz_tarsplit.seeds()]
    big = io.BytesIO()
    with tarfile.open(fileobj=big, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, size in (("a.txt", 10), ("bomb.bin", 4 * CAP), ("z.txt", 5)):
            info = tarfile.TarInfo(name)
            info.size = size
            archive.addfile(info, io.BytesIO(bytes(size)))
    tars.append(big.getvalue())
    out = [bytes([1 | 2 | (i % 8) << 2]) + tar for i, tar in enumerate(tars)]
    out += [b"\0" + gzip.compress(tar, mtime=0) for tar in tars[:6]]
    out += [b"\0" + gzip.compress(b"one", mtime=0) + b"\0\0" + gzip.compress(b"two", mtime=0),
            b"\0" + gzip.compress(bytes(8 * CAP), mtime=0)]
    return out


if __name__ == "__main__":
    main()
