"""The range reader and buffer shuffle that FastLoader's workers and ExactSamples share."""

import random

import wdsmp as wds
from wdsmp.epochs.plan import ShardRange
from wdsmp.epochs.ranges import buffer_shuffled, read_ranges


def _shards(directory, sizes):
    urls = []
    for s, size in enumerate(sizes):
        url = str(directory / f"part-{s}.tar")
        with wds.TarWriter(url) as sink:
            for i in range(size):
                sink.write({"__key__": f"s{s}-{i:03d}", "txt": f"{s} {i}"})
        urls.append(url)
    return urls


def test_ranges_are_read_in_order_each_from_start_to_stop(tmp_path):
    a, b = _shards(tmp_path, (6, 4))
    ranges = [ShardRange(0, a, 2, 5), ShardRange(1, b, 0, 4), ShardRange(0, a, 0, 1, pad=True)]
    keys = [sample["__key__"] for sample in read_ranges(ranges)]
    assert keys == ["s0-002", "s0-003", "s0-004", "s1-000", "s1-001", "s1-002", "s1-003", "s0-000"]


def test_ranges_read_through_the_cache_give_the_same_samples(tmp_path):
    (url,) = _shards(tmp_path, (6,))
    ranges = [ShardRange(0, url, 1, 3), ShardRange(0, url, 4, None)]
    direct = [sample["__key__"] for sample in read_ranges(ranges)]
    cached = [sample["__key__"] for sample in read_ranges(ranges, cache_dir=str(tmp_path / "cache"))]
    assert cached == direct == ["s0-001", "s0-002", "s0-004", "s0-005"]


def test_buffer_shuffle_yields_every_item_once_in_an_order_fixed_by_the_rng():
    items = list(range(50))
    first = list(buffer_shuffled(iter(items), 8, random.Random(3)))
    assert sorted(first) == items and first != items
    assert list(buffer_shuffled(iter(items), 8, random.Random(3))) == first
    assert sorted(buffer_shuffled(iter(items[:5]), 8, random.Random(3))) == items[:5]  # fewer than the buffer
