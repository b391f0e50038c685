"""The plain shard sources (SimpleShardList, ResampledShards), shardspec, and the shard-list
helpers webdataset keeps in tariterators; the rest of wdsmp.shardlists has its own tests
(test_shardurls, test_shardstages, test_multishard, test_directoryshards)."""

import pickle
import random

import pytest

import wdsmp.tariterators
from wdsmp.shardlists import MultiShardSample, ResampledShards, SimpleShardList, expand_urls, shardspec


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """No rank or worker from the environment unless a test sets one."""
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)


# -- SimpleShardList


def test_simple_shard_list_in_order():
    shards = SimpleShardList("s-{0..4}.tar")
    assert len(shards) == 5
    assert list(shards) == [{"url": f"s-{i}.tar"} for i in range(5)]
    assert list(shards) == list(shards)


def test_simple_shard_list_seeded_shuffle():
    spec = "s-{00..29}.tar"
    one = [s["url"] for s in SimpleShardList(spec, seed=1)]
    assert one == [s["url"] for s in SimpleShardList(spec, seed=1)]
    assert one == [s["url"] for s in pickle.loads(pickle.dumps(SimpleShardList(spec, seed=1)))]
    assert sorted(one) == expand_urls(spec)
    assert one != expand_urls(spec)
    assert one != [s["url"] for s in SimpleShardList(spec, seed=2)]


def test_simple_shard_list_empty():
    with pytest.raises(ValueError, match="no shards"):
        SimpleShardList([])


# -- ResampledShards


def draws(shards, n=50):
    return [s["url"] for s in shards][:n]


def test_resampled_deterministic_per_seed_and_epoch():
    spec = "s-{00..19}.tar"
    a = ResampledShards(spec, nshards=50, seed=7, deterministic=True)
    b = ResampledShards(spec, nshards=50, seed=7, deterministic=True)
    a0, b0 = draws(a), draws(b)
    assert a0 == b0 and len(a0) == 50 and set(a0) <= set(expand_urls(spec))
    a1, b1 = draws(a), draws(b)
    assert a1 == b1 and a1 != a0  # a new epoch draws differently
    a.set_epoch(0)
    assert draws(a) == a0 and a.epoch == 0
    assert draws(a) == a1 and a.epoch == 1
    other = ResampledShards(spec, nshards=50, seed=8, deterministic=True)
    assert draws(other) != a0
    copied = pickle.loads(pickle.dumps(ResampledShards(spec, nshards=50, seed=7, deterministic=True)))
    assert draws(copied) == a0


def test_resampled_depends_on_rank(monkeypatch):
    spec = "s-{00..19}.tar"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank0 = draws(ResampledShards(spec, nshards=50, deterministic=True))
    monkeypatch.setenv("RANK", "1")
    assert draws(ResampledShards(spec, nshards=50, deterministic=True)) != rank0


def test_resampled_nondeterministic_and_bad_args():
    spec = "s-{00..19}.tar"
    assert draws(ResampledShards(spec, nshards=100)) != draws(ResampledShards(spec, nshards=100))
    assert len(draws(ResampledShards(spec, nshards=3), n=10)) == 3
    with pytest.raises(ValueError, match="no shards"):
        ResampledShards([])
    assert list(ResampledShards([], empty_check=False)) == []
    with pytest.raises(ValueError, match="nshards"):
        ResampledShards(spec, nshards=-1)


# -- shardspec


def test_shardspec(tmp_path):
    for name in ("spec.yaml", "spec.yml"):
        (tmp_path / name).write_text("datasets:\n  - shards: a-{0..1}.tar\n")
        assert isinstance(shardspec(str(tmp_path / name)), MultiShardSample)
    plain = shardspec("a-{0..2}.tar")
    assert isinstance(plain, SimpleShardList) and len(plain) == 3


# -- tariterators.shardlist and trace (webdataset keeps these shard-list helpers there)


def test_tariterators_shardlist(monkeypatch):
    shardlist = wdsmp.tariterators.shardlist
    assert list(shardlist("a-{0..2}.tar")) == [{"url": "a-0.tar"}, {"url": "a-1.tar"}, {"url": "a-2.tar"}]
    assert list(shardlist(["x", "y"])) == [{"url": "x"}, {"url": "y"}]
    random.seed(1)
    shuffled = [s["url"] for s in shardlist("u-{0..19}", shuffle=True)]
    random.seed(1)
    assert [s["url"] for s in shardlist("u-{0..19}", shuffle=True)] == shuffled  # random.seed fixes it
    assert sorted(shuffled) == sorted(f"u-{i}" for i in range(20)) and shuffled != sorted(shuffled)


def test_tariterators_trace_prints_members(monkeypatch, capsys):
    members = [{"fname": "k1.txt", "data": b"a", "__url__": "u"}, {"fname": "k1.cls", "data": b"1", "__url__": "u"}]
    assert wdsmp.tariterators.trace is False
    list(wdsmp.tariterators.group_by_keys(iter(members)))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(wdsmp.tariterators, "trace", True)
    samples = list(wdsmp.tariterators.group_by_keys(iter(members)))
    assert samples == [{"__key__": "k1", "__url__": "u", "txt": b"a", "cls": b"1"}]
    err = capsys.readouterr().err
    assert "'k1' 'txt'" in err and "'k1' 'cls'" in err
