"""TarHeaders, native and pure-Python: a tar file's members from their headers alone, with the
names, offsets and errors of the splitter that reads the data."""

import io
import os
import tarfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsmp
from wdsmp.native import tarsplit_py as _tarsplit_py
from wdsmp.errors import TarFormatError
from wdsmp.native.core import tar_headers_class, tar_stream_headers_class
from wdsmp.formats.tar import BLOCK

from .conftest import tar_bytes

try:  # compared directly, whatever WDSMP_PUREPYTHON says
    from wdsmp.native import _tarsplit
except ImportError:
    _tarsplit = None

IMPLEMENTATIONS = [_tarsplit_py] + ([_tarsplit] if _tarsplit is not None else [])


def _file(data):
    """An unnamed regular file in memory holding ``data``, opened for reading at its start."""
    file = os.fdopen(os.memfd_create("shard"), "rb+", buffering=0)
    file.write(data)
    file.seek(0)
    return file


def _outcome(members):
    """``("ok", [(name, offset), ...])`` or ``("error", message)`` of iterating ``members``."""
    try:
        return ("ok", [(name, offset) for name, _, offset in members])
    except wdsmp.TarFormatError as exn:
        return ("error", str(exn))


def _agree(data):
    """Every TarHeaders and TarStreamHeaders says what the pure-Python splitter reading the data says."""
    splitter = _outcome(_tarsplit_py.TarSplitter(io.BytesIO(data), "s.tar"))
    for module in IMPLEMENTATIONS:
        with _file(data) as file:
            assert _outcome(module.TarHeaders(file, "s.tar")) == splitter, module.__name__
        stream = module.TarStreamHeaders(io.BufferedReader(io.BytesIO(data), 700), "s.tar", bufsize=2048)
        assert _outcome(stream) == splitter, module.__name__
    return splitter


MEMBERS = [("x/a.txt", b"a" * 600), ("b" * 120 + ".bin", b"\x00\x01"), ("c.cls", b""), ("d.jpg", b"j" * 1500)]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_names_and_offsets_of_every_format(fmt):
    members = MEMBERS if fmt != tarfile.USTAR_FORMAT else [("x/a.txt", b"a" * 600), ("d.jpg", b"j")]
    data = tar_bytes(members, format=fmt)
    outcome = _agree(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert outcome == ("ok", [(m.name, m.offset) for m in tar if m.isreg()])
    with _file(data) as file:
        assert all(data is None for _, data, _ in tar_headers_class()(file, "s.tar"))  # never read
    assert all(got is None for _, got, _ in tar_stream_headers_class()(io.BytesIO(data), "s.tar"))


def test_agree_with_the_splitter_on_every_truncation():
    data = tar_bytes(MEMBERS)
    for cut in range(0, len(data) + 1, 7):
        _agree(data[:cut])


def test_metadata_members_are_skipped_alike_on_every_truncation():
    """GNU volume labels, dump directories and pax global headers: their data skipped by every
    walk as the splitter skips it, and a cut inside it reported alike."""
    def metadata(tar):
        for name, kind, size in (("label", b"V", 700), ("global", b"g", 1100), ("dump", b"D", 300)):
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, size
            tar.addfile(info, io.BytesIO(b"m" * size))
        info = tarfile.TarInfo("after.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"after"))

    data = tar_bytes(MEMBERS[:2], extra=metadata)
    assert _agree(data)[1][-1][0] == "after.txt"
    for cut in range(0, len(data) + 1, 7):
        _agree(data[:cut])


def test_agree_with_the_splitter_on_flipped_bytes():
    data = tar_bytes(MEMBERS[:2], format=tarfile.PAX_FORMAT)
    for pos in range(0, len(data), 5):
        bad = bytearray(data)
        bad[pos] ^= 0x80
        _agree(bytes(bad))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc/._-é", min_size=1, max_size=150), st.binary(max_size=3000)),
                max_size=6),
       st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_agree_with_the_splitter_on_generated_archives(members, fmt):
    members = [(n, d) for n, d in members if not n.endswith("/") and n.strip("/.")]
    assert _agree(tar_bytes(members, format=fmt))[0] == "ok"


@pytest.mark.parametrize("module", IMPLEMENTATIONS, ids=lambda m: m.__name__)
def test_member_data_is_jumped_over_not_read(module, tmp_path):
    """A member of 64 GiB (a sparse file, under a cap raised for it) is passed in the time of a
    few small reads; under the default cap it is refused, as the reader refuses it."""
    size = 64 << 30
    info = tarfile.TarInfo("big.bin")
    info.size = size
    head = info.tobuf(format=tarfile.GNU_FORMAT)
    tail = tar_bytes([("small.cls", b"7")])  # the next member, then the end-of-archive blocks
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as stream:
        stream.write(head)
        stream.seek(len(head) + size)
        stream.write(tail)
    started = time.monotonic()
    with open(path, "rb", buffering=0) as file:
        members = list(module.TarHeaders(file, str(path), max_member_size=size))
    assert [(name, offset) for name, _, offset in members] == [("big.bin", 0), ("small.cls", len(head) + size)]
    assert time.monotonic() - started < 30  # reading the data would take minutes
    with open(path, "rb", buffering=0) as file, pytest.raises(TarFormatError, match="more than the 1073741824 bytes"):
        list(module.TarHeaders(file, str(path)))


def test_a_member_cut_short_is_named(impl, tmp_path):
    data = tar_bytes([("a.jpg", b"a" * 3000), ("b.jpg", b"b" * 3000)])
    path = tmp_path / "cut.tar"
    path.write_bytes(data[:BLOCK + 3072 + BLOCK + 1000])  # inside b.jpg's data
    with open(path, "rb", buffering=0) as file:
        headers = tar_headers_class()(file, "cut.tar")
        assert next(headers)[0] == "a.jpg"
        with pytest.raises(wdsmp.TarFormatError, match="truncated tar archive: member ended after") as info:
            next(headers)
    assert (info.value.url, info.value.member) == ("cut.tar", "b.jpg")


@pytest.mark.parametrize("typeflag", [b"V", b"D", b"g"])
def test_metadata_claiming_gigabytes_is_jumped_over_in_bounded_memory(impl, typeflag, tmp_path):
    """A sparse shard whose GNU volume label (or dump directory, or pax global header) claims
    3 GiB, more than the member cap: the header walk jumps over it as over member data, with
    no cap (metadata is skipped, never held), in a process whose memory could not hold it."""
    from .bombs import run_limited

    size = 3 << 30
    info = tarfile.TarInfo("label")
    info.type, info.size = typeflag, size
    head = info.tobuf(format=tarfile.GNU_FORMAT)
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as stream:
        stream.write(head)
        stream.seek(len(head) + size)
        stream.write(tar_bytes([("k.cls", b"7")]))
    status, out = run_limited(f"""
        from wdsmp.epochs.counts import walk_local_shard
        from wdsmp.native.core import tar_headers_class
        with open({str(path)!r}, "rb", buffering=0) as file:
            print([(name, offset) for name, _, offset in tar_headers_class()(file, "sparse.tar")])
        print(walk_local_shard({str(path)!r}).spans.tolist())
        """, headroom=128 << 20, timeout=60)
    assert status == 0, out
    end = len(head) + size + 2 * BLOCK
    assert out.split("\n")[:2] == [repr([("k.cls", len(head) + size)]), repr([[len(head) + size, end]])], out
