"""BatchLayout: array offsets and alignment, validation, the ring header, zero-copy views."""

import pickle
import struct

import numpy as np
import pytest

from wdsmp.fast.layout import ARRAY_ALIGN, HEADER_SIZE, MAGIC, SLOT_ALIGN, VERSION, BatchLayout, ArraySpec


def image_layout(batch_size=4, size=7):
    return BatchLayout(batch_size, [
        ArraySpec("image", (size, size, 3), "uint8"),
        ArraySpec("label", (), "int64"),
        ArraySpec("key", (), "S12"),
        ArraySpec("scale", (2,), "float32"),
    ])


def test_offsets_are_aligned_ordered_and_disjoint():
    layout = image_layout()
    spans = []
    for spec in layout.arrays:
        offset = layout.offsets[spec.name]
        assert offset % ARRAY_ALIGN == 0
        spans.append((offset, offset + layout.batch_size * spec.sample_bytes))
    assert spans == sorted(spans)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert layout.slot_size % SLOT_ALIGN == 0 and layout.slot_size >= spans[-1][1]
    assert layout.offsets == {"image": 0, "label": 640, "key": 704, "scale": 768}


def test_slot_size_rounds_up_to_whole_pages():
    exact = BatchLayout(1, [ArraySpec("x", (SLOT_ALIGN,), "u1")])
    assert exact.slot_size == SLOT_ALIGN
    over = BatchLayout(1, [ArraySpec("x", (SLOT_ALIGN + 1,), "u1")])
    assert over.slot_size == 2 * SLOT_ALIGN
    assert over.ring_size(3) == HEADER_SIZE + 3 * over.slot_size


def test_arrayspec_normalises_shape_and_dtype():
    spec = ArraySpec("x", 5, np.float32)
    assert spec.shape == (5,) and spec.dtype == np.dtype("float32").str
    assert ArraySpec("x", [2, np.int64(3)], "i2").shape == (2, 3)
    assert ArraySpec("x", (), "?").sample_bytes == 1
    assert ArraySpec("k", (), "S32").sample_bytes == 32


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="", shape=(1,), dtype="u1"), "non-empty string"),
    (dict(name=3, shape=(1,), dtype="u1"), "non-empty string"),
    (dict(name="x", shape=(0, 3), dtype="u1"), "must be positive"),
    (dict(name="x", shape=(-1,), dtype="u1"), "must be positive"),
    (dict(name="x", shape=(True,), dtype="u1"), "must be positive"),
    (dict(name="x", shape=(2.5,), dtype="u1"), "not a tuple of ints"),
    (dict(name="x", shape=(1,), dtype="no-such-type"), "not a numpy dtype"),
    (dict(name="x", shape=(1,), dtype=object), "cannot live in shared memory"),
    (dict(name="x", shape=(1,), dtype="U8"), "cannot live in shared memory"),
    (dict(name="x", shape=(1,), dtype=[("a", "u1")]), "cannot live in shared memory"),
    (dict(name="x", shape=(1,), dtype="S"), "has no size"),
    (dict(name="x", shape=(1,), dtype=">f4" if np.little_endian else "<f4"), "native byte order"),
])
def test_arrayspec_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArraySpec(**kwargs)


@pytest.mark.parametrize("batch_size, fields, error, match", [
    (0, [ArraySpec("x", (1,), "u1")], ValueError, "batch_size must be a positive int"),
    (-2, [ArraySpec("x", (1,), "u1")], ValueError, "batch_size must be a positive int"),
    (True, [ArraySpec("x", (1,), "u1")], ValueError, "batch_size must be a positive int"),
    (2.0, [ArraySpec("x", (1,), "u1")], ValueError, "batch_size must be a positive int"),
    (2, [], ValueError, "at least one array"),
    (2, [ArraySpec("x", (1,), "u1"), ArraySpec("x", (2,), "f4")], ValueError, r"duplicate array names.*'x'"),
    (2, [("x", (1,), "u1")], TypeError, "ArraySpec instances"),
])
def test_batchlayout_rejects(batch_size, fields, error, match):
    with pytest.raises(error, match=match):
        BatchLayout(batch_size, fields)


@pytest.mark.parametrize("nslots", [0, -1, 1.0, True])
def test_ring_size_rejects_bad_slot_counts(nslots):
    with pytest.raises(ValueError, match="nslots must be a positive int"):
        image_layout().ring_size(nslots)


def test_layouts_pickle_and_digest_names_the_layout():
    layout = image_layout()
    again = pickle.loads(pickle.dumps(layout))
    assert again == layout and again.digest == layout.digest and again.offsets == layout.offsets
    assert image_layout().digest == layout.digest and len(layout.digest) == 16
    variants = [
        image_layout(batch_size=5),
        image_layout(size=8),
        BatchLayout(4, [ArraySpec("image", (7, 7, 3), "uint8"), ArraySpec("label", (), "int32")]),
        BatchLayout(4, [ArraySpec("label", (), "int64"), ArraySpec("image", (7, 7, 3), "uint8")]),
        BatchLayout(4, [ArraySpec("img", (7, 7, 3), "uint8"), ArraySpec("label", (), "int64")]),
    ]
    digests = {v.digest for v in variants} | {layout.digest}
    assert len(digests) == len(variants) + 1


def ring_buffer(layout, nslots):
    buffer = bytearray(layout.ring_size(nslots))
    layout.write_header(buffer, nslots)
    return buffer


def test_header_round_trip():
    layout = image_layout()
    buffer = ring_buffer(layout, 3)
    assert bytes(buffer[:8]) == MAGIC
    assert layout.read_header(buffer) == 3
    assert pickle.loads(pickle.dumps(layout)).read_header(buffer) == 3


def test_header_names_both_layouts_on_mismatch():
    buffer = ring_buffer(image_layout(), 2)
    with pytest.raises(ValueError, match=r"different layout.*\"batch_size\":4.*expects.*\"batch_size\":5"):
        image_layout(batch_size=5).read_header(buffer)


def test_header_rejects_other_data_and_versions():
    layout = image_layout()
    with pytest.raises(ValueError, match="not a wdsmp ring"):
        layout.read_header(bytearray(layout.ring_size(1)))
    buffer = ring_buffer(layout, 1)
    struct.pack_into("<I", buffer, 8, VERSION + 1)
    with pytest.raises(ValueError, match=f"format version {VERSION + 1}"):
        layout.read_header(buffer)
    with pytest.raises(ValueError, match="too small to hold a wdsmp ring header"):
        layout.read_header(bytes(100))


def test_header_rejects_a_truncated_ring_and_a_small_buffer():
    layout = image_layout()
    buffer = ring_buffer(layout, 3)
    with pytest.raises(ValueError, match="header says 3 slots"):
        layout.read_header(buffer[:layout.ring_size(2)])
    with pytest.raises(ValueError, match="too small for a ring"):
        layout.write_header(bytearray(layout.ring_size(1)), 2)


def test_views_are_zero_copy_and_shaped():
    layout = image_layout()
    buffer = ring_buffer(layout, 3)
    views = layout.views(buffer, 2)
    assert list(views) == ["image", "label", "key", "scale"]
    assert views["image"].shape == (4, 7, 7, 3) and views["image"].dtype == np.uint8
    assert views["label"].shape == (4,) and views["label"].dtype == np.int64
    assert views["key"].dtype == np.dtype("S12") and views["scale"].shape == (4, 2)
    views["label"][:] = [10, 11, 12, 13]
    views["key"][1] = b"sample-0001"
    start = layout.slot_offset(2) + layout.offsets["label"]
    assert np.frombuffer(bytes(buffer[start:start + 32]), np.int64).tolist() == [10, 11, 12, 13]
    assert layout.views(buffer, 2)["key"][1] == b"sample-0001"
    assert (layout.views(buffer, 1)["label"] == 0).all()  # slots do not overlap
    assert layout.read_header(buffer) == 3  # and slot 0 does not overlap the header
    for array in layout.views(buffer, 0).values():
        assert array.ctypes.data % ARRAY_ALIGN == (np.frombuffer(buffer, np.uint8).ctypes.data % ARRAY_ALIGN)


def test_views_of_a_read_only_buffer_are_read_only():
    layout = image_layout()
    views = layout.views(bytes(ring_buffer(layout, 1)), 0)
    assert not views["image"].flags.writeable


@pytest.mark.parametrize("slot", [-1, 3, 1.0, True, "0"])
def test_views_reject_slots_out_of_range(slot):
    layout = image_layout()
    with pytest.raises(ValueError, match=r"not in range\(0, 3\)"):
        layout.views(ring_buffer(layout, 3), slot)


def test_views_accept_numpy_slot_numbers():
    layout = image_layout()
    assert layout.views(ring_buffer(layout, 3), np.int64(2))["label"].shape == (4,)
