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
from wdsmp.native.core import tar_headers_class
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
    """Every TarHeaders says what the pure-Python splitter reading the data says."""
    splitter = _outcome(_tarsplit_py.TarSplitter(io.BytesIO(data), "s.tar"))
    for module in IMPLEMENTATIONS:
        with _file(data) as file:
            assert _outcome(module.TarHeaders(file, "s.tar")) == splitter, module.__name__
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


def test_agree_with_the_splitter_on_every_truncation():
    data = tar_bytes(MEMBERS)
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
