"""Samples from concatenated CBOR and MsgPack files, and whole samples in one tar member."""

import io

import cbor2
import msgpack
import numpy as np
import pytest

import wdsmp as wds
from wdsmp.datasets.cbors import (
    _cbor_items,
    _msgpack_items,
    cbors_samples,
    cbors_to_samples,
    msgpack_samples,
    msgpack_to_samples,
)
from wdsmp.errors import DecodeError

ITEMS = [[0, "zero"], {"a": 1, "b": [1.5, None]}, "text", b"\x00" * 3000, [], {"nested": {"x": 2}}]


def _cbors(path, items):
    with open(path, "wb") as stream:
        for item in items:
            cbor2.dump(item, stream)
    return str(path)


def _msgpacks(path, items):
    with open(path, "wb") as stream:
        for item in items:
            msgpack.pack(item, stream)
    return str(path)


def test_seed_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("test.cbors", "wb") as stream:
        for i in np.linspace(-5.0, 5.0, 1000):
            cbor2.dump((i, str(i)[-5:]), stream)
    dataset = wds.DataPipeline(
        wds.SimpleShardList("test.cbors"),
        cbors_to_samples(),
    )
    data = list(iter(dataset))
    assert (len(data), data[0]) == (1000, [-5.0, "-5.0"])
    assert data[1] == [pytest.approx(-4.98998998998999), "98999"]
    assert data[-1] == [5.0, "5.0"]


def test_urls_as_strings_and_dicts_over_several_shards(tmp_path):
    a = _cbors(tmp_path / "a.cbors", ITEMS)
    b = _cbors(tmp_path / "b.cbors", [1, 2, 3])
    assert list(cbors_samples([a, {"url": b}])) == ITEMS + [1, 2, 3]


@pytest.mark.parametrize("chunksize", [1, 5, 64, 1 << 20])
def test_cbor_items_straddling_chunks(chunksize):
    data = b"".join(cbor2.dumps(item) for item in ITEMS * 3)
    assert list(_cbor_items(io.BytesIO(data), "mem", chunksize=chunksize)) == ITEMS * 3


def test_empty_cbor_file_has_no_items(tmp_path):
    assert list(cbors_samples([_cbors(tmp_path / "e.cbors", [])])) == []


def test_truncated_cbor_names_url_item_and_offset(tmp_path):
    path = _cbors(tmp_path / "t.cbors", ITEMS)
    data = open(path, "rb").read()
    last = len(cbor2.dumps(ITEMS[-1]))
    open(path, "wb").write(data[:-2])
    got = []
    message = rf"truncated CBOR.*item 5.*t\.cbors.*offset {len(data) - last}"
    with pytest.raises(DecodeError, match=message):
        got.extend(cbors_samples([path]))
    assert got == ITEMS[:-1]


def test_corrupt_cbor_names_url_item_and_offset(tmp_path):
    path = tmp_path / "c.cbors"
    head = b"".join(cbor2.dumps(item) for item in ITEMS[:2])
    path.write_bytes(head + b"\xff" + cbor2.dumps(ITEMS[2]))
    message = rf"corrupt CBOR item 2.*c\.cbors.*offset {len(head)}"
    with pytest.raises(DecodeError, match=message) as info:
        list(cbors_samples([str(path)]))
    assert (info.value.url, info.value.offset) == (str(path), len(head))


def test_handler_decides_after_a_bad_shard(tmp_path):
    bad = tmp_path / "bad.cbors"
    bad.write_bytes(cbor2.dumps(1) + cbor2.dumps("a long string")[:-3])
    good = _cbors(tmp_path / "good.cbors", [2, 3])
    urls = [str(bad), good]
    assert list(cbors_samples(urls, handler=wds.ignore_and_continue)) == [1, 2, 3]
    assert list(cbors_samples(urls, handler=wds.ignore_and_stop)) == [1]
    missing = str(tmp_path / "missing.cbors")
    assert list(cbors_samples([missing, good], handler=wds.ignore_and_continue)) == [2, 3]


def test_msgpack_stream(tmp_path):
    path = _msgpacks(tmp_path / "m.mp", [(i, str(i)) for i in range(500)] + [{1: "int key"}])
    data = list(wds.DataPipeline(wds.SimpleShardList(path), msgpack_to_samples()))
    assert len(data) == 501
    assert data[7] == [7, "7"]
    assert data[-1] == {1: "int key"}


@pytest.mark.parametrize("chunksize", [1, 5, 64])
def test_msgpack_items_straddling_chunks(chunksize):
    data = b"".join(msgpack.packb(item) for item in ITEMS * 3)
    assert list(_msgpack_items(io.BytesIO(data), "mem", chunksize=chunksize)) == ITEMS * 3


def test_truncated_msgpack_names_url_item_and_offset(tmp_path):
    path = _msgpacks(tmp_path / "t.mp", ITEMS)
    data = open(path, "rb").read()
    start = len(data) - len(msgpack.packb(ITEMS[-1]))
    open(path, "wb").write(data[:-1])
    with pytest.raises(DecodeError, match=rf"truncated MsgPack.*item 5.*t\.mp.*offset {start}"):
        list(msgpack_samples([path]))


def test_corrupt_msgpack_names_url_item_and_offset(tmp_path):
    path = tmp_path / "c.mp"
    head = msgpack.packb(ITEMS[0])
    path.write_bytes(head + b"\xc1" + msgpack.packb(1))
    with pytest.raises(DecodeError, match=rf"corrupt MsgPack item 1.*c\.mp.*offset {len(head)}"):
        list(msgpack_samples([str(path)]))


@pytest.mark.parametrize("field, loads", [("mp", msgpack.unpackb), ("cbor", cbor2.loads)])
def test_whole_sample_in_one_tar_member(tmp_path, field, loads):
    """The seed's advice against tar header overhead: a sample stored as one member."""
    samples = [{"text": f"line {i}", "label": i, "scores": [i / 2, -i]} for i in range(20)]
    path = str(tmp_path / "packed.tar")
    with wds.TarWriter(path) as writer:
        for i, sample in enumerate(samples):
            writer.write({"__key__": f"{i:04d}", field: sample})
    dataset = wds.DataPipeline(wds.SimpleShardList(path), wds.tarfile_to_samples())
    raw = list(dataset)
    assert [s["__key__"] for s in raw] == [f"{i:04d}" for i in range(20)]
    assert all(set(s) - {"__url__", "__local_path__"} == {"__key__", field} for s in raw)
    assert [loads(s[field]) for s in raw] == samples


@pytest.mark.parametrize("field", ["mp", "cbor"])
def test_whole_sample_read_back_with_the_decoder(tmp_path, field):
    """The seed's reading side: decode, then ``.map(lambda sample: sample["mp"])``."""
    from wdsmp.autodecode import Decoder

    decoder = Decoder([])
    samples = [{"text": f"line {i}", "label": i} for i in range(5)]
    path = str(tmp_path / "packed.tar")
    with wds.TarWriter(path) as writer:
        for i, sample in enumerate(samples):
            writer.write({"__key__": f"{i:04d}", field: sample})

    def unpacked(data):
        for sample in data:
            yield decoder(sample)[field]

    dataset = wds.DataPipeline(wds.SimpleShardList(path), wds.tarfile_to_samples(), unpacked)
    assert list(dataset) == samples


@pytest.mark.parametrize("items, encode, bad", [
    (_cbor_items, cbor2.dumps, b"\xff"),
    (_cbor_items, cbor2.dumps, b"\x82\x01\xff"),  # inside an item: offset is the item's start
    (_msgpack_items, msgpack.packb, b"\xc1"),
    (_msgpack_items, msgpack.packb, b"\x92\x01\xc1"),
])
@pytest.mark.parametrize("chunksize", [3, 1 << 20])
def test_error_offsets_count_from_the_start_of_the_shard(items, encode, bad, chunksize):
    head = b"".join(encode(item) for item in ITEMS)
    message = rf"corrupt .* item 6: .+\(shard 'mem', offset {len(head)}\)"
    with pytest.raises(DecodeError, match=message):
        list(items(io.BytesIO(head + bad + encode(1)), "mem", chunksize=chunksize))
    with pytest.raises(DecodeError) as info:
        list(items(io.BytesIO(head + encode("tail")[:-1]), "mem", chunksize=chunksize))
    assert info.value.offset == len(head)


class CountingReader(io.BytesIO):
    reads = 0

    def read(self, size=-1):
        self.reads += 1
        return super().read(size)


def test_an_item_larger_than_a_chunk_takes_few_reads():
    """NOTE [partial item]: the read size grows with the carried-over bytes."""
    stream = CountingReader(cbor2.dumps(b"x" * 100_000) + cbor2.dumps(1))
    assert list(_cbor_items(stream, "mem", chunksize=16)) == [b"x" * 100_000, 1]
    assert stream.reads < 30
