"""Sample counts without an index written by hand: local shards count themselves (by the reader's
rules, kept in a cache), remote ones find the index beside them, and what stays unknown is refused
with the command that writes an index."""

import gzip
import json
import multiprocessing
import os
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsmp as wds
from wdsmp.errors import ShardError, TarFormatError
from wdsmp.epochs.counts import CountCache, count_local_shard, count_local_shards, known_counts
from wdsmp.shards.index import write_index
from wdsmp.tariterators import tarfile_samples

from .conftest import tar_bytes

SIZES = (10, 50, 23, 37, 8)


def _shard(path, n, prefix="k"):
    with wds.TarWriter(str(path)) as sink:
        for i in range(n):
            sink.write({"__key__": f"{prefix}{i:04d}", "jpg": b"\xff\xd8" + os.urandom(64), "cls": str(i).encode()})
    return str(path)


def _shards(directory, sizes=SIZES):
    directory.mkdir(exist_ok=True)
    return [_shard(directory / f"train-{s:06d}.tar", n, f"s{s}-") for s, n in enumerate(sizes)]


# -- the reader's rules, on names alone


NAMES = st.lists(st.sampled_from(["a.jpg", "a.JPG", "a.cls", "b.jpg", "b.cls", "d/a.jpg", "d/b.x.y", "c",
                                  "__meta__", "__meta__/x.txt", "x.__key__", ".hidden", "a.b/c.jpg"]),
                 max_size=12)


@settings(max_examples=150, deadline=None)
@given(NAMES, st.integers(min_value=-1, max_value=12))
def test_the_count_is_what_the_reader_yields(tmp_path_factory, names, cut):
    """On any member names, damaged archives included: what tarfile_samples yields when its handler
    goes on (it drops the samples group_by_keys refuses and the one a damage cuts)."""
    path = tmp_path_factory.mktemp("names") / "s.tar"
    data = tar_bytes([(name, b"x" * 700) for name in names])
    if 0 <= cut < len(names):
        data = data[:cut * 2048 + 700]  # inside member `cut`'s data (GNU headers: at most 3 blocks each)
    path.write_bytes(data)
    read = list(tarfile_samples([str(path)], handler=wds.ignore_and_continue))
    assert count_local_shard(str(path), handler=wds.ignore_and_continue) == len(read)


def test_a_gzip_shard_counts_as_its_tar(tmp_path):
    plain = _shard(tmp_path / "a.tar", 17)
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(open(plain, "rb").read()))
    assert count_local_shard(plain) == count_local_shard(str(tmp_path / "a.tar.gz")) == 17


def test_a_damaged_shard_raises_unless_the_handler_goes_on(tmp_path, impl):
    data = open(_shard(tmp_path / "a.tar", 5), "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(TarFormatError, match="truncated tar archive") as info:
        count_local_shard(str(cut), "cut.tar")
    assert info.value.url == "cut.tar"
    assert count_local_shard(str(cut), handler=wds.ignore_and_continue) == len(
        list(tarfile_samples([str(cut)], handler=wds.ignore_and_continue)))
    # a damaged shard's count is not kept: it is counted (and reported) again next time
    assert count_local_shards([str(cut)], str(tmp_path / "counts"), wds.ignore_and_continue)
    assert CountCache(str(tmp_path / "counts")).lookup({str(cut): os.stat(cut)}) == {}


# -- the cache


def test_counts_are_kept_and_refreshed_when_a_shard_changes(tmp_path):
    urls = _shards(tmp_path / "data")
    cache = tmp_path / "cache"
    assert count_local_shards(urls, str(cache)) == dict(zip(urls, SIZES))
    (kept,) = cache.iterdir()
    assert kept.name.startswith(".shardcounts-")  # a dot file: the shard cache leaves it alone
    entries = json.loads(kept.read_text())
    assert entries["directory"] == str(tmp_path / "data")
    # what is kept is what is served: a count planted there comes back while the file is unchanged ...
    planted = entries["shards"]["train-000001.tar"]
    planted["samples"] = 49
    kept.write_text(json.dumps(entries))
    assert count_local_shards(urls, str(cache))[urls[1]] == 50  # ... unless the spans kept with it disagree
    del planted["spans"]
    kept.write_text(json.dumps(entries))
    assert count_local_shards(urls, str(cache))[urls[1]] == 49
    # ... and a rewritten shard (another size or mtime) is counted again
    _shard(urls[1], 51, "new-")
    assert count_local_shards(urls, str(cache))[urls[1]] == 51
    assert json.loads(kept.read_text())["shards"]["train-000001.tar"]["samples"] == 51
    assert (cache.stat().st_mode & 0o777) == 0o700  # made private


def test_a_shard_rewritten_at_the_same_size_with_its_mtime_put_back_is_counted_again(tmp_path):
    """tar pads to 10,240-byte records: 3 and 4 small samples make files of one size; ``cp -p``,
    ``rsync -t`` and ``tar x`` put the mtime back. The inode or the ctime still tell."""
    (tmp_path / "data").mkdir()
    url = _shard(tmp_path / "data" / "x.tar", 3)
    cache = str(tmp_path / "cache")
    assert count_local_shards([url], cache) == {url: 3}
    before = os.stat(url)
    rewritten = _shard(tmp_path / "x.tar", 4)
    assert os.stat(rewritten).st_size == before.st_size
    os.replace(rewritten, url)  # a new file (inode) in its place, as cp -p or tar x leave
    os.utime(url, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert count_local_shards([url], cache) == {url: 4}
    with open(url, "r+b") as stream:  # rewritten in place: the same inode, but a new ctime
        stream.write(open(_shard(tmp_path / "y.tar", 3), "rb").read())
    os.utime(url, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert count_local_shards([url], cache) == {url: 3}


@pytest.mark.parametrize("planted", [0, -5, 2.5, "7", True, None, 10**15, [1], {"samples": 3}])
def test_a_planted_or_broken_count_is_counted_again(tmp_path, planted):
    """An entry no file of that size could have (or of another type) is never served: a count of 0
    dropped the shard from every epoch, 1e15 made an endless padded one, and the others blamed
    the shard."""
    urls = _shards(tmp_path / "data", (5,))
    cache = tmp_path / "cache"
    count_local_shards(urls, str(cache))
    (kept,) = cache.iterdir()
    entries = json.loads(kept.read_text())
    entries["shards"]["train-000000.tar"]["samples"] = planted
    kept.write_text(json.dumps(entries))
    assert count_local_shards(urls, str(cache)) == {urls[0]: 5}


def test_a_cache_file_nested_too_deep_or_not_this_users_is_ignored(tmp_path):
    urls = _shards(tmp_path / "data", (5,))
    cache = tmp_path / "cache"
    count_local_shards(urls, str(cache))
    (kept,) = cache.iterdir()
    good = kept.read_text()
    kept.write_text("[" * 100_000 + "]" * 100_000)  # RecursionError in json, not a ValueError
    assert count_local_shards(urls, str(cache)) == {urls[0]: 5}
    if os.getuid() != 0:
        pytest.skip("giving the file to another user needs root")
    entries = json.loads(good)
    entries["shards"]["train-000000.tar"]["samples"] = 3
    kept.write_text(json.dumps(entries))
    os.chown(kept, 12345, 12345)  # another user's file at the name this user's cache would have
    assert count_local_shards(urls, str(cache)) == {urls[0]: 5}


def test_the_default_place_is_the_users_cache_directory(tmp_path, monkeypatch):
    urls = _shards(tmp_path / "data", (3,))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert count_local_shards(urls) == {urls[0]: 3}
    assert [p.name[:13] for p in (tmp_path / "xdg" / "wdsmp").iterdir()] == [".shardcounts-"]


def _count_some(urls, cache, start):
    count_local_shards(urls, cache)
    start.wait(30)
    for _ in range(20):
        count_local_shards(urls, cache)


@pytest.mark.processes
def test_processes_counting_at_once_keep_the_cache_valid(tmp_path):
    urls = _shards(tmp_path / "data", (3, 4, 5, 6))
    cache = str(tmp_path / "cache")
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=_count_some, args=(urls[i::2], cache, start)) for i in range(2)]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    (kept,) = [p for p in os.scandir(cache)]  # no temp left behind
    shards = json.loads(open(kept.path).read())["shards"]
    assert {name: entry["samples"] for name, entry in shards.items()} == dict(
        (os.path.basename(u), n) for u, n in zip(urls, (3, 4, 5, 6)) if os.path.basename(u) in shards)
    assert count_local_shards(urls, cache) == dict(zip(urls, (3, 4, 5, 6)))


# -- what the loaders get


def test_local_shards_count_themselves_and_a_missing_one_is_named(tmp_path):
    urls = _shards(tmp_path / "data")
    spec = str(tmp_path / "data" / "train-{000000..000004}.tar")
    assert known_counts(spec, required_by="test") == tuple(zip(urls, SIZES))
    assert known_counts([(urls[0], 7)] + urls[1:]) == ((urls[0], 7),) + tuple(zip(urls[1:], SIZES[1:]))
    os.remove(urls[4])
    with pytest.raises(ShardError, match=r"no such file \(shard '.*train-000004.tar'\)"):
        known_counts(spec)
    with pytest.raises(ShardError, match="train-000004.tar"):
        known_counts(list(zip(urls, SIZES)))  # even with its count given


def _upload(http_server, urls, index=True):
    for url in urls:
        http_server.put_file(f"train/{os.path.basename(url)}", open(url, "rb").read())
    remote = [http_server.url(f"train/{os.path.basename(url)}") for url in urls]
    if index:
        write_index(http_server.url("train/index.json"), [(os.path.basename(u), n) for u, n in zip(urls, SIZES)])
    return remote


def test_remote_shards_find_the_index_beside_them(tmp_path, http_server):
    remote = _upload(http_server, _shards(tmp_path / "data"))
    assert known_counts(remote, required_by="test") == tuple(zip(remote, SIZES))
    assert len(http_server.requests("train/index.json", "GET")) == 1  # one look per directory


def test_remote_shards_without_an_index_are_refused_with_the_command(tmp_path, http_server):
    remote = _upload(http_server, _shards(tmp_path / "data"), index=False)
    spec = http_server.url("train/train-{000000..000004}.tar")
    assert known_counts(spec) == tuple((url, None) for url in remote)  # nobody needs them: unknown
    with pytest.raises(ValueError) as info:
        known_counts(spec, required_by="FastLoader on 2 ranks", otherwise="pass exact=False")
    message = str(info.value)
    assert message.startswith("FastLoader on 2 ranks needs the sample count of every shard")
    assert f"no shard index beside them ({http_server.url('train/index.json')}: GET failed: HTTP 404" in message
    assert f"wdsmp index -o index.json '{spec}'" in message
    assert f"put index.json beside the shards as {http_server.url('train/index.json')}" in message
    assert message.endswith("or pass exact=False")


def test_tar_members_of_every_format_count(tmp_path, impl):
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"long-{fmt}.tar"
        names = [f"{'d' * 120}/{'k' * 110}{i}.{ext}" for i in range(3) for ext in ("jpg", "cls")]
        path.write_bytes(tar_bytes([(name, b"v") for name in names], format=fmt))
        assert count_local_shard(str(path)) == 3 == len(list(tarfile_samples([str(path)])))


def test_gzip_shards_count_from_their_headers_in_bounded_memory(tmp_path, impl):
    """Two .tar.gz shards of a few hundred KB, each a 320 MiB member of zeros and two labels:
    counted at once from their headers, the data decompressed and dropped as it goes by, in a
    process whose memory could not hold one member."""
    from .bombs import gzip_of_zeros, run_limited

    size = 20 << 24
    info = tarfile.TarInfo("a.bin")
    info.size = size
    packed = gzip_of_zeros(info.tobuf(format=tarfile.GNU_FORMAT), size,
                           tar_bytes([("a.cls", b"1"), ("b.cls", b"2")]), crc=True)
    paths = [str(tmp_path / f"big-{i}.tar.gz") for i in range(2)]
    for path in paths:
        with open(path, "wb") as stream:
            stream.write(packed)
    status, out = run_limited(f"""
        from wdsmp.epochs.counts import count_local_shards
        print(sorted(count_local_shards({paths!r}, {str(tmp_path / "counts")!r}).values()))
        """, headroom=256 << 20, timeout=60)
    assert status == 0, out
    assert out.strip() == "[2, 2]", out


def test_a_cut_gzip_shard_counts_what_the_reader_yields(tmp_path, impl):
    data = open(_shard(tmp_path / "a.tar", 40), "rb").read()
    packed = gzip.compress(data, mtime=0)
    for cut in (len(packed) // 3, len(packed) // 2, len(packed) - 9):
        path = tmp_path / f"cut-{cut}.tar.gz"
        path.write_bytes(packed[:cut])
        read = list(tarfile_samples([str(path)], handler=wds.ignore_and_continue))
        assert count_local_shard(str(path), handler=wds.ignore_and_continue) == len(read), cut
        with pytest.raises(TarFormatError, match="corrupt gzip stream"):
            count_local_shard(str(path))
