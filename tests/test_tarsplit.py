"""The tar splitter, native and pure-Python: formats, streams, and every kind of damage."""

import io
import os
import tarfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsmp
from wdsmp.native import tarsplit_py as _tarsplit_py
from wdsmp.native.core import tar_splitter_class
from wdsmp.formats.tar import BLOCK

from .conftest import tar_bytes


def split(data, url="shard.tar", **kw):
    return list(tar_splitter_class()(io.BytesIO(data), url, **kw))


def expected(data):
    """What Python's tarfile sees: (name, data, offset) of each regular file."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, tar.extractfile(m).read(), m.offset) for m in tar if m.isreg()]


def header(name, size, typeflag=b"0", size_field=None, magic=b"ustar\x0000"):
    """One raw tar header block with a correct checksum."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = typeflag
    h[257:265] = magic
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member(name, data, **kw):
    pad = -len(data) % BLOCK
    return header(name, len(data), **kw) + data + b"\0" * pad


END = b"\0" * (2 * BLOCK)


def pax_record(text):
    """``"LEN text\\n"`` where LEN counts the whole record, itself included."""
    length = len(text) + 2
    while len(b"%d %s\n" % (length, text)) != length:
        length += 1
    return b"%d %s\n" % (length, text)

MEMBERS = [
    ("a/000.jpg", b"\xff\xd8" + b"x" * 1000),
    ("a/000.cls", b"3"),
    ("a/001.txt", b""),
    ("a/001.json", b"{}" * 256),  # exactly one block
    ("b/" + "long" * 40 + ".txt", b"long name"),  # needs a GNU long name or pax path
    ("ünïcode/ключ.txt", "text".encode()),
    ("big.bin", bytes(range(256)) * 6000),  # 1.5 MB: larger than half the buffer
]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_matches_tarfile(impl, fmt):
    data = tar_bytes(MEMBERS, format=fmt)
    assert split(data) == expected(data)
    assert [(n, d) for n, d, _ in split(data)] == MEMBERS


def test_ustar_prefix_field(impl):
    name = "d" * 120 + "/file.txt"  # ustar splits this into prefix and name
    data = tar_bytes([(name, b"x")], format=tarfile.USTAR_FORMAT)
    assert split(data) == expected(data)
    assert split(data)[0][0] == name


@pytest.mark.parametrize("bufsize", [2048, 4096, 1 << 16])
def test_small_buffers(impl, bufsize):
    data = tar_bytes(MEMBERS)
    assert split(data, bufsize=bufsize) == expected(data)


@pytest.mark.parametrize("bufsize", [2048, 4096, 8192])
def test_members_straddling_the_buffer(impl, bufsize):
    # Sizes around the switch between copying from the buffer and reading straight
    # into the result, at several places in the buffer, each followed by a member
    # that is already sitting in the buffer.
    sizes = [bufsize // 2 - 1, bufsize // 2, bufsize // 2 + 1, bufsize // 2 + 76, bufsize - 600,
             bufsize - 512, bufsize + 1, 3 * bufsize + 7]
    for size in sizes:
        for lead in range(4):
            members = [(f"lead{i}.txt", b"x") for i in range(lead)]
            members += [("big.bin", bytes(range(256)) * (size // 256) + b"z" * (size % 256)),
                        ("after.txt", b"after")]
            data = tar_bytes(members)
            assert split(data, bufsize=bufsize) == expected(data), (size, lead)


def test_bad_bufsize(impl):
    with pytest.raises(ValueError, match="bufsize"):
        split(tar_bytes(MEMBERS), bufsize=1000)


def _with(*entries, members=MEMBERS[:2]):
    """MEMBERS plus ``(type, name, linkname)`` entries of no data, as tarfile writes them."""
    def extra(tar):
        for kind, name, linkname in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = linkname
            tar.addfile(info)
    return tar_bytes(members, extra=extra)


def test_directories_are_skipped_and_links_come_with_their_members_data(impl):
    long_name = "d/" + "x" * 120 + ".jpg"  # a GNU long-name header first: the member starts there
    data = _with((tarfile.DIRTYPE, "dir", ""), (tarfile.SYMTYPE, "a/000.txt", "000.cls"),
                 (tarfile.LNKTYPE, "b/000.jpg", "a/000.jpg"), (tarfile.SYMTYPE, "c/x.cls", "../a/000.cls"),
                 (tarfile.LNKTYPE, long_name, "a/000.jpg"))
    splitter = tar_splitter_class()(io.BytesIO(data), "shard.tar")
    members = list(splitter)
    assert [(name, payload) for name, payload, _ in members] == [
        ("a/000.jpg", MEMBERS[0][1]), ("a/000.cls", b"3"), ("a/000.txt", b"3"), ("b/000.jpg", MEMBERS[0][1]),
        ("c/x.cls", b"3"), (long_name, MEMBERS[0][1])]
    assert [(name, target) for name, target, _ in splitter.links] == [
        ("a/000.txt", "000.cls"), ("b/000.jpg", "a/000.jpg"), ("c/x.cls", "../a/000.cls"), (long_name, "a/000.jpg")]
    assert [offset for _, _, offset in splitter.links] == [offset for _, _, offset in members[2:]]
    assert [offset for _, _, offset in members] == [m[2] for m in expected(data)] + [  # tarfile's offsets
        info.offset for info in tarfile.open(fileobj=io.BytesIO(data)) if info.islnk() or info.issym()]


@pytest.mark.parametrize("kind, name, target, match", [
    (tarfile.FIFOTYPE, "fifo", "", r"member type '6' \(FIFO\)"),
    (tarfile.CHRTYPE, "tty", "", r"member type '3' \(character device\)"),
    (b"M", "cont", "", r"member type 'M' \(an unknown type\)"),
    (tarfile.LNKTYPE, "b.jpg", "missing.jpg",
     r"hard link to 'missing.jpg', a member not among the last 64 members and 16 MiB"),
    (tarfile.SYMTYPE, "b.jpg", "/etc/passwd", r"symbolic link to '/etc/passwd', outside the archive"),
    (tarfile.SYMTYPE, "b.jpg", "../up.jpg", r"symbolic link to '../up.jpg', outside the archive"),
])
def test_members_without_data_of_their_own_are_errors_naming_them(impl, kind, name, target, match):
    data = _with((kind, name, target))
    with pytest.raises(wdsmp.TarFormatError, match=match + rf".*shard 'shard.tar', member '{name}', offset 2560"):
        split(data)


def test_a_hard_link_further_back_than_the_window_is_an_error(impl):
    from wdsmp.formats.tar import LINK_WINDOW

    filler = [(f"f{i}.bin", bytes(1 << 20)) for i in range(LINK_WINDOW // (1 << 20) + 1)]
    data = _with((tarfile.LNKTYPE, "near.bin", filler[-1][0]), members=[("far.bin", b"far")] + filler)
    assert split(data)[-1][:2] == ("near.bin", bytes(1 << 20))
    data = _with((tarfile.LNKTYPE, "b.bin", "far.bin"), members=[("far.bin", b"far")] + filler)
    with pytest.raises(wdsmp.TarFormatError, match="hard link to 'far.bin'.*tar --hard-dereference"):
        split(data)
    from wdsmp.formats.tar import LINK_MEMBERS

    small = [(f"s{i}.txt", b"%d" % i) for i in range(LINK_MEMBERS)]
    assert split(_with((tarfile.LNKTYPE, "l.txt", "s0.txt"), members=small))[-1][:2] == ("l.txt", b"0")
    with pytest.raises(wdsmp.TarFormatError, match="hard link to 's0.txt', a member not among the last 64 members"):
        split(_with((tarfile.LNKTYPE, "l.txt", "s0.txt"), members=small + [("x.txt", b"x")]))


def test_gnu_tar_hard_links_come_whole(impl, tmp_path):
    """What the tar command writes for files that are hard links of each other."""
    import shutil
    import subprocess

    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.jpg").write_bytes(b"J" * 5000)
    (tree / "a.cls").write_bytes(b"1")
    os.link(tree / "a.jpg", tree / "b.jpg")
    (tree / "b.cls").write_bytes(b"2")
    subprocess.run(["tar", "cf", str(tmp_path / "s.tar"), "-C", str(tree), "a.cls", "a.jpg", "b.cls", "b.jpg"],
                   check=True)
    with tarfile.open(tmp_path / "s.tar") as archive:
        assert [m.type for m in archive][-1] == tarfile.LNKTYPE  # GNU tar stored b.jpg as a link
    got = {name: payload for name, payload, _ in split((tmp_path / "s.tar").read_bytes())}
    assert got == {"a.cls": b"1", "a.jpg": b"J" * 5000, "b.cls": b"2", "b.jpg": b"J" * 5000}


def test_a_member_over_the_size_cap_is_refused_before_it_is_read(impl, monkeypatch):
    data = tar_bytes([("a.txt", b"a"), ("b.bin", b"x" * 5000)])
    with pytest.raises(wdsmp.TarFormatError, match=r"member of 5000 bytes, more than the 4096 bytes one member "
                                                   r"may hold.*member 'b.bin', offset 1024"):
        split(data, max_member_size=4096)
    monkeypatch.setenv("WDSMP_MAX_MEMBER_SIZE", "4096")
    with pytest.raises(wdsmp.TarFormatError, match="more than the 4096 bytes"):
        split(data)
    assert len(split(data, max_member_size=5000)) == 2
    with pytest.raises(ValueError, match="max_member_size must be a positive"):
        split(data, max_member_size=0)


def test_old_style_directory_entry_is_skipped(impl):
    data = member(b"dir/", b"") + member(b"dir/x.txt", b"x") + END
    assert [n for n, _, _ in split(data)] == ["dir/x.txt"]


def test_base256_size(impl):
    size_field = b"\x80" + (5).to_bytes(11, "big")
    data = header(b"x.txt", 0, size_field=size_field) + b"hello".ljust(BLOCK, b"\0") + END
    assert split(data) == [("x.txt", b"hello", 0)]


def test_pax_path_and_size(impl):
    records = pax_record(b"path=pax/renamed.txt") + pax_record(b"size=3")
    data = member(b"PaxHeader", records, typeflag=b"x") + member(b"short.txt", b"abc") + END
    assert split(data) == expected(data)
    assert split(data)[0][:2] == ("pax/renamed.txt", b"abc")


def test_gnu_sparse_is_refused(impl):
    data = member(b"sparse", b"", typeflag=b"S") + END
    with pytest.raises(wdsmp.TarFormatError, match="sparse.*shard 'shard.tar'.*offset 0"):
        split(data)


def test_volume_labels_are_skipped_with_their_data(impl):
    data = member(b"volume", b"v" * 700, typeflag=b"V") + member(b"ok.txt", b"ok") + END
    assert split(data) == [("ok.txt", b"ok", 1536)]


def test_single_zero_block_ends_archive(impl):
    data = member(b"a.txt", b"a") + b"\0" * BLOCK
    assert split(data) == [("a.txt", b"a", 0)]


def test_an_archive_of_only_the_end_marker_has_no_members(impl):
    assert split(END) == []
    assert split(tar_bytes([])) == []  # as tarfile writes it: the marker padded to a 10240-byte record
    assert split(END, bufsize=2048) == []
    assert list(tar_splitter_class()(Trickle(tar_bytes([]), 100), "t")) == []

def test_garbage_after_end_marker_is_ignored(impl):
    data = member(b"a.txt", b"a") + END + b"trailing junk"
    assert split(data) == [("a.txt", b"a", 0)]


class Trickle(io.RawIOBase):
    """A pipe-like stream: at most ``n`` bytes per read, optionally without readinto."""

    def __init__(self, data, n):
        self.data, self.pos, self.n = data, 0, n

    def readable(self):
        return True

    def readinto(self, b):
        k = min(len(b), self.n, len(self.data) - self.pos)
        b[:k] = self.data[self.pos:self.pos + k]
        self.pos += k
        return k


class ReadOnly:
    """A stream object with only ``read``."""

    def __init__(self, data):
        self.stream = io.BytesIO(data)

    def read(self, n=-1):
        return self.stream.read(min(n, 777))


def test_trickling_streams(impl):
    data = tar_bytes(MEMBERS)
    cls = tar_splitter_class()
    assert list(cls(Trickle(data, 1000), "t")) == expected(data)
    assert list(cls(ReadOnly(data), "t", bufsize=4096)) == expected(data)


# Damage: each kind is a TarFormatError that names the shard and the byte offset.

GOOD = tar_bytes([("s1.txt", b"a" * 700), ("s1.cls", b"1"), ("s2.txt", b"b" * 10)])
SECOND = 2 * BLOCK  # offset of the second member's header


def test_empty_file(impl):
    with pytest.raises(wdsmp.TarFormatError, match=r"empty file \(0 bytes\).*shard 'shard.tar', offset 0"):
        split(b"")


def test_not_a_tar(impl):
    html = b"<!DOCTYPE html><html><body>403 Forbidden</body></html>" * 20
    with pytest.raises(wdsmp.TarFormatError, match=r"not a tar archive \(starts with b'<!DOCTYPE.*offset 0"):
        split(html)
    with pytest.raises(wdsmp.TarFormatError, match="not a tar archive"):
        split(b"short")


def test_truncated_mid_member(impl):
    with pytest.raises(wdsmp.TarFormatError,
                       match=r"member ended after 300 of 1024 bytes.*member 's1.txt', offset 0"):
        split(GOOD[:BLOCK + 300])


def test_truncated_in_padding(impl):
    with pytest.raises(wdsmp.TarFormatError, match=r"after 800 of 1024 bytes.*'s1.txt'"):
        split(GOOD[:BLOCK + 800])


def test_truncated_at_member_boundary(impl):
    # webdataset silently ends the shard here; wdsmp says the archive is cut.
    end = len(GOOD) - GOOD.rstrip(b"\0").__len__()
    cut = GOOD[: 5 * BLOCK]  # after s1.cls and its padding: a header boundary
    assert end > 0
    with pytest.raises(wdsmp.TarFormatError,
                       match=f"without the end-of-archive marker.*offset {5 * BLOCK}"):
        split(cut)


def test_truncated_header(impl):
    with pytest.raises(wdsmp.TarFormatError, match=f"inside a header block.*offset {3 * BLOCK}"):
        split(GOOD[: 3 * BLOCK + 100])


def test_bad_checksum(impl):
    bad = bytearray(GOOD)
    bad[3 * BLOCK + 10] ^= 0x55  # a byte of the second header's name
    with pytest.raises(wdsmp.TarFormatError, match=f"bad tar header checksum.*offset {3 * BLOCK}"):
        split(bytes(bad))


def test_bad_size_field(impl):
    data = header(b"a.txt", 0, size_field=b"12x45\0      ") + END
    with pytest.raises(wdsmp.TarFormatError, match="invalid size field.*offset 0"):
        split(data)


def test_bad_pax_header(impl):
    data = member(b"PaxHeader", b"99 path=x\n", typeflag=b"x") + member(b"a.txt", b"a") + END
    with pytest.raises(wdsmp.TarFormatError, match="bad pax extended header.*offset 0"):
        split(data)


def test_errors_pickle_with_their_location():
    import pickle

    exn = pickle.loads(pickle.dumps(wdsmp.TarFormatError("x", "u.tar", "m.jpg", 512)))
    assert (exn.url, exn.member, exn.offset) == ("u.tar", "m.jpg", 512)
    assert isinstance(exn, ValueError)


# The native core and its twin agree on everything, good or bad.


def outcome(cls, data, bufsize=2048):
    try:
        return ("ok", list(cls(io.BytesIO(data), "fuzz.tar", bufsize=bufsize)))
    except wdsmp.TarFormatError as exn:
        return ("error", str(exn))


try:  # compared directly, whatever WDSMP_PUREPYTHON says
    from wdsmp.native import _tarsplit
except ImportError:
    _tarsplit = None

needs_native = pytest.mark.skipif(_tarsplit is None, reason="native core not built")


def both(data, bufsize=2048):
    return (outcome(_tarsplit.TarSplitter, data, bufsize),
            outcome(_tarsplit_py.TarSplitter, data, bufsize))


@needs_native
def test_agree_on_every_truncation():
    data = tar_bytes([("x/a.txt", b"a" * 600), ("b" * 120 + ".bin", b"\x00\x01"), ("c.cls", b"")])
    for cut in range(len(data) + 1):
        native, twin = both(data[:cut])
        assert native == twin, cut


@needs_native
def test_agree_on_flipped_bytes():
    data = tar_bytes([("x/a.txt", b"a" * 600), ("b" * 120 + ".bin", b"\x00\x01")],
                     format=tarfile.PAX_FORMAT)
    for pos in range(0, len(data), 3):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[pos] ^= mask
            native, twin = both(bytes(bad))
            assert native == twin, (pos, mask)


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4 * BLOCK))
def test_agree_on_arbitrary_bytes(data):
    native, twin = both(data)
    assert native == twin


@needs_native
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet="abc/._-é", min_size=1, max_size=150),
                          st.binary(max_size=5000)), max_size=6),
       st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
       st.sampled_from([2048, 4096]))
def test_agree_on_generated_archives(members, fmt, bufsize):
    members = [(n, d) for n, d in members if not n.endswith("/") and n.strip("/.")]
    data = tar_bytes(members, format=fmt)
    native, twin = both(data, bufsize)
    assert native == twin == ("ok", expected(data))


def test_pax_size_out_of_range(impl):
    data = (member(b"PaxHeader", pax_record(b"size=9223372036854775807"), typeflag=b"x")
            + member(b"vol", b"", typeflag=b"V") + END)
    with pytest.raises(wdsmp.TarFormatError, match="bad pax extended header.*offset 0"):
        split(data)


def test_no_member_named_when_an_extension_header_is_cut(impl):
    data = tar_bytes([("k" * 150 + ".txt", b"x")])  # a GNU long-name header first
    with pytest.raises(wdsmp.TarFormatError, match="offset 0") as info:
        split(data[:BLOCK + 50])
    assert info.value.member is None


def test_stopped_for_good_after_an_error(impl):
    splitter = tar_splitter_class()(io.BytesIO(GOOD[:BLOCK + 300]), "cut.tar")
    with pytest.raises(wdsmp.TarFormatError):
        next(splitter)
    with pytest.raises(StopIteration):
        next(splitter)


class OddStream:
    """A stream whose reads return odd things: None, memoryviews, bad counts."""

    def __init__(self, data, readinto_result=None):
        self.stream = io.BytesIO(data)
        self.first = True
        if readinto_result is not None:
            self.readinto = lambda b: readinto_result

    def read(self, n):
        if self.first:
            self.first = False
            return None  # "no data": read as end of stream
        return memoryview(self.stream.read(min(n, 100)))


def test_read_returning_none_and_memoryviews(impl):
    data = tar_bytes([("a.txt", b"a")])
    with pytest.raises(wdsmp.TarFormatError, match="empty file"):
        list(tar_splitter_class()(OddStream(data), "odd"))
    stream = OddStream(data)
    stream.first = False
    assert list(tar_splitter_class()(stream, "odd")) == [("a.txt", b"a", 0)]


@pytest.mark.parametrize("result", [-100000, 1 << 40])
def test_readinto_out_of_range_is_refused(result):
    if _tarsplit is None:
        pytest.skip("native core not built")
    with pytest.raises(OSError, match="outside"):
        list(_tarsplit.TarSplitter(OddStream(b"", readinto_result=result), "odd"))


# Found by tests/fuzz/fuzz_tarsplit.py (tests/fuzz/crashes/tarsplit-huge-size-claim): a header
# may claim up to MAX_MEMBER_SIZE bytes; allocating that before the data arrives turned a
# damaged 512-byte header into a MemoryError instead of a TarFormatError.


def test_a_claimed_size_is_not_allocated_before_the_data_arrives(impl):
    data = header(b"x.txt", 0, size_field=b"%011o\0" % (1 << 30)) + b"hello".ljust(BLOCK, b"\0") + END
    tracemalloc.start()
    try:
        with pytest.raises(wdsmp.TarFormatError, match=r"member ended after 1536 of 1073741824 bytes.*'x.txt'"):
            list(tar_splitter_class()(io.BufferedReader(io.BytesIO(data)), "shard.tar"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak} bytes allocated to split a {len(data)}-byte archive"


def test_a_member_larger_than_the_untrusted_chunk_comes_whole(impl):
    """Read in chunks and joined: every byte in place, and the member after it intact."""
    from wdsmp.formats.tar import UNTRUSTED_CHUNK

    big = bytes(range(256)) * ((UNTRUSTED_CHUNK + 3 * BLOCK + 77) // 256)
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in (("big.bin", big), ("after.txt", b"after")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    stream.seek(0)
    members = list(tar_splitter_class()(io.BufferedReader(stream), "big.tar"))
    assert [(name, len(data)) for name, data, _ in members] == [("big.bin", len(big)), ("after.txt", 5)]
    assert members[0][1] == big and members[1][1] == b"after"


@pytest.mark.parametrize("typeflag", [b"V", b"D", b"g"])
def test_metadata_claiming_more_than_memory_holds_is_skipped_in_bounded_memory(impl, typeflag, tmp_path):
    """A .tar.gz of a few hundred KB whose GNU volume label (or dump directory, or pax global
    header) holds 192 MiB of zeros, more than the member cap: metadata, skipped by both
    splitters as the data goes by, in a process whose memory could not hold it."""
    from .bombs import gzip_of_zeros, run_limited

    size = 12 << 24
    path = tmp_path / "label.tar.gz"
    path.write_bytes(gzip_of_zeros(header(b"label", size, typeflag=typeflag), size,
                                   member(b"ok.txt", b"ok") + END, crc=True))
    assert path.stat().st_size < 1 << 20
    status, out = run_limited(f"""
        import os
        os.environ["WDSMP_MAX_MEMBER_SIZE"] = str(64 << 20)
        from wdsmp.tariterators import tar_file_iterator
        with open({str(path)!r}, "rb") as stream:
            print([(m["fname"], m["data"], m["__offset__"]) for m in tar_file_iterator(stream, url="label.tar.gz")])
        """, headroom=128 << 20, timeout=60)
    assert status == 0, out
    assert out.strip() == repr([("ok.txt", b"ok", BLOCK + size)]), out
