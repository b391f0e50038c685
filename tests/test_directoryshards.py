"""DirectoryShardList: claiming, recycling and giving back shards in a shared directory."""

import os
import pickle
import subprocess
import sys
import threading
import time
from itertools import islice

import pytest

from wdsmp.shardlists import DirectoryShardList, check_pid_is_running, get_pid_from_filename, without_last_extension


def test_pid_helpers():
    assert check_pid_is_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not check_pid_is_running(child.pid)  # reaped: no such process
    assert not check_pid_is_running(0) and not check_pid_is_running(-1)
    assert get_pid_from_filename("/d/a.tar._1234_") == 1234
    assert get_pid_from_filename("/d/a.tar._done_") is None
    assert get_pid_from_filename("/d/a.tar") is None


@pytest.mark.parametrize("name, expected", [
    ("/d/a.tar._12_", "/d/a.tar"),
    ("a.tar", "a"),
    ("noext", "noext"),
    ("dir.d/file", "dir.d/file"),  # only the last path component loses an extension
])
def test_without_last_extension(name, expected):
    assert without_last_extension(name) == expected


def shard_dir(tmp_path, names=("a.tar", "b.tar", "c.tgz")):
    directory = tmp_path / "shards"
    directory.mkdir()
    for name in names:
        (directory / name).write_bytes(name.encode())
    return directory


def test_directory_unlink_serves_each_shard_once(tmp_path):
    directory = shard_dir(tmp_path, ["a.tar", "b.tar", "c.tgz", "d.tar.tgz", "notes.txt"])
    seen = []
    for sample in DirectoryShardList(str(directory), poll=None, mode="unlink"):
        url = sample["url"]
        assert url.endswith(f"._{os.getpid()}_") and os.path.exists(url)  # claimed while in use
        seen.append(os.path.basename(without_last_extension(url)))
    assert sorted(seen) == ["a.tar", "b.tar", "c.tgz", "d.tar.tgz"]  # the braced default pattern
    assert os.listdir(directory) == ["notes.txt"]


def test_directory_keep_marks_shards_done(tmp_path):
    directory = shard_dir(tmp_path)
    urls = [s["url"] for s in DirectoryShardList(str(directory) + "/", poll=None, mode="keep",
                                                 pattern="*.tar")]
    assert len(urls) == 2
    assert sorted(os.listdir(directory)) == ["a.tar._done_", "b.tar._done_", "c.tgz"]
    assert list(DirectoryShardList(str(directory), pattern="*", poll=None, mode="keep")) == [
        {"url": f"{directory}/c.tgz._{os.getpid()}_"}]  # done and claimed files are never candidates


def test_directory_resample_returns_shards(tmp_path):
    directory = shard_dir(tmp_path, ["a.tar", "b.tar"])
    urls = [s["url"] for s in islice(DirectoryShardList(str(directory), poll=None), 20)]
    assert len(urls) == 20 and {os.path.basename(u).split(".")[0] for u in urls} == {"a", "b"}
    assert sorted(os.listdir(directory)) == ["a.tar", "b.tar"]  # all back, the last one included


@pytest.mark.parametrize("mode", ["unlink", "keep", "resample"])
def test_directory_early_close_gives_the_shard_back(tmp_path, mode):
    directory = shard_dir(tmp_path, ["a.tar"])
    iterator = iter(DirectoryShardList(str(directory), poll=None, mode=mode))
    url = next(iterator)["url"]
    assert os.listdir(directory) == [os.path.basename(url)]
    iterator.close()  # the consumer stopped before asking for more: the shard may be unfinished
    assert os.listdir(directory) == ["a.tar"]


def test_directory_select_oldest(tmp_path):
    directory = shard_dir(tmp_path)
    for age, name in enumerate(["c.tgz", "a.tar", "b.tar"]):
        os.utime(directory / name, (1000 - age * 100, 1000 - age * 100))
    urls = [s["url"] for s in DirectoryShardList(str(directory), poll=None, mode="unlink", select="oldest")]
    assert [os.path.basename(without_last_extension(u)) for u in urls] == ["b.tar", "a.tar", "c.tgz"]


def test_directory_readers_never_share_a_shard(tmp_path):
    directory = shard_dir(tmp_path, [f"s{i}.tar" for i in range(6)])
    first = iter(DirectoryShardList(str(directory), poll=None, mode="keep"))
    second = iter(DirectoryShardList(str(directory), poll=None, mode="keep"))
    urls = []
    for _ in range(3):
        urls += [next(first)["url"], next(second)["url"]]
    assert len(set(urls)) == 6


def test_directory_gives_back_claims_of_dead_processes(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    directory = shard_dir(tmp_path, [f"orphan.tar._{child.pid}_", f"held.tar._{os.getppid()}_"])
    urls = [s["url"] for s in DirectoryShardList(str(directory), poll=None, mode="unlink")]
    assert [os.path.basename(u) for u in urls] == [f"orphan.tar._{os.getpid()}_"]  # given back, then served
    assert os.listdir(directory) == [f"held.tar._{os.getppid()}_"]  # its owner still runs


def test_directory_waits_for_producers(tmp_path):
    directory = shard_dir(tmp_path, [])
    producer = threading.Timer(0.2, (directory / "late.tar").write_bytes, [b"x"])
    producer.start()
    try:
        iterator = iter(DirectoryShardList(str(directory), poll=0.02, timeout=10, mode="unlink"))
        assert next(iterator)["url"].startswith(str(directory / "late.tar._"))
    finally:
        producer.join()
    start = time.monotonic()
    assert list(DirectoryShardList(str(directory), poll=0.01, timeout=0.1)) == []
    assert time.monotonic() - start < 5


def test_directory_validates_and_pickles(tmp_path):
    directory = shard_dir(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        DirectoryShardList(str(directory / "a.tar"))
    with pytest.raises(ValueError, match="mode must be one of"):
        DirectoryShardList(str(directory), mode="delete")
    with pytest.raises(ValueError, match="select must be one of"):
        DirectoryShardList(str(directory), select="newest")
    with pytest.raises(ValueError, match="poll must be"):
        DirectoryShardList(str(directory), poll=-1)
    copy = pickle.loads(pickle.dumps(DirectoryShardList(str(directory), poll=None, mode="unlink")))
    assert len(list(copy)) == 3
