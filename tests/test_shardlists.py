"""Shard specs, shard sources and splitters: braces, globs, seeds, nodes and workers."""

import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch.utils.data

import wdsmp.utils
from wdsmp.pipeline import DataPipeline
from wdsmp.shardlists import (
    ResampledShards,
    SimpleShardList,
    expand_urls,
    non_empty,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from wdsmp.utils import make_seed, pytorch_worker_info, repeatedly


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """No rank or worker from the environment unless a test sets one."""
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def url_with_worker(src):
    """Stage (module level, so it pickles): the URL and the worker that saw it."""
    worker = torch.utils.data.get_worker_info().id
    for sample in src:
        yield sample["url"], worker


# -- expand_urls


def test_braces():
    assert expand_urls("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert expand_urls("pipe:curl -s http://h/x-{0,1}.tar") == [
        "pipe:curl -s http://h/x-0.tar", "pipe:curl -s http://h/x-1.tar"]


def test_double_colon_lists():
    assert expand_urls("a{0..1}.tar::b{2..3}.tar::c.tar") == [
        "a0.tar", "a1.tar", "b2.tar", "b3.tar", "c.tar"]
    assert expand_urls("http://[::1]:8080/x{0,1}.tar") == [
        "http://[::1]:8080/x0.tar", "http://[::1]:8080/x1.tar"]


def test_list_elements_are_brace_expanded_not_split():
    assert expand_urls(["x{1,2}.tar", "y.tar"]) == ["x1.tar", "x2.tar", "y.tar"]
    assert expand_urls(("a::b",)) == ["a::b"]


def test_unbalanced_braces_and_bad_types():
    with pytest.raises(ValueError, match="unbalanced braces"):
        expand_urls("a{0..1.tar")
    with pytest.raises(TypeError, match="must be strings"):
        expand_urls([1, 2])


def test_wds_variables(monkeypatch):
    monkeypatch.setenv("WDS_BUCKET", "/data/b")
    assert expand_urls("${BUCKET}/s-{0,1}.tar") == ["/data/b/s-0.tar", "/data/b/s-1.tar"]
    monkeypatch.delenv("WDS_BUCKET")
    with pytest.raises(ValueError, match="WDS_BUCKET is not set"):
        expand_urls("${BUCKET}/s.tar")


def test_globs(tmp_path):
    for name in ["b.tar", "a.tar", "c.tgz", "x[1].tar"]:
        (tmp_path / name).write_bytes(b"")
    assert expand_urls(str(tmp_path / "*.tar")) == [
        str(tmp_path / n) for n in ["a.tar", "b.tar", "x[1].tar"]]
    assert expand_urls([str(tmp_path / "?.tgz")]) == [str(tmp_path / "c.tgz")]
    # an existing file whose name looks like a pattern is itself
    assert expand_urls([str(tmp_path / "x[1].tar")]) == [str(tmp_path / "x[1].tar")]
    # braces first, then each result globbed
    assert expand_urls(str(tmp_path / "{a,c}.t*")) == [
        str(tmp_path / "a.tar"), str(tmp_path / "c.tgz")]


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(ValueError, match="matches no files"):
        expand_urls(str(tmp_path / "*.nothing"))


def test_no_glob_with_a_scheme_or_escaped_brace():
    assert expand_urls("pipe:cat /no/such/*.tar") == ["pipe:cat /no/such/*.tar"]
    assert expand_urls("http://h/a?b=*") == ["http://h/a?b=*"]
    assert expand_urls(r"/no/such/\{x\}*.tar") == ["/no/such/{x}*.tar"]


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


# -- make_seed, pytorch_worker_info, repeatedly


def test_make_seed_is_stable_across_processes():
    code = "import wdsmp.utils as u; print(u.make_seed('shard', 3, b'x', 1.5, (1, 'a')))"
    outputs = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        outputs.add(int(out))
    assert outputs == {make_seed("shard", 3, b"x", 1.5, (1, "a"))}
    assert 0 <= make_seed("shard") < 2**31
    assert make_seed(1, 2) != make_seed(2, 1) and make_seed("1") != make_seed(1)
    with pytest.raises(TypeError, match="cannot hash"):
        make_seed(object())


def test_worker_info_from_environment(monkeypatch):
    assert pytorch_worker_info() == (0, 1, 0, 1)
    assert wdsmp.utils.pytorch_worker_seed() == 0
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "3")
    assert pytorch_worker_info() == (2, 4, 1, 3)
    assert wdsmp.utils.pytorch_worker_seed() == 2001
    monkeypatch.setenv("RANK", "four")
    with pytest.raises(ValueError, match="RANK='four' is not an integer"):
        pytorch_worker_info()
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="0 <= RANK < WORLD_SIZE"):
        pytorch_worker_info()


def test_repeatedly():
    assert list(repeatedly([1, 2, 3], nepochs=2)) == [1, 2, 3, 1, 2, 3]
    assert list(repeatedly([1, 2, 3], nbatches=5)) == [1, 2, 3, 1, 2]
    assert list(repeatedly(iter([1, 2]))) == [1, 2]  # an exhausted iterator ends it
    batches = [([1, 2],), ([3, 4],), ([5, 6],)]
    assert list(repeatedly(batches, nsamples=3)) == batches[:2]


# -- splitters


def test_split_by_node(monkeypatch):
    items = list(range(10))
    assert list(split_by_node(iter(items))) == items
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        assert list(split_by_node(iter(items))) == items[rank::3]


def test_split_by_node_warns_when_a_node_gets_nothing(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.warns(UserWarning, match="node 3 of 4 received no shards: there were only 2"):
        assert list(split_by_node(iter(["a", "b"]))) == []


def test_split_by_worker_from_environment(monkeypatch):
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "2")
    assert list(split_by_worker(iter("abcde"))) == ["b", "d"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(split_by_worker(iter("ab"))) == ["b"]
    with pytest.warns(UserWarning, match="worker 1 of 2 received no shards: there were only 1"):
        assert list(split_by_worker(iter("a"))) == []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_split_by_worker_in_dataloader(context):
    urls = [f"s-{i}.tar" for i in range(7)]
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, url_with_worker)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         multiprocessing_context=context)
    seen = list(loader)
    assert sorted(url for url, _ in seen) == sorted(urls)
    for worker in range(2):
        assert [url for url, w in seen if w == worker] == urls[worker::2]


def test_single_node_only(monkeypatch):
    assert list(single_node_only(iter([1, 2]))) == [1, 2]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="running on 2 nodes"):
        list(single_node_only(iter([1, 2])))


def test_non_empty():
    assert list(non_empty(iter([1]))) == [1]
    with pytest.raises(ValueError, match="no shards"):
        list(non_empty(iter([])))


def test_worker_info_prefers_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        assert pytorch_worker_info() == (0, 1, 0, 1)
    finally:
        dist.destroy_process_group()
    assert pytorch_worker_info() == (1, 3, 0, 1)
