"""FastLoader against hostile data and processes: stages yielding None, stale indexes, values that do
not fit, stopped and deadlocked workers. Real shards, real workers, real signals."""

import functools
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import psutil
import pytest
import simplejpeg

import wdsmp
from wdsmp.errors import WorkerError
from wdsmp.fast.loader import FastLoader
from .workerfns import (busy_child_at_three, deadlock_at_six, hung_child_at_three, none_at_five, out_of_range,
                        sleep_a_second, three_point_seven)

SIZE = 16
PER_SHARD = 24


def _shard(path, labels=None, count=PER_SHARD):
    """A shard of ``count`` small JPEG samples ``k/000``...; ``labels`` replaces some ``.cls`` texts."""
    rng = np.random.default_rng(5)
    with wdsmp.TarWriter(str(path)) as sink:
        for i in range(count):
            pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
            label = (labels or {}).get(i, str(i).encode())
            sink.write({"__key__": f"k/{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": label})
    return str(path)


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    return _shard(tmp_path_factory.mktemp("faults") / "part.tar")


def _loader(urls, **kw):
    kw.setdefault("num_workers", 1)
    kw.setdefault("image_size", SIZE)
    kw.setdefault("shuffle", False)
    return FastLoader(urls, kw.pop("batch_size", 4), **kw)


def _keys(loader):
    return [key for batch in loader for key in batch.keys]


def _gone(pid, timeout=10):
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# -- stages that yield None


def test_a_stage_yielding_none_is_an_error_naming_the_stage_shard_and_member(shard):
    """It used to end the worker's stream: the rest of the epoch was padding, without a word."""
    with _loader([(shard, PER_SHARD)], stages=[none_at_five]) as loader:
        with pytest.raises(WorkerError, match=r"worker 0 failed, shard '.*part.tar', member 'k/005': "
                                              r"wdsmp.errors.SampleError: the stages \(the last: none_at_five\) "
                                              r"yielded None, not a sample dict"):
            list(loader)
    with pytest.warns(UserWarning, match=r"in loader worker 0: .*yielded None, not a sample dict"):
        with _loader([(shard, PER_SHARD)], stages=[none_at_five], keys=True,
                     handler=wdsmp.warn_and_continue) as loader:
            keys = _keys(loader)
            assert loader.stats["skipped"] == 1 and loader.stats["padded"] == 1
    assert len(keys) == PER_SHARD and len(set(keys)) == PER_SHARD - 1 and "k/005" not in keys


# -- stale sample counts


@pytest.mark.parametrize("indexed", [10, 40])
def test_a_stale_count_is_a_warning_naming_the_shard_and_both_counts(shard, tmp_path, indexed):
    """The plan stays as the index made it, so every rank still gets the same full batches; the
    warning says what was skipped or padded."""
    other = _shard(tmp_path / "other.tar")
    table = [(shard, indexed), (other, PER_SHARD)]
    if indexed < PER_SHARD:
        message = rf"shard '.*part.tar' has {PER_SHARD} samples, not the {indexed} the epoch was planned with; " \
                  rf"its last {PER_SHARD - indexed} are skipped this epoch"
    else:
        message = rf"shard '.*part.tar' has {PER_SHARD} samples, not the {indexed} the epoch was planned with; " \
                  rf"\d+ of the samples planned from it \(\d+..\d+\) are not there, and their rows are padded"
    batches = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rank in range(2):
            with _loader(table, keys=True, rank=rank, world_size=2, num_workers=2) as loader:
                keys = _keys(loader)
                assert len(keys) == 4 * len(loader)
                batches.append(len(loader))
    assert batches[0] == batches[1] == (indexed + PER_SHARD) // 2 // 4
    stale = [str(w.message) for w in caught if "stale sample count" in str(w.message)]
    assert stale and all(re.search(message, text) for text in stale), stale
    assert not any("other.tar" in text for text in stale)


@pytest.mark.parametrize("first", [False, True])
def test_a_too_small_count_is_seen_also_on_the_last_shard_a_stream_reads(shard, tmp_path, first):
    """An index saying 10 for a shard of 24, read last (or first) by its stream, unshuffled: the
    stream stops at its planned last sample, so only a look past it tells the shard goes on.
    FastLoader and ExactSamples warn in both places (they used to, for the shard read last, deliver
    the planned samples and say nothing, every epoch)."""
    other = _shard(tmp_path / "other.tar", count=8)
    table = [(shard, 10), (other, 8)] if first else [(other, 8), (shard, 10)]
    message = rf"shard '.*part.tar' has {PER_SHARD} samples, not the 10 the epoch was planned with; its last 14"
    with pytest.warns(UserWarning, match=message):
        with _loader(table, keys=True, batch_size=2, train=False) as loader:
            assert len(_keys(loader)) == 18
    with pytest.warns(UserWarning, match=message):
        keys = [sample["__key__"] for sample in wdsmp.ExactSamples(table, batch_size=2, shuffle=False)]
    assert len(keys) == 18


# -- labels and fields that do not fit


@pytest.mark.parametrize("kw, member, message", [
    (dict(label=three_point_seven), "k/000", r"label function 'three_point_seven': 3.7 is not an integer"),
    (dict(label=None, fields={"small": (out_of_range, (4,), "uint8")}), "k/000",
     r"field 'small': element \[0\] = 300.0 is outside 0..255"),
    (dict(labels={3: b"1_000"}), "k/003", r"label field 'cls': b'1_000' is not an integer \(ASCII digits"),
    (dict(labels={2: "\u0663".encode()}), "k/002", r"label field 'cls': b'\\xd9\\xa3' is not an integer"),
])
def test_labels_and_fields_are_never_cast(tmp_path, kw, member, message):
    """numpy would store 3, [44, 255, 0, 0], 1000 and 3."""
    url = _shard(tmp_path / "values.tar", labels=kw.pop("labels", None), count=8)
    with _loader([(url, 8)], **kw) as loader:
        with pytest.raises(WorkerError, match=rf"worker 0 failed, shard '.*values.tar', member '{member}': "
                                              rf"wdsmp.errors.SampleError: {message}"):
            list(loader)


# -- workers that stall, and workers that are only slow


@pytest.mark.parametrize("how", ["SIGSTOP", "deadlock"])
def test_a_stalled_worker_is_killed_and_named_with_its_shard(shard, how):
    stages = [deadlock_at_six] if how == "deadlock" else []
    with _loader([(shard, PER_SHARD)], prefetch=1, stall_timeout=2, stages=stages) as loader:
        iterator = iter(loader)
        next(iterator)
        pid = loader._resources.workers.pids()[0]
        if how == "SIGSTOP":
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        state = "stopped" if how == "SIGSTOP" else "sleeping"
        with pytest.raises(WorkerError, match=rf"loader worker 0 \(pid {pid}\) made no progress for \d+ s while "
                                              rf"reading shard '.*part.tar' during epoch 0 .*its state was '{state}'"):
            for _ in iterator:
                pass
        assert time.monotonic() - started < 30 and _gone(pid)
    if how == "SIGSTOP":
        with _loader([(shard, PER_SHARD)], prefetch=1, stall_timeout=2) as loader:
            assert len(list(loader)) == len(loader)  # a worker waiting for slots is alive


@pytest.mark.processes
def test_a_program_a_stage_waits_for_is_the_workers_life_and_goes_with_it(shard, tmp_path):
    """A stage waiting for a program that computes for longer than the stall timeout: the
    worker shows no activity of its own, the program does; a program that hangs is a stall, and
    is killed with the worker (it used to be left running)."""
    with _loader([(shard, PER_SHARD)], prefetch=1, stall_timeout=1.5, stages=[busy_child_at_three]) as loader:
        assert len(list(loader)) == len(loader)
    pid_file = str(tmp_path / "child")
    with _loader([(shard, PER_SHARD)], prefetch=1, stall_timeout=1.5,
                 stages=[functools.partial(hung_child_at_three, pid_file)]) as loader:
        with pytest.raises(WorkerError, match="made no progress"):
            list(loader)
    assert _gone(int(open(pid_file).read()))


@pytest.mark.processes
def test_a_slow_stage_is_not_a_stall(shard):
    """Samples a second apart for longer than the stall timeout: each sleep ends in a wake-up."""
    with _loader([(shard, PER_SHARD)], batch_size=1, prefetch=1, stall_timeout=2.5, stages=[sleep_a_second]) as loader:
        iterator = iter(loader)
        assert [batch.count for batch, _ in zip(iterator, range(4))] == [1, 1, 1, 1]


@pytest.mark.processes
def test_a_slow_download_is_not_a_stall(tmp_path, http_server):
    """A shard whose last bytes trickle in for seconds, more than the stall timeout."""
    data = open(_shard(tmp_path / "slow.tar", count=6), "rb").read()
    url = http_server.put_file("slow.tar", data)
    http_server.fault("slow.tar", "trickle", after=len(data) - 24, seconds=0.25)
    with _loader([(url, 6)], batch_size=3, stall_timeout=2.5, keys=True) as loader:
        assert _keys(loader) == [f"k/{i:03d}" for i in range(6)]


# -- /dev/shm shared with other PID namespaces


def _unshare_works(*flags):
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


_FIRST = textwrap.dedent("""
    import os, sys
    from wdsmp.fast.loader import FastLoader
    if __name__ == "__main__":
        loader = FastLoader([(sys.argv[1], int(sys.argv[2]))], 4, num_workers=2, image_size=16, shuffle=False)
        iterator = iter(loader)
        next(iterator)
        print(loader._resources.ring.name, flush=True)
        sys.stdin.readline()  # another loader comes and goes meanwhile
        print("batches", 1 + len(list(iterator)), len(loader), flush=True)
        loader.close()
""")

_SECOND = textwrap.dedent("""
    import os, sys
    from wdsmp.fast.loader import FastLoader
    if __name__ == "__main__":
        with FastLoader([(sys.argv[1], int(sys.argv[2]))], 4, num_workers=1, image_size=16) as loader:
            next(iter(loader))
        print("pid", os.getpid(), flush=True)
""")


@pytest.mark.skipif(not _unshare_works("--pid", "--fork", "--mount-proc"),
                    reason="needs unshare --pid (root, or user namespaces)")
@pytest.mark.processes
def test_a_loader_in_another_pid_namespace_leaves_this_ones_ring(shard, tmp_path):
    """Containers on one host share /dev/shm but not pids: to a loader in a new PID namespace
    every pid of ours is dead (or another process's). Its clean-up must go by the owner's lock."""
    (tmp_path / "first.py").write_text(_FIRST)
    (tmp_path / "second.py").write_text(_SECOND)
    first = subprocess.Popen([sys.executable, str(tmp_path / "first.py"), shard, str(PER_SHARD)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ring = first.stdout.readline().strip()
        assert os.path.exists(f"/dev/shm/{ring}")
        second = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                                 str(tmp_path / "second.py"), shard, str(PER_SHARD)],
                                capture_output=True, text=True, timeout=180)
        assert second.returncode == 0, second.stderr[-3000:]
        assert second.stdout.split() == ["pid", "1"]  # it ran in a PID namespace of its own
        assert os.path.exists(f"/dev/shm/{ring}")
        out, err = first.communicate("go on\n", timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, err[-3000:]
    assert out.split() == ["batches", "6", "6"] and "Traceback" not in err, err[-3000:]
