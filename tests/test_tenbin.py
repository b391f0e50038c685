"""Tests of wdsmp.tenbin: round trips, the exact byte layout webdataset reads, and errors."""

import io
import struct

import numpy as np
import pytest

from wdsmp import tenbin

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(dtype):
    a = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    (b,) = tenbin.decode_buffer(tenbin.encode_buffer([a]))
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 0, 2), (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1)])
def test_shapes_round_trip(shape):
    a = np.ones(shape, dtype="float32")
    (b,) = tenbin.decode_buffer(tenbin.encode_buffer([a]))
    assert b.shape == shape


def test_byte_layout_matches_webdataset():
    a = np.array([[1, 2, 3]], dtype="<i2")
    buf = bytes(tenbin.encode_buffer([a], infos=["lbl"]))
    header = b"i2".ljust(8, b"\0") + b"lbl".ljust(8, b"\0") + struct.pack("<qqq", 2, 1, 3)
    data = a.tobytes()
    expected = (b"~TenBin~" + struct.pack("<q", len(header)) + header.ljust(64, b"\0")
                + b"~TenBin~" + struct.pack("<q", len(data)) + data.ljust(64, b"\0"))
    assert buf == expected


def test_several_arrays_non_contiguous_and_big_endian_inputs():
    a = np.arange(12, dtype=">f8").reshape(3, 4)
    b = np.arange(20, dtype="int32").reshape(4, 5)[:, ::2]
    c = [[1, 2], [3, 4]]  # anything np.asarray takes
    out = tenbin.decode_buffer(tenbin.encode_buffer([a, b, c]))
    for x, y in zip([a, b, np.asarray(c)], out):
        np.testing.assert_array_equal(x, y)
    assert out[0].dtype == np.dtype("<f8")


def test_decoded_arrays_are_aligned_views():
    buf = tenbin.encode_buffer([np.zeros(3, "u1"), np.arange(5, dtype="f8")])
    arrays = tenbin.decode_buffer(buf)
    base = np.frombuffer(buf, dtype="u1").ctypes.data
    assert all((a.ctypes.data - base) % 16 == 0 for a in arrays)


def test_infos():
    arrays = [np.zeros(2), np.ones(3)]
    buf = tenbin.encode_buffer(arrays, infos=["a", "bb"])
    out, infos = tenbin.decode_buffer(buf, infos=True)
    assert infos == ["a", "bb"]
    assert len(tenbin.decode_buffer(buf, infos=["a", "bb"])) == 2
    with pytest.raises(ValueError, match="do not match"):
        tenbin.decode_buffer(buf, infos=["a", "x"])
    with pytest.raises(ValueError, match="2 arrays but 1 infos"):
        tenbin.encode_buffer(arrays, infos=["a"])
    with pytest.raises(ValueError, match="longer than 8 bytes"):
        tenbin.encode_buffer(arrays[:1], infos=["muchtoolong"])


def test_stream_write_read_and_partial_read():
    stream = io.BytesIO()
    tenbin.write(stream, [np.arange(3), np.eye(2, dtype="float32")])
    stream.seek(0)
    first = tenbin.read(stream, n=1)
    rest = tenbin.read(stream)
    assert len(first) == 1 and len(rest) == 1
    np.testing.assert_array_equal(rest[0], np.eye(2))
    assert stream.getvalue() == bytes(tenbin.encode_buffer([np.arange(3), np.eye(2, dtype="float32")]))


def test_save_load(tmp_path):
    path = str(tmp_path / "x.ten")
    tenbin.save(path, np.arange(4), np.zeros((2, 2), "u2"), infos=["i", "z"])
    arrays, infos = tenbin.load(path, infos=True)
    assert infos == ["i", "z"] and arrays[1].dtype == np.uint16
    with pytest.raises(ValueError, match="should end in .ten"):
        tenbin.save(str(tmp_path / "x.bin"), np.arange(4))
    tenbin.save(str(tmp_path / "x.bin"), np.arange(4), nocheck=True)
    assert len(tenbin.load(str(tmp_path / "x.bin"), nocheck=True)) == 1


@pytest.mark.parametrize("value", [np.zeros(2, complex), np.zeros(2, bool), np.array(["a"], object)])
def test_unsupported_dtype(value):
    with pytest.raises(ValueError, match="cannot store dtype"):
        tenbin.encode_buffer([value])


def test_encode_buffer_needs_a_list():
    with pytest.raises(ValueError, match="needs a list"):
        tenbin.encode_buffer(np.zeros(2))


def test_corrupt_buffers():
    buf = bytes(tenbin.encode_buffer([np.arange(10)]))
    with pytest.raises(ValueError, match="magic missing"):
        tenbin.decode_buffer(b"X" + buf[1:])
    with pytest.raises(ValueError, match="truncated"):
        tenbin.decode_buffer(buf[:-64])  # the data chunk loses its bytes
    with pytest.raises(ValueError, match="without its data chunk"):
        tenbin.decode_buffer(buf[:80])  # header chunk only
    with pytest.raises(ValueError, match="truncated"):
        tenbin.read(io.BytesIO(buf[:-10]))
    bad_code = buf[:16] + b"zz" + buf[18:]
    with pytest.raises(ValueError, match="unknown dtype code"):
        tenbin.decode_buffer(bad_code)


# -- the helpers webdataset's tenbin exposes


def test_dtype_tables_are_inverse_and_complete():
    assert set(tenbin.long_to_short) == set(DTYPES)  # uint32 included (webdataset misspells it)
    assert tenbin.long_to_short["uint32"] == "u4"
    assert {v: k for k, v in tenbin.long_to_short.items()} == tenbin.short_to_long


def test_magic_constants_match_the_buffer():
    assert tenbin.magic_str == "~TenBin~"
    assert tenbin.magic_bytes == b"~TenBin~"
    assert tenbin.magic == struct.unpack("<q", b"~TenBin~")[0]
    assert bytes(tenbin.encode_buffer([np.zeros(1, "u1")]))[:8] == tenbin.magic_bytes


@pytest.mark.parametrize("text", ["", "a", "f4", "~TenBin~"])
def test_str64_round_trips(text):
    value = tenbin.str64(text)
    assert isinstance(value, int)
    assert tenbin.unstr64(value) == text
    assert tenbin.unstr64(np.int64(value)) == text  # header values come back as numpy ints


def test_str64_refuses_long_strings():
    with pytest.raises(ValueError, match="longer than 8 bytes"):
        tenbin.str64("ninechars")


@pytest.mark.parametrize("n, k, expected", [(0, 64, 0), (1, 64, 64), (64, 64, 64), (65, 64, 128), (9, 8, 16)])
def test_roundup(n, k, expected):
    assert tenbin.roundup(n, k) == expected


def test_bytelen_and_bytedata():
    a = np.arange(6, dtype="int16")
    assert tenbin.bytelen(a) == 12
    assert tenbin.bytelen(b"abc") == 3 and tenbin.bytelen(bytearray(5)) == 5
    assert tenbin.bytelen(memoryview(b"abcd")) == 4
    data = b"xyz"
    assert tenbin.bytedata(data) is data
    assert bytes(tenbin.bytedata(a)) == a.tobytes()
    with pytest.raises(ValueError, match="size in bytes"):
        tenbin.bytelen(3)
    with pytest.raises(ValueError, match="raw data"):
        tenbin.bytedata(3)


def test_check_acceptable_input_type():
    tenbin.check_acceptable_input_type([np.zeros(2, "f4"), np.zeros(2, "u1")], allow64=False)
    tenbin.check_acceptable_input_type([np.zeros(2, "f8"), np.zeros(2, "u8")], allow64=True)
    with pytest.raises(ValueError, match="64-bit dtype int64"):
        tenbin.check_acceptable_input_type([np.zeros(2, "f4"), np.zeros(2, "i8")], allow64=False)
    with pytest.raises(ValueError, match="cannot store dtype bool"):
        tenbin.check_acceptable_input_type([np.zeros(2, bool)], allow64=True)


def test_check_infos():
    data, infos = [np.zeros(1)], ["a", "b"]
    assert tenbin.check_infos(data, infos) is data
    assert tenbin.check_infos(data, infos, False) is data
    assert tenbin.check_infos(data, infos, True) == (data, infos)
    assert tenbin.check_infos(data, infos, ["a"]) is data
    assert tenbin.check_infos(data, infos, ("a", "b")) is data
    with pytest.raises(ValueError, match="do not match"):
        tenbin.check_infos(data, infos, ["b"])
    with pytest.raises(ValueError, match="bool, a list or a tuple"):
        tenbin.check_infos(data, infos, "a")
