"""Tests of wdsmp.cache: real shards, real ``pipe:`` commands and processes, a real HTTP server.

Sources are ``pipe:`` commands that append a line to a log each time they
run, so a test can count fetches.
"""

import fcntl
import multiprocessing
import os
import pickle
import resource
import signal
import time
import warnings

import pytest

import wdsmp
from wdsmp.cache import (
    FileCache,
    LRUCleanup,
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    cached_url_opener,
    check_tar_format,
    download,
    get_filetype,
    islocal,
    lru_cleanup,
    pipe_cleaner,
    url_to_cache_name,
    url_to_name,
)
from wdsmp.errors import PipeError, ShardError, TarFormatError
from wdsmp.pipeline import DataPipeline
from wdsmp.shardlists import SimpleShardList
from wdsmp.tariterators import tarfile_samples

NSAMPLES = 30
SAMPLE_BYTES = 100_000  # 30 samples of 100 kB: a shard of 3 MB, several reader buffers long


def make_shard(path, seed=0, n=NSAMPLES, size=SAMPLE_BYTES):
    """A shard written with wdsmp's own writer; different seeds give different contents."""
    data = bytes((seed * 7 + i) % 251 for i in range(size))
    with wdsmp.TarWriter(str(path)) as writer:
        for i in range(n):
            writer.write({"__key__": f"s{seed}/{i:04d}", "bin": data[i:] + data[:i], "cls": str(i)})
    return str(path)


def logged(shard, log):
    """A ``pipe:`` URL that appends a line to ``log`` whenever it runs, then sends ``shard``."""
    return f"pipe:echo run >> {log}; cat {shard}"


def processes():
    """A process context like DataLoader's spawned workers: fresh processes that share
    nothing with this one but what they are sent. forkserver, with wdsmp imported once
    in the server, because importing torch in each spawned child takes seconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def runs(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def entries(cache_dir):
    """Complete entries in the cache directory (no locks, no temps)."""
    if not cache_dir.exists():
        return []
    return sorted(p.name for p in cache_dir.iterdir()
                  if not p.name.startswith(".") and not p.name.endswith(".lock"))


@pytest.fixture
def shard(tmp_path):
    return make_shard(tmp_path / "shard.tar")


@pytest.fixture
def log(tmp_path):
    return tmp_path / "log"


def test_first_pass_same_samples_then_cached_copy_read_without_the_source(tmp_path, shard, log, impl):
    cache = tmp_path / "cache"
    url = logged(shard, log)
    expected = list(tarfile_samples([url]))
    assert runs(log) == 1
    first = list(cached_tarfile_samples([url], cache_dir=str(cache)))
    assert first == expected  # same keys, fields, bytes and __url__
    assert runs(log) == 2
    [name] = entries(cache)
    assert (cache / name).read_bytes() == open(shard, "rb").read()  # bit-identical
    for _ in range(2):
        assert list(cached_tarfile_samples([{"url": url}], cache_dir=str(cache))) == expected
    assert runs(log) == 2  # later passes never ran the source
    assert not [p for p in os.listdir(cache) if p.endswith(".tmp")]


def test_first_pass_streams_while_caching(tmp_path, shard):
    """The first sample comes while the source is still held back midway: nothing waits
    for a whole shard, and the entry appears only at the end."""
    cache, gate = tmp_path / "cache", tmp_path / "go"
    url = (f"pipe:head -c 1500000 {shard}; while [ ! -e {gate} ]; do sleep 0.01; done; "
           f"tail -c +1500001 {shard}")
    samples = cached_tarfile_samples([url], cache_dir=str(cache))
    first = next(samples)
    assert first["__key__"] == "s0/0000"
    assert entries(cache) == []
    assert [p for p in os.listdir(cache) if p.endswith(".tmp")]  # the tee is writing
    gate.touch()
    assert len([first, *samples]) == NSAMPLES
    assert len(entries(cache)) == 1


def test_gzip_shard_cached_bit_identical(tmp_path, log):
    shard = make_shard(tmp_path / "shard.tar.gz")
    cache = tmp_path / "cache"
    url = logged(shard, log)
    expected = list(tarfile_samples([url]))
    assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    [name] = entries(cache)
    assert (cache / name).read_bytes() == open(shard, "rb").read()
    assert runs(log) == 2


def test_early_break_leaves_no_temp_and_no_entry(tmp_path, shard, log):
    cache = tmp_path / "cache"
    samples = cached_tarfile_samples([logged(shard, log)], cache_dir=str(cache))
    next(samples)
    samples.close()  # what a consumer's break does to the generator
    assert os.listdir(cache) == []  # no entry, no temp, no lock file

    def take_one():
        for sample in cached_tarfile_samples([logged(shard, log)], cache_dir=str(cache)):
            return sample

    assert take_one()["__key__"] == "s0/0000"
    assert os.listdir(cache) == []


@pytest.mark.parametrize("command, error", [
    ("cat {shard}; exit 1", PipeError),  # the source fails after sending everything
    ("head -c 250000 {shard}", TarFormatError),  # the source ends early, exit status 0
])
def test_failing_source_raises_the_usual_error_and_caches_nothing(tmp_path, shard, command, error):
    cache = tmp_path / "cache"
    url = "pipe:" + command.format(shard=shard)
    with pytest.raises(error) as uncached:
        list(tarfile_samples([url]))
    with pytest.raises(error) as cached:
        list(cached_tarfile_samples([url], cache_dir=str(cache)))
    assert str(cached.value) == str(uncached.value)
    assert os.listdir(cache) == []


def _read_concurrently(url, cache_dir, barrier, results):
    barrier.wait(timeout=60)
    keys = [s["__key__"] for s in cached_tarfile_samples([url], cache_dir=cache_dir)]
    results.put(keys)


def test_processes_reading_one_url_fetch_it_once(tmp_path, shard, log):
    """Four processes start reading the same (slow) source together: one fetches it,
    the others wait for the cache file and read it."""
    cache = tmp_path / "cache"
    url = f"pipe:echo run >> {log}; sleep 0.5; cat {shard}"
    context = processes()
    barrier, results = context.Barrier(4), context.Queue()
    procs = [context.Process(target=_read_concurrently, args=(url, str(cache), barrier, results))
             for _ in range(4)]
    for proc in procs:
        proc.start()
    keys = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert runs(log) == 1
    assert keys == [[f"s0/{i:04d}" for i in range(NSAMPLES)]] * 4
    [name] = entries(cache)
    assert (cache / name).read_bytes() == open(shard, "rb").read()


def test_waiting_for_another_fetch_is_bounded(tmp_path, shard, log):
    """While another process holds the entry's lock (here: this test), a reader waits
    ``lock_timeout`` seconds, then reads the source without caching, with a warning."""
    cache = tmp_path / "cache"
    url = logged(shard, log)
    lockfile = FileCache(str(cache)).entry_path(url) + ".lock"
    cache.mkdir()
    with open(lockfile, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="waited 0.3s for another process caching"):
            samples = list(cached_tarfile_samples([url], cache_dir=str(cache), lock_timeout=0.3))
        assert 0.3 <= time.monotonic() - start < 5
    assert len(samples) == NSAMPLES
    assert runs(log) == 1
    assert entries(cache) == []


def _read_with_file_size_limit(url, cache_dir, limit, results):
    """Read through the cache with writes past ``limit`` bytes failing in the kernel
    (EFBIG), as a full disk fails them (ENOSPC): the same OSError path in the cache."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [s["__key__"] for s in cached_tarfile_samples([url], cache_dir=cache_dir)]
    results.put((keys, [str(w.message) for w in caught], os.listdir(cache_dir)))


def test_cache_write_failure_goes_on_uncached(tmp_path, shard, log):
    cache = tmp_path / "cache"
    context = processes()
    results = context.Queue()
    proc = context.Process(target=_read_with_file_size_limit,
                           args=(logged(shard, log), str(cache), 200_000, results))
    proc.start()
    keys, messages, left = results.get(timeout=120)
    proc.join(30)
    assert proc.exitcode == 0
    assert keys == [f"s0/{i:04d}" for i in range(NSAMPLES)]  # training did not die
    assert any("cannot write the cache file" in m and "without caching it" in m for m in messages)
    assert left == []  # no temp, no entry, no lock file


def test_corrupt_cache_file_is_replaced(tmp_path, shard, log):
    cache = tmp_path / "cache"
    url = logged(shard, log)
    expected = list(cached_tarfile_samples([url], cache_dir=str(cache)))
    [name] = entries(cache)
    (cache / name).write_bytes(b"<html>not found</html>" * 100)
    with pytest.warns(RuntimeWarning, match="is not a tar archive .data.; fetching it again"):
        assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    assert runs(log) == 2
    assert (cache / name).read_bytes() == open(shard, "rb").read()


def _age(cache, name, seconds):
    when = time.time() - seconds
    os.utime(cache / name, (when, when))


def three_shards(tmp_path, log):
    """URLs of three shards of one size (logged), and that size."""
    urls = {c: logged(make_shard(tmp_path / f"{c}.tar", seed=i), log) for i, c in enumerate("abc")}
    return urls, os.path.getsize(tmp_path / "a.tar")


def test_lru_eviction_under_cache_size(tmp_path, log):
    cache = tmp_path / "cache"
    urls, size = three_shards(tmp_path, log)
    files = FileCache(str(cache), cache_size=2 * size + size // 2)  # room for two shards
    names = {c: os.path.basename(files.entry_path(urls[c])) for c in "abc"}

    def read(c):
        list(cached_tarfile_samples([urls[c]], cache_dir=str(cache), cache_size=files.cache_size))

    read("a")
    read("b")
    _age(cache, names["a"], 100)
    _age(cache, names["b"], 50)
    read("a")  # a is used again: b is now the least recently used
    assert runs(log) == 2
    read("c")
    assert entries(cache) == sorted([names["a"], names["c"]])
    assert sum(os.path.getsize(cache / n) for n in entries(cache)) <= files.cache_size


def test_eviction_spares_entries_being_read(tmp_path, log):
    cache = tmp_path / "cache"
    urls, size = three_shards(tmp_path, log)
    files = FileCache(str(cache), cache_size=2 * size + size // 2)
    names = {c: os.path.basename(files.entry_path(urls[c])) for c in "abc"}
    for c in "ab":
        list(cached_tarfile_samples([urls[c]], cache_dir=str(cache), cache_size=files.cache_size))
    _age(cache, names["a"], 50)
    with files.open(urls["b"]) as reading:  # b is being read (its shared lock is held) ...
        _age(cache, names["b"], 100)  # ... and is the least recently used
        list(cached_tarfile_samples([urls["c"]], cache_dir=str(cache), cache_size=files.cache_size))
        assert reading.read(512)
    assert entries(cache) == sorted([names["b"], names["c"]])  # a went instead


def test_shard_larger_than_cache_size_is_read_but_not_cached(tmp_path, shard, log):
    cache = tmp_path / "cache"
    url = logged(shard, log)
    with pytest.warns(RuntimeWarning, match="larger than cache_size"):
        samples = list(cached_tarfile_samples([url], cache_dir=str(cache), cache_size=1000))
    assert len(samples) == NSAMPLES
    assert os.listdir(cache) == []


def _cache_as(cache, url, name):
    """Read ``url`` through the cache in ``cache``, naming its entry ``name``."""
    list(cached_tarfile_samples([url], cache_dir=str(cache), cache_name=lambda _: name))


def test_lru_cleanup_and_orphaned_temps(tmp_path):
    cache = tmp_path / "cache"
    for i, name in enumerate(["old", "mid", "new"]):
        _cache_as(cache, f"pipe:cat {make_shard(tmp_path / f'{name}.tar', seed=i, n=1, size=1000)}", name)
        _age(cache, name, 100 - 10 * i)
    orphan = cache / ".mid.99999999.0123abcd.tmp"  # its writer died: nobody holds mid.lock
    orphan.write_bytes(b"partial")
    busy = cache / ".busy.1.89abcdef.tmp"
    busy.write_bytes(b"partial")
    with open(cache / "busy.lock", "w") as writing:
        fcntl.flock(writing, fcntl.LOCK_EX)  # a live writer of "busy"
        lru_cleanup(str(cache), 2 * os.path.getsize(cache / "old"))
    assert entries(cache) == ["mid", "new"]
    assert not orphan.exists() and busy.exists()


def test_lru_cleanup_set_cache_dir_points_it_at_another_cache(tmp_path):
    caches = {name: tmp_path / name for name in ("first", "second")}
    for cache in caches.values():
        for i, name in enumerate(["old", "mid", "new"]):
            _cache_as(cache, f"pipe:cat {make_shard(tmp_path / f'{name}.tar', seed=i, n=1, size=1000)}", name)
            _age(cache, name, 100 - 10 * i)
    size = os.path.getsize(caches["first"] / "old")
    cleanup = LRUCleanup(str(caches["first"]), cache_size=2 * size, interval=None)
    cleanup.set_cache_dir(str(caches["second"]))
    cleanup.cleanup()
    assert entries(caches["first"]) == ["mid", "new", "old"]  # no longer the cache: untouched
    assert entries(caches["second"]) == ["mid", "new"]
    cleanup.set_cache_dir(None)
    cleanup.cleanup()  # no cache directory: nothing to do
    assert entries(caches["second"]) == ["mid", "new"]


def test_eviction_removes_only_what_the_cache_wrote(tmp_path, log):
    """Files of the user's in the cache directory (even one with a lock file beside it, or in a
    subdirectory) are neither evicted nor counted."""
    cache = tmp_path / "cache"
    (cache / "notes").mkdir(parents=True)
    urls, size = three_shards(tmp_path, log)
    theirs = {"my-thesis.txt": b"chapter 1" * size, "notes/todo.txt": b"x" * size, "plan": b"y" * 10}
    for name, data in theirs.items():
        (cache / name).write_bytes(data)
        _age(cache, name, 1000)  # older than any entry: the first to go, were they entries
    (cache / "plan.lock").write_bytes(b"")  # another tool's lock beside it
    cap = 2 * size + size // 2  # room for two shards
    for c in "abc":
        list(cached_tarfile_samples([urls[c]], cache_dir=str(cache), cache_size=cap))
    assert {name: (cache / name).read_bytes() for name in theirs} == theirs
    names = {c: os.path.basename(FileCache(str(cache)).entry_path(urls[c])) for c in "abc"}
    assert entries(cache) == sorted(["my-thesis.txt", "notes", "plan", names["b"], names["c"]])
    _age(cache, names["c"], 100)
    lru_cleanup(str(cache), size)
    assert entries(cache) == sorted(["my-thesis.txt", "notes", "plan", names["b"]])


def test_a_cache_file_cut_short_is_fetched_again_once_with_a_warning(tmp_path, shard, log):
    """A loader checks a cache file's first block, which a copy cut short passes; its size,
    recorded when it was cached, tells (read as it is, it would fail at the cut on every pass)."""
    cache = tmp_path / "cache"
    url = logged(shard, log)
    expected = list(cached_tarfile_samples([url], cache_dir=str(cache)))
    [name] = entries(cache)
    with open(cache / name, "r+b") as stream:
        stream.truncate(os.path.getsize(shard) // 2)  # mid-member: the first block still says tar
    with pytest.warns(RuntimeWarning, match=rf"cache file .*{name} for .* is 1,5\d\d,\d\d\d bytes, not the "
                                            r"3,\d+,\d+ it had when cached .cut short.*; fetching it again"):
        assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    assert runs(log) == 2 and (cache / name).read_bytes() == open(shard, "rb").read()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    assert runs(log) == 2


def test_names_hash_the_whole_url(tmp_path, log):
    cache = tmp_path / "cache"
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = make_shard(tmp_path / "one" / "shard.tar", seed=1)
    two = make_shard(tmp_path / "two" / "shard.tar", seed=2)
    assert url_to_name(f"pipe:cat {one}") != url_to_name(f"pipe:cat {two}")
    assert url_to_name(f"pipe:cat {one}").endswith("-shard.tar")
    assert url_to_name("http://host/a/b-000001.tar?sig=1") != url_to_name("http://host/a/b-000001.tar?sig=2")
    assert url_to_name("pipe:curl -s http://host/d/x.tar || true").endswith("-x.tar")
    assert len(url_to_name("pipe:cat")) == 32  # no shard name to show: the hash alone
    for path in (one, two):
        assert list(cached_tarfile_samples([f"pipe:cat {path}"], cache_dir=str(cache))) == \
            list(tarfile_samples([f"pipe:cat {path}"]))
    contents = {(cache / n).read_bytes() for n in entries(cache)}
    assert contents == {open(one, "rb").read(), open(two, "rb").read()}


def _fixed_name(url):
    return "sub/my-shard.tar"


def test_cache_name_overrides_the_naming(tmp_path, shard, log):
    cache = tmp_path / "cache"
    url = logged(shard, log)
    list(cached_tarfile_samples([url], cache_dir=str(cache), cache_name=_fixed_name))
    assert (cache / "sub" / "my-shard.tar").read_bytes() == open(shard, "rb").read()
    list(cached_url_opener([url], cache_dir=str(cache), url_to_name=_fixed_name))
    assert runs(log) == 1


@pytest.mark.parametrize("name", ["", "/abs.tar", "a/../b.tar", ".hidden", "x.tar.lock", "a//b"])
def test_bad_cache_names_are_rejected(tmp_path, shard, name):
    with pytest.raises(ValueError, match="is not a relative path"):
        list(cached_tarfile_samples([f"pipe:cat {shard}"], cache_dir=str(tmp_path / "c"),
                                    cache_name=lambda url: name))


def test_local_files_are_not_cached(tmp_path, shard):
    cache = tmp_path / "cache"
    cached = list(cached_tarfile_samples([shard], cache_dir=str(cache)))
    # as webdataset's FileCache, the cache names a local file's path; url_opener does not
    assert all(s.pop("__local_path__") == shard for s in cached)
    assert cached == list(tarfile_samples([shard]))
    assert not cache.exists()
    assert islocal(shard) and islocal("file://" + shard) and islocal("-")
    assert not islocal("pipe:cat x") and not islocal("http://h/x.tar")
    samples = list(cached_tarfile_samples([shard], cache_dir=str(cache), always=True))
    assert all(s.pop("__local_path__") == shard for s in samples)  # still names the source
    assert samples == list(tarfile_samples([shard]))
    [name] = entries(cache)
    assert (cache / name).read_bytes() == open(shard, "rb").read()


def test_cache_dir_none_or_cache_size_zero_disables_caching(tmp_path, shard, log):
    url = logged(shard, log)
    for kw in (dict(cache_dir=None), dict(cache_dir=str(tmp_path / "c"), cache_size=0)):
        assert len(list(cached_tarfile_samples([url], **kw))) == NSAMPLES
    assert runs(log) == 2
    assert not (tmp_path / "c").exists()


def test_verbose_messages(tmp_path, shard, capsys, monkeypatch):
    cache = tmp_path / "cache"
    url = f"pipe:cat {shard}"
    list(cached_tarfile_samples([url], cache_dir=str(cache), verbose=True))
    list(cached_tarfile_samples([url], cache_dir=str(cache), verbose=True))
    err = capsys.readouterr().err
    assert f"[caching {url} at {cache}/." in err
    assert f"[done caching {cache}/" in err
    assert f"[opening cached {cache}/" in err
    list(cached_tarfile_samples([url], cache_dir=str(cache)))
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("GOPEN_VERBOSE", "1")  # webdataset's switch, read at each call
    list(cached_tarfile_samples([url], cache_dir=str(cache)))
    assert "[opening cached" in capsys.readouterr().err


def test_in_a_pipeline_and_pickled(tmp_path, shard, log):
    url = logged(shard, log)
    stage = pickle.loads(pickle.dumps(cached_tarfile_to_samples(cache_dir=str(tmp_path / "c"))))
    pipeline = DataPipeline(SimpleShardList([url]), stage)
    assert [len(list(pipeline)) for _ in range(3)] == [NSAMPLES] * 3
    assert runs(log) == 1
    assert pickle.loads(pickle.dumps(FileCache(str(tmp_path / "c")))).cache_dir == str(tmp_path / "c")


def test_get_file_fetches_whole(tmp_path, shard, log):
    cache = FileCache(str(tmp_path / "cache"))
    url = logged(shard, log)
    path = cache.get_file(url)
    assert open(path, "rb").read() == open(shard, "rb").read()
    assert cache.get_file(url) == path and runs(log) == 1
    assert cache.get_file(shard) == shard


def test_open_errors_go_to_the_handler(tmp_path, shard):
    urls = [f"pipe:cat {shard}", "nosuchscheme://x/y.tar", f"pipe:cat {shard}"]
    samples = list(cached_tarfile_samples(urls, handler=wdsmp.ignore_and_continue,
                                          cache_dir=str(tmp_path / "c")))
    assert len(samples) == 2 * NSAMPLES


def test_file_checks(tmp_path, shard):
    gz = make_shard(tmp_path / "s.tgz", n=2)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "html").write_bytes(b"<html>" * 200)
    assert get_filetype(shard) == "POSIX tar archive"
    assert get_filetype(gz) == "gzip compressed data"
    assert get_filetype(tmp_path / "empty") == "empty"
    assert get_filetype(tmp_path / "html") == "data"
    assert check_tar_format(shard) and check_tar_format(gz)
    assert not check_tar_format(tmp_path / "html") and not check_tar_format(tmp_path / "empty")


def test_webdataset_naming_helpers():
    assert pipe_cleaner("pipe:curl -L -s http://h/a/b.tar || true") == "http://h/a/b.tar"
    assert pipe_cleaner("pipe:cat /x/b.tar") == "cat /x/b.tar"
    assert pipe_cleaner("s3://b/k.tar") == "s3://b/k.tar"
    assert url_to_cache_name("http://h/a/b/c.tar") == "c.tar"
    assert url_to_cache_name("http://h/a/b/c.tar", ndir=1) == "b/c.tar"
    assert url_to_cache_name("pipe:cat /x/b.tar") == "pipe%3Acat%20%2Fx%2Fb.tar"
    with pytest.raises(TypeError, match="needs a URL string"):  # webdataset: an assert
        url_to_cache_name(123)


def test_http_second_pass_makes_no_request(tmp_path, shard, http_server):
    url = http_server.put_file("data/shard-000000.tar", open(shard, "rb").read())
    cache = tmp_path / "cache"
    expected = list(tarfile_samples([url]))
    assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    before = len(http_server.requests("data/shard-000000.tar"))
    assert before >= 1
    assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == expected
    assert len(http_server.requests("data/shard-000000.tar")) == before
    [name] = entries(cache)
    assert name.endswith("-shard-000000.tar")


def test_download_is_whole_or_absent(tmp_path, shard):
    dest = tmp_path / "out" / "copy.tar"
    dest.parent.mkdir()
    download(f"pipe:cat {shard}", str(dest))
    assert dest.read_bytes() == open(shard, "rb").read()
    with pytest.raises(PipeError):
        download(f"pipe:head -c 1000 {shard}; exit 3", str(tmp_path / "out" / "bad.tar"))
    assert os.listdir(tmp_path / "out") == ["copy.tar"]


def test_download_write_failure_names_the_url(tmp_path, shard):
    url = f"pipe:cat {shard}"
    with pytest.raises(ShardError, match="cannot download to .*copy.tar.*No such file") as caught:
        download(url, str(tmp_path / "missing" / "copy.tar"))
    assert caught.value.url == url and isinstance(caught.value, OSError)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


@pytest.mark.parametrize("kw, match", [
    (dict(lock_timeout=float("nan")), "lock_timeout must be a non-negative number"),
    (dict(lock_timeout=-1), "lock_timeout must be a non-negative number"),
    (dict(cache_size=float("nan")), "cache_size must be a number of bytes"),
])
def test_bad_settings_are_rejected(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        FileCache(str(tmp_path / "cache"), **kw)


@pytest.mark.parametrize("value", ["-1", "-5e9", "nan"])
def test_a_negative_wds_cache_size_is_rejected(tmp_path, monkeypatch, value):
    # FileCache takes a negative cache_size as "WDS_CACHE_SIZE": the variable has no such way out.
    monkeypatch.setenv("WDS_CACHE_SIZE", value)
    with pytest.raises(ValueError, match=rf"WDS_CACHE_SIZE={value!r} must be a number of bytes >= 0"):
        FileCache(str(tmp_path / "cache"))


def test_lru_cleanup_class_runs_at_most_once_per_interval(tmp_path):
    cache = tmp_path / "cache"
    shard = make_shard(tmp_path / "small.tar", n=1, size=1000)
    _cache_as(cache, f"pipe:cat {shard}", "a")
    cleaner = LRUCleanup(str(cache), 500, interval=3600)
    cleaner.cleanup()
    assert entries(cache) == []
    _cache_as(cache, f"pipe:cat {shard} ", "b")
    cleaner.cleanup()  # too soon
    assert entries(cache) == ["b"]


def test_same_url_twice_in_one_process_does_not_wait_for_itself(tmp_path, shard, log):
    cache = tmp_path / "cache"
    url = logged(shard, log)
    outer = cached_tarfile_samples([url], cache_dir=str(cache))
    first = next(outer)  # this process is fetching url
    start = time.monotonic()
    inner = list(cached_tarfile_samples([url], cache_dir=str(cache)))
    assert time.monotonic() - start < 5  # read uncached at once, not after lock_timeout
    assert [first, *outer] == inner
    assert runs(log) == 2 and len(entries(cache)) == 1
    assert list(cached_tarfile_samples([url], cache_dir=str(cache))) == inner
    assert runs(log) == 2
