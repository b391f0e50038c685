"""Tests of wdsmp.writer (and the encoders it re-exports): real archives in tmp_path, decoded by hand."""

import bz2
import gzip
import io
import lzma
import json
import pickle
import shutil
import subprocess
import sys
import tarfile
import textwrap

import cbor2
import msgpack
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from wdsmp import tenbin
from wdsmp.writer import (
    ShardWriter,
    TarWriter,
    add_handlers,
    bytestr,
    cbor_dumps,
    default_handlers,
    encode_based_on_extension1,
    imageencoder,
    make_encoder,
    make_handlers,
    mp_dumps,
    numpy_dumps,
    numpy_npz_dumps,
    tenbin_dumps,
)

TAR = shutil.which("tar")


def read_members(source):
    """{member name: bytes} of a tar file (path or bytes), in archive order."""
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
        archive = tarfile.open(fileobj=source)
    else:
        archive = tarfile.open(source)
    with archive:
        return {m.name: archive.extractfile(m).read() for m in archive}


def gradient(h=48, w=64):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x / (w - 1), y / (h - 1), (x + y) / (h + w - 2)], axis=-1)


def npload(data):
    return np.load(io.BytesIO(data))


# Encoders, one by one.

ARRAY = np.arange(12, dtype="float32").reshape(3, 4)
ROUND_TRIPS = [
    ("cls", 7, lambda b: int(b)),
    ("cls2", 3, lambda b: int(b)),
    ("index", 12, lambda b: int(b)),
    ("inx", 0, lambda b: int(b)),
    ("id", 42, lambda b: int(b)),
    ("txt", "héllo", lambda b: b.decode("utf-8")),
    ("text", "t", lambda b: b.decode("utf-8")),
    ("transcript", "words", lambda b: b.decode("utf-8")),
    ("json", {"a": [1, 2], "b": "ü"}, lambda b: json.loads(b)),
    ("jsn", [1, None], lambda b: json.loads(b)),
    ("msgpack", {"a": b"\x00", "b": 1.5}, lambda b: msgpack.unpackb(b)),
    ("mp", [1, "x"], lambda b: msgpack.unpackb(b)),
    ("cbor", {"a": [1, 2], "b": b"raw"}, lambda b: cbor2.loads(b)),
    ("pyd", {"set": {1, 2}}, pickle.loads),
    ("pickle", (1, "two"), pickle.loads),
    ("bin", b"\x00\x01raw", lambda b: b),
    ("weird", "a str for an unknown extension", lambda b: b.decode("utf-8")),
]


@pytest.mark.parametrize("field,value,decode", ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_simple_encoders_round_trip(tmp_path, field, value, decode):
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({"__key__": "s0", field: value})
    assert decode(read_members(path)[f"s0.{field}"]) == value


def test_array_encoders_round_trip(tmp_path):
    import torch

    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({
            "__key__": "s0",
            "npy": ARRAY,
            "npz": {"a": ARRAY, "b": np.arange(3)},
            "one.npz": ARRAY,
            "ten": ARRAY,
            "two.ten": [ARRAY, np.arange(5, dtype="uint8")],
            "pth": torch.arange(6).reshape(2, 3),
        })
    members = read_members(path)
    np.testing.assert_array_equal(npload(members["s0.npy"]), ARRAY)
    npz = npload(members["s0.npz"])
    np.testing.assert_array_equal(npz["a"], ARRAY)
    np.testing.assert_array_equal(npz["b"], np.arange(3))
    np.testing.assert_array_equal(npload(members["s0.one.npz"])["arr_0"], ARRAY)
    (ten,) = tenbin.decode_buffer(members["s0.ten"])
    np.testing.assert_array_equal(ten, ARRAY)
    two = tenbin.decode_buffer(members["s0.two.ten"])
    np.testing.assert_array_equal(two[1], np.arange(5))
    loaded = torch.load(io.BytesIO(members["s0.pth"]))
    assert torch.equal(loaded, torch.arange(6).reshape(2, 3))


def test_npy_refuses_object_arrays():
    sample = {"__key__": "k", "x.npy": np.array([{}, None], dtype=object)}
    with pytest.raises(ValueError, match="sample 'k', field 'x.npy'"):
        make_encoder(True)(sample)


@pytest.mark.parametrize("field", ["jpg", "input.JPEG", "img"])
@pytest.mark.parametrize("kind", ["float", "uint8", "gray", "gray1", "pil"])
def test_jpeg_encoding(tmp_path, field, kind):
    image = gradient()
    expected = (image * 255).round().astype(np.uint8)
    if kind == "float":
        value = image.astype("float32")
    elif kind == "uint8":
        value = expected
    elif kind in ("gray", "gray1"):
        expected = expected[:, :, 0]
        value = expected if kind == "gray" else expected[:, :, None]
    else:
        value = Image.fromarray(expected)
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({"__key__": "k", field: value})
    data = read_members(path)[f"k.{field}"]
    assert data[:2] == b"\xff\xd8"
    decoded = np.asarray(Image.open(io.BytesIO(data)))
    assert decoded.shape == expected.shape
    assert np.abs(decoded.astype(float) - expected).mean() < 2.0
    if kind != "gray1":
        colorspace = "GRAY" if expected.ndim == 2 else "RGB"
        assert simplejpeg.decode_jpeg(data, colorspace=colorspace).shape[:2] == expected.shape[:2]


@pytest.mark.parametrize("field,mode", [("png", None), ("ppm", "RGB"), ("pgm", "L"), ("pbm", "1"), ("tif", None)])
def test_lossless_image_encoders(tmp_path, field, mode):
    rgb = (gradient() * 255).round().astype(np.uint8)
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({"__key__": "a", field: rgb, f"pil.{field}": Image.fromarray(rgb)})
    members = read_members(path)
    for name in (f"a.{field}", f"a.pil.{field}"):
        decoded = Image.open(io.BytesIO(members[name]))
        if mode is None:
            np.testing.assert_array_equal(np.asarray(decoded), rgb)
        else:
            assert decoded.mode == mode and decoded.size == (rgb.shape[1], rgb.shape[0])


def test_png_from_float_and_gray(tmp_path):
    image = gradient()
    data = imageencoder(image, "png")
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), (image * 255 + 0.5).astype(np.uint8))
    gray = imageencoder(np.full((4, 5, 1), 9, np.uint8))
    assert np.asarray(Image.open(io.BytesIO(gray))).shape == (4, 5)


@pytest.mark.parametrize("value,match", [
    (np.full((4, 4, 3), 2.0), r"must lie in \[0, 1\]"),
    (np.zeros((4, 4, 2), np.uint8), "HxW, HxWx1"),
    (np.zeros(4, np.uint8), "HxW, HxWx1"),
])
def test_bad_image_arrays(value, match):
    with pytest.raises(ValueError, match=match):
        imageencoder(value, "PNG")
    with pytest.raises(ValueError, match="field 'x.jpg'"):
        make_encoder(True)({"__key__": "k", "x.jpg": value})


def test_gz_fields(tmp_path):
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({
            "__key__": "k",
            "data.json.gz": {"a": 1},
            "txt.gz": "text",
            "arr.npy.gz": ARRAY,
            "raw.bin.gz": b"raw bytes",
        })
    members = read_members(path)
    assert json.loads(gzip.decompress(members["k.data.json.gz"])) == {"a": 1}
    assert gzip.decompress(members["k.txt.gz"]) == b"text"
    np.testing.assert_array_equal(npload(gzip.decompress(members["k.arr.npy.gz"])), ARRAY)
    assert gzip.decompress(members["k.raw.bin.gz"]) == b"raw bytes"  # bytes are compressed too, as in webdataset
    assert members["k.data.json.gz"][4:8] == b"\0\0\0\0"  # gzip mtime


def test_unknown_extension_with_non_bytes_names_key_and_field():
    with pytest.raises(ValueError, match=r"sample 'k', field 'x.xyz'.*no encoder for extension 'xyz'"):
        make_encoder(True)({"__key__": "k", "x.xyz": 3})


def test_str_and_bytes_pass_through_any_extension():
    assert encode_based_on_extension1(b"x", "a.json", default_handlers) == b"x"
    assert encode_based_on_extension1('{"a":1}', "json", default_handlers) == b'{"a":1}'


# Archives.


def sample(i):
    return {
        "__key__": f"sample{i:04d}",
        "png": np.full((8, 8, 3), i % 256, np.uint8),
        "jpg": gradient(16, 16),
        "cls": i,
        "json": {"i": i},
        "npz": {"a": np.arange(i + 1)},
        "meta.json.gz": {"i": i},
    }


@pytest.mark.parametrize("name", ["x.tar", "x.tgz", "x.tar.gz"])
def test_same_samples_give_identical_bytes(tmp_path, name):
    outputs = []
    for run in range(2):
        path = tmp_path / f"{run}{name}"
        with TarWriter(str(path)) as sink:
            for i in range(5):
                sink.write(sample(i))
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]
    assert (outputs[0][:2] == b"\x1f\x8b") == name.endswith("gz")


@pytest.mark.parametrize("name,compress,opener", [
    ("x.tar.bz2", None, bz2.open), ("x.tar.xz", None, lzma.open), ("x.tar", "xz", lzma.open), ("x.tgz", False, open),
])
def test_other_compressions(tmp_path, name, compress, opener):
    path = str(tmp_path / name)
    with TarWriter(path, compress=compress) as sink:
        sink.write({"__key__": "k", "txt": "x"})
    with opener(path, "rb") as stream:
        assert read_members(stream.read()) == {"k.txt": b"x"}
    with pytest.raises(ValueError, match="compress must be"):
        TarWriter(path, compress="zip")


def test_header_fields_are_fixed(tmp_path):
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write(sample(1))
    with tarfile.open(path) as archive:
        for info in archive:
            assert (info.mtime, info.uid, info.gid, info.mode) == (0, 0, 0, 0o444)
            assert (info.uname, info.gname) == ("bigdata", "bigdata")
    with TarWriter(path, mtime=1234567890, user="u", group="g", mode=0o644) as sink:
        sink.write(sample(1))
    with tarfile.open(path) as archive:
        info = archive.getmembers()[0]
        assert (info.mtime, info.uname, info.gname, info.mode) == (1234567890, "u", "g", 0o644)


def test_members_sorted_by_field(tmp_path):
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({"__key__": "b", "z.txt": "z", "a.txt": "a", "cls": 1})
        sink.write({"__key__": "a", "txt": "t"})
    assert list(read_members(path)) == ["b.a.txt", "b.cls", "b.z.txt", "a.txt"]


@pytest.mark.skipif(TAR is None, reason="no tar command")
@pytest.mark.parametrize("name", ["x.tar", "x.tgz"])
def test_tar_command_lists_members(tmp_path, name):
    path = str(tmp_path / name)
    long_key = "dir/" + "k" * 150
    with TarWriter(path) as sink:
        sink.write(sample(0))
        sink.write({"__key__": long_key, "txt": "long"})
        sink.write({"__key__": "ünïcødé", "txt": "u"})
    listed = subprocess.run([TAR, "tf", path], check=True, capture_output=True).stdout.decode().split("\n")
    expected = ["sample0000.cls", "sample0000.jpg", "sample0000.json", "sample0000.meta.json.gz",
                "sample0000.npz", "sample0000.png", f"{long_key}.txt", "ünïcødé.txt"]
    assert listed[:-1] == expected
    extract = tmp_path / "out"
    extract.mkdir()
    subprocess.run([TAR, "xf", path, "-C", str(extract)], check=True)
    assert (extract / f"{long_key}.txt").read_bytes() == b"long"


def test_metadata_fields(tmp_path):
    path = str(tmp_path / "x.tar")
    s = {"__key__": "k", "__url__": "file:/x", "__shard_index__": 3, "txt": "t"}
    with TarWriter(path) as sink:
        sink.write(s)
    assert list(read_members(path)) == ["k.txt"]
    with TarWriter(path, keep_meta=True) as sink:
        sink.write({"__key__": "k", "__url__": "file:/x", "txt": "t"})
    assert read_members(path) == {"k.__url__": b"file:/x", "k.txt": b"t"}


def test_encoder_false(tmp_path):
    path = str(tmp_path / "x.tar")
    png = imageencoder(np.zeros((4, 4, 3), np.uint8), "PNG")
    with TarWriter(path, encoder=False) as sink:
        # The seed's example: PNG bytes, and the class as an integer in ASCII.
        sink.write({"__key__": "img1", "input.png": png, "target.cls": b"3", "note.txt": "str is fine"})
        with pytest.raises(ValueError, match=r"sample 'img2', field 'target.cls' is int.*encode values yourself"):
            sink.write({"__key__": "img2", "input.png": png, "target.cls": 3})
    assert read_members(path) == {"img1.input.png": png, "img1.note.txt": b"str is fine", "img1.target.cls": b"3"}


def test_custom_encoders(tmp_path):
    path = str(tmp_path / "x.tar")

    def upper(s):
        return {k: (v.upper().encode() if k != "__key__" else v) for k, v in s.items()}

    with TarWriter(path, encoder=upper) as sink:
        sink.write({"__key__": "k", "txt": "abc"})
    assert read_members(path) == {"k.txt": b"ABC"}
    handlers = make_handlers()
    handlers["rev"] = lambda x: "".join(x[::-1]).encode()
    with TarWriter(path, encoder=handlers) as sink:
        sink.write({"__key__": "k", "x.rev": ["a", "b"], "txt": "plain"})
    assert read_members(path) == {"k.txt": b"plain", "k.x.rev": b"ba"}
    with pytest.raises(ValueError, match="encoder must be"):
        TarWriter(path, encoder=3)


@pytest.mark.parametrize("key,match", [
    ("../evil", "'..' path component"),
    ("a/../../b", "'..' path component"),
    ("/etc/passwd", "absolute path"),
    ("a\0b", "NUL or a backslash"),
    ("a\\b", "NUL or a backslash"),
    ("a.b", r"'\.' in its last path component"),
    ("", "empty or ends with '/'"),
    ("dir/", "empty or ends with '/'"),
    (17, "__key__ must be a str"),
])
def test_rejected_keys(tmp_path, key, match):
    with TarWriter(str(tmp_path / "x.tar")) as sink:
        with pytest.raises(ValueError, match=match):
            sink.write({"__key__": key, "txt": "x"})


@pytest.mark.parametrize("field,match", [("a/b.txt", "contains '/'"), ("x\\y", "NUL or a backslash"),
                                         ("x\0y", "NUL or a backslash")])
def test_rejected_fields(tmp_path, field, match):
    with TarWriter(str(tmp_path / "x.tar")) as sink:
        with pytest.raises(ValueError, match=match):
            sink.write({"__key__": "k", field: b"x"})


def test_key_with_dots_in_directories_is_fine(tmp_path):
    path = str(tmp_path / "x.tar")
    with TarWriter(path) as sink:
        sink.write({"__key__": "v1.2/./k", "txt": "x"})
    assert list(read_members(path)) == ["v1.2/./k.txt"]


def test_missing_key_and_non_dict(tmp_path):
    with TarWriter(str(tmp_path / "x.tar")) as sink:
        with pytest.raises(ValueError, match="no __key__"):
            sink.write({"txt": "x"})
        with pytest.raises(ValueError, match="must be a dict"):
            sink.write([("__key__", "k")])


def test_write_returns_tar_bytes(tmp_path):
    path = tmp_path / "x.tar"
    with TarWriter(str(path)) as sink:
        sizes = [sink.write({"__key__": "k", "a": b"x" * 10, "b": b"y" * 600}), sink.dwrite("k2", txt="t")]
    assert sizes == [512 + 512 + 512 + 1024, 512 + 512]
    assert path.stat().st_size % 10240 == 0 and path.stat().st_size >= sum(sizes) + 1024
    assert read_members(str(path))["k2.txt"] == b"t"


def test_stream_output_is_not_closed(tmp_path):
    stream = io.BytesIO()
    with TarWriter(stream) as sink:
        sink.write({"__key__": "k", "txt": "x"})
    assert not stream.closed
    assert read_members(stream.getvalue()) == {"k.txt": b"x"}
    gz = io.BytesIO()
    with TarWriter(gz, compress=True) as sink:
        sink.write({"__key__": "k", "txt": "x"})
    assert gz.getvalue()[:2] == b"\x1f\x8b"
    assert read_members(gzip.decompress(gz.getvalue())) == {"k.txt": b"x"}


def test_close_is_idempotent_and_final(tmp_path):
    sink = TarWriter(tmp_path / "x.tar")  # a Path works too
    sink.write({"__key__": "k", "txt": "x"})
    sink.close()
    sink.close()
    with pytest.raises(ValueError, match="closed TarWriter"):
        sink.write({"__key__": "k2", "txt": "x"})
    assert read_members(str(tmp_path / "x.tar")) == {"k.txt": b"x"}


def _interrupted(make_writer, n=3):
    """Write ``n`` samples into ``make_writer()``, then raise inside its ``with`` block."""
    with pytest.raises(RuntimeError, match="boom"):
        with make_writer() as sink:
            for i in range(n):
                sink.write({"__key__": f"k{i}", "txt": "x" * 3000})
            raise RuntimeError("boom")
    return sink


@pytest.mark.parametrize("name", ["x.tar", "x.tgz"])
def test_an_exception_leaves_no_local_archive(tmp_path, name):
    path = tmp_path / name
    sink = _interrupted(lambda: TarWriter(str(path)))
    assert sink.closed and not path.exists() and list(tmp_path.iterdir()) == []
    sink.close()  # idempotent after the abort, and still no file
    assert not path.exists()


@pytest.mark.parametrize("compress", [False, True])
def test_an_exception_leaves_a_given_stream_open_and_its_archive_unfinished(compress):
    stream = io.BytesIO()
    _interrupted(lambda: TarWriter(stream, compress=compress), n=5)
    assert not stream.closed
    data = stream.getvalue()
    import wdsmp

    with pytest.raises(wdsmp.TarFormatError, match="truncated tar archive|corrupt gzip stream"):
        list(wdsmp.tariterators.tar_file_iterator(io.BytesIO(data)))


def test_an_exception_sends_no_end_marker_into_a_pipe(tmp_path):
    import wdsmp

    out = tmp_path / "piped.tar"
    _interrupted(lambda: TarWriter(f"pipe:cat > {out}"), n=50)  # more than a pipe holds: cat runs
    with pytest.raises(wdsmp.TarFormatError, match="truncated tar archive"):
        list(wdsmp.tariterators.tar_file_iterator(open(out, "rb")))
    whole = tmp_path / "whole.tar"
    with TarWriter(f"pipe:cat > {whole}") as sink:  # a normal close ends the archive as before
        sink.write({"__key__": "k0", "txt": "x"})
    assert read_members(str(whole)) == {"k0.txt": b"x"}


def test_an_exception_uploads_nothing(http_server, s3_server):
    url = http_server.url("up/x.tar")
    _interrupted(lambda: TarWriter(url))
    assert http_server.requests("up/x.tar", "PUT") == []
    s3_server.create_bucket("shards")
    _interrupted(lambda: TarWriter("s3://shards/x.tar"))
    _interrupted(lambda: ShardWriter("s3://shards/s-%d.tar", maxcount=2), n=3)
    assert [o["Key"] for o in s3_server.client().list_objects_v2(Bucket="shards").get("Contents", [])] == ["s-0.tar"]


def test_an_exception_in_a_shardwriter_keeps_finished_shards_and_writes_no_index(tmp_path):
    index = tmp_path / "index.json"
    posted = []
    sink = _interrupted(lambda: ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2, index=str(index),
                                            post=posted.append), n=5)
    assert sink.shards == [str(tmp_path / f"s-{i}.tar") for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s-0.tar", "s-1.tar"]  # the short s-2 is gone
    assert posted == sink.shards[:2] and not index.exists()
    assert shard_counts(sink.shards[:2]) == [2, 2]
    with ShardWriter(str(tmp_path / "t-%d.tar"), maxcount=2, index=str(index)) as whole:
        for i in range(5):
            whole.write(small(i))
    assert json.loads(index.read_text())["shards"][-1] == {"url": "t-2.tar", "samples": 1}


def test_tar_formats(tmp_path):
    path = str(tmp_path / "x.tar")
    with TarWriter(path, format="USTAR_FORMAT") as sink:
        sink.write({"__key__": "k", "txt": "x"})
    assert read_members(path) == {"k.txt": b"x"}
    with pytest.raises(ValueError, match="unknown tar format"):
        TarWriter(path, format="NOPE")


def test_bytestr():
    assert bytestr(b"x") == b"x" and bytestr("x") == b"x" and bytestr(12) == b"12"


# ShardWriter.


def shard_counts(paths):
    counts = []
    for path in paths:
        with tarfile.open(path) as archive:
            counts.append(len({m.name.split(".")[0] for m in archive}))
    return counts


def small(i, payload=b""):
    return {"__key__": f"s{i:05d}", "cls": i, "bin": payload}


def test_shardwriter_maxcount_post_and_attributes(tmp_path):
    pattern = str(tmp_path / "shard-%06d.tar")
    closed = []
    with ShardWriter(pattern, maxcount=10, post=closed.append) as sink:
        for i in range(25):
            sink.write(small(i))
        assert (sink.count, sink.total, sink.shard) == (5, 25, 3)
        assert sink.fname == pattern % 2
    names = [pattern % k for k in range(3)]
    assert sink.shards == names and closed == names
    assert shard_counts(names) == [10, 10, 5]
    assert list(read_members(names[1]))[:2] == ["s00010.bin", "s00010.cls"]


def test_shardwriter_maxsize(tmp_path):
    pattern = str(tmp_path / "shard-%d.tar")
    per_sample = 512 + 1024 + 512 + 512  # header + data for .bin (1000 bytes) and .cls
    with ShardWriter(pattern, maxsize=3 * per_sample + 100) as sink:
        for i in range(7):
            assert sink.write(small(i, b"x" * 1000)) == per_sample
            assert sink.size <= sink.maxsize
    assert shard_counts(sink.shards) == [3, 3, 1]


def test_shardwriter_oversized_sample_gets_its_own_shard(tmp_path):
    pattern = str(tmp_path / "shard-%d.tar")
    with ShardWriter(pattern, maxsize=5000) as sink:
        sink.write(small(0, b"a"))
        sink.write(small(1, b"b" * 20000))
        sink.write(small(2, b"c"))
    assert shard_counts(sink.shards) == [1, 1, 1]
    assert read_members(sink.shards[1])["s00001.bin"] == b"b" * 20000


def test_shardwriter_start_shard_opener_kw_and_verbose(tmp_path, capsys):
    pattern = str(tmp_path / "part-%03d.tgz")
    opened = []

    def opener(fname):
        opened.append(fname)
        return open(fname, "wb")

    with ShardWriter(pattern, maxcount=2, start_shard=5, opener=opener, verbose=1, mtime=7) as sink:
        for i in range(3):
            sink.write(small(i))
    assert opened == sink.shards == [pattern % 5, pattern % 6]
    with open(sink.shards[0], "rb") as stream:
        assert stream.read(2) == b"\x1f\x8b"  # .tgz names are compressed
    with tarfile.open(sink.shards[0]) as archive:
        assert archive.getmembers()[0].mtime == 7
    assert shard_counts(sink.shards) == [2, 1]
    err = capsys.readouterr().err
    assert f"# writing {pattern % 5}" in err and f"# writing {pattern % 6}" in err


def test_shardwriter_is_deterministic(tmp_path):
    for run in ("a", "b"):
        with ShardWriter(str(tmp_path / f"{run}-%d.tgz"), maxcount=3) as sink:
            for i in range(7):
                sink.write(sample(i))
    for k in range(3):
        assert (tmp_path / f"a-{k}.tgz").read_bytes() == (tmp_path / f"b-{k}.tgz").read_bytes()


def test_shardwriter_no_samples_no_files(tmp_path):
    pattern = str(tmp_path / "s-%d.tar")
    with ShardWriter(pattern) as sink:
        with pytest.raises(ValueError, match="'..' path component"):
            sink.write({"__key__": "../x", "txt": "x"})
    assert sink.shards == [] and list(tmp_path.iterdir()) == []


def test_shardwriter_close_idempotent(tmp_path):
    sink = ShardWriter(str(tmp_path / "s-%d.tar"))
    sink.write(small(0))
    sink.close()
    sink.close()
    with pytest.raises(ValueError, match="closed ShardWriter"):
        sink.write(small(1))
    assert shard_counts(sink.shards) == [1]


@pytest.mark.parametrize("args,kw,error,match", [
    (("plain.tar",), {}, ValueError, "needs one %-format"),
    (("a-%d-%d.tar",), {}, ValueError, "needs one %-format"),
    (("a-%%.tar",), {}, ValueError, "needs one %-format"),
    (("a-%.0s.tar",), {}, ValueError, "does not use the shard number"),
    (("a-%d.tar",), {"maxcount": 0}, ValueError, "must be positive"),
    (("a-%d.tar",), {"maxsize": -1}, ValueError, "must be positive"),
    (("a-%d.tar",), {"post": "notcallable"}, ValueError, "post must be callable"),
    (("a-%d.tar",), {"bogus": 1}, TypeError, "bogus"),
    (("a-%d.tar",), {"encoder": 3}, ValueError, "encoder must be"),
    (("a-%d.tar",), {"compress": "zip"}, ValueError, "compress must be"),
])
def test_shardwriter_validation(args, kw, error, match):
    with pytest.raises(error, match=match):
        ShardWriter(*args, **kw)


# -- the named encoders webdataset's writer exposes


def test_add_handlers_takes_a_spaced_string_or_a_list():
    table = {}
    add_handlers(table, "a b  c", bytestr)
    add_handlers(table, ["d", "e"], str.encode)
    assert table == {"a": bytestr, "b": bytestr, "c": bytestr, "d": str.encode, "e": str.encode}


def test_default_table_uses_the_named_encoders():
    handlers = make_handlers()
    assert handlers["npy"] is numpy_dumps and handlers["npz"] is numpy_npz_dumps
    assert handlers["ten"] is handlers["tb"] is tenbin_dumps
    assert handlers["mp"] is handlers["msgpack"] is mp_dumps
    assert handlers["cbor"] is cbor_dumps


def test_numpy_dumps_round_trips_and_refuses_objects():
    a = np.arange(12, dtype="float32").reshape(3, 4)
    b = np.load(io.BytesIO(numpy_dumps(a)))
    assert b.dtype == a.dtype
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="pickle"):
        numpy_dumps(np.array([{"x": 1}], dtype=object))


def test_numpy_npz_dumps_round_trips_deterministically():
    arrays = {"x": np.arange(5), "y": np.eye(2, dtype="uint8")}
    data = numpy_npz_dumps(arrays)
    assert data == numpy_npz_dumps(arrays)  # fixed timestamps
    with np.load(io.BytesIO(data)) as loaded:
        assert sorted(loaded.files) == ["x", "y"]
        np.testing.assert_array_equal(loaded["y"], arrays["y"])
    with np.load(io.BytesIO(numpy_npz_dumps(np.arange(3)))) as loaded:
        np.testing.assert_array_equal(loaded["arr_0"], np.arange(3))
    with pytest.raises(TypeError, match="array names must be str"):
        numpy_npz_dumps({1: np.arange(3)})


def test_tenbin_dumps_takes_an_array_or_a_list():
    (one,) = tenbin.decode_buffer(tenbin_dumps(np.arange(4, dtype="int16")))
    np.testing.assert_array_equal(one, np.arange(4))
    two = tenbin.decode_buffer(tenbin_dumps([np.zeros(2, "f4"), np.ones(3, "u1")]))
    assert [a.shape for a in two] == [(2,), (3,)]
    assert isinstance(tenbin_dumps(np.zeros(1, "u1")), bytes)


def test_mp_and_cbor_dumps_round_trip():
    value = {"a": [1, 2.5, "x"], "b": b"raw"}
    assert msgpack.unpackb(mp_dumps(value), raw=False) == value
    assert cbor2.loads(cbor_dumps(value)) == value


_EXITS = textwrap.dedent("""
    import itertools, sys
    import wdsmp

    def samples(path):
        with wdsmp.TarWriter(path) as sink:
            for i in itertools.count():
                sink.write({"__key__": f"k{i}", "txt": "x"})
                yield i

    if __name__ == "__main__":
        how, directory = sys.argv[1], sys.argv[2]
        if how == "generator closed":
            print(list(itertools.islice(samples(directory + "/gen.tar"), 3)))  # the consumer stops
            sys.exit(0)
        with wdsmp.ShardWriter(directory + "/s-%02d.tar", maxcount=2, index=True) as sink:
            for i in range(3):
                sink.write({"__key__": f"k{i}", "txt": "x"})
            if how == "interrupted":
                raise KeyboardInterrupt
            sys.exit(0 if how == "exit 0" else None if how == "exit" else 3)
""")


@pytest.mark.parametrize("how, code, kept", [
    ("exit 0", 0, True), ("exit", 0, True), ("exit 3", 3, False), ("interrupted", -2, False),
    ("generator closed", 0, True)])
def test_a_clean_exit_finishes_the_archive_and_a_real_error_abandons_it(tmp_path, how, code, kept):
    """sys.exit(0) in a ShardWriter block, or a generator writing in a TarWriter block closed by
    its consumer, finish what was written (the last shard and the index); sys.exit(3) and Ctrl-C
    (which may come between a sample's members) abandon the shard being written."""
    script = tmp_path / "write.py"
    script.write_text(_EXITS)
    result = subprocess.run([sys.executable, str(script), how, str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == code, result.stderr[-3000:]
    if how == "generator closed":
        assert read_members(str(tmp_path / "gen.tar")) == {f"k{i}.txt": b"x" for i in range(3)}
        return
    assert read_members(str(tmp_path / "s-00.tar")) == {"k0.txt": b"x", "k1.txt": b"x"}  # finished before
    assert (tmp_path / "s-01.tar").exists() == kept and (tmp_path / "index.json").exists() == kept
    if kept:
        assert read_members(str(tmp_path / "s-01.tar")) == {"k2.txt": b"x"}
