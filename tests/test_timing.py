"""Timing shard reads (``ReadClock``, as FastLoader's workers use it) and pipeline stages (``StageClock``)."""

import io
import pickle

import pytest

import wdsmp as wds
from wdsmp.epochs.plan import ShardRange
from wdsmp.errors import PipeError
from wdsmp.epochs.ranges import read_ranges
from wdsmp._internal.timing import ReadClock, StageClock, stage_name


def _shard(path, count):
    with wds.TarWriter(str(path)) as sink:
        for i in range(count):
            sink.write({"__key__": f"k{i:03d}", "txt": "x" * 1000})
    return str(path)


def test_the_read_clock_times_opening_and_reading_and_changes_no_sample(tmp_path):
    url = _shard(tmp_path / "a.tar", 5)
    clock = ReadClock()
    timed = [s["__key__"] for s in read_ranges([ShardRange(0, url, 1, 4)], clock=clock)]
    assert timed == [s["__key__"] for s in read_ranges([ShardRange(0, url, 1, 4)])] == ["k001", "k002", "k003"]
    assert clock.ns > 0 and clock.shards == 1 and clock.cache_hits == clock.cache_misses == 0


def test_the_read_clock_counts_cache_misses_then_hits(tmp_path, http_server):
    url = http_server.put_file("a.tar", open(_shard(tmp_path / "a.tar", 4), "rb").read())
    ranges = [ShardRange(0, url, 0, 2), ShardRange(0, url, 2, 4)]
    clock = ReadClock()
    keys = [s["__key__"] for s in read_ranges(ranges, cache_dir=str(tmp_path / "cache"), clock=clock)]
    assert keys == ["k000", "k001", "k002", "k003"]
    assert (clock.cache_misses, clock.cache_hits, clock.shards) == (1, 1, 2)  # fetched once, then read locally
    assert len(http_server.requests("a.tar")) == 1


def test_a_timed_stream_keeps_the_stream_errors(tmp_path):
    url = _shard(tmp_path / "a.tar", 2)
    with pytest.raises(PipeError, match="exited with status 3"):
        list(read_ranges([ShardRange(0, f"pipe:cat {url}; exit 3", 0, None)], clock=ReadClock()))


def test_the_read_clock_times_a_stream_read_by_any_method():
    clock = ReadClock()
    stream = clock.timed_opener(lambda url: io.BufferedReader(io.BytesIO(b"abcdef")))("x")
    assert stream.peek(1)[:1] == b"a" and stream.read(2) == b"ab"
    buffer = bytearray(3)
    assert stream.readinto1(buffer) == 3 and buffer == b"cde"
    stream.close()
    assert stream.closed and clock.shards == 1


def test_stage_names():
    assert stage_name(wds.tarfile_to_samples()) == "tarfile_samples"
    assert stage_name(wds.SimpleShardList("a.tar")) == "SimpleShardList"
    assert stage_name(test_stage_names) == "test_stage_names"


def test_a_stage_clock_sums_what_its_copies_add():
    clock = StageClock(["source", "double"])
    source = clock.timed(iter(range(3)), 0)
    assert list(clock.timed((2 * x for x in source), 1)) == [0, 2, 4]
    copy = pickle.loads(pickle.dumps(clock))  # not for a process being started: a clock of its own
    assert [f["items"] for f in copy.figures()] == [0, 0]
    figures = clock.figures()
    assert [(f["stage"], f["items"]) for f in figures] == [("source", 3), ("double", 3)]
    assert all(f["seconds"] >= 0 for f in figures)
