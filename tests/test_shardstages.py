"""Stages over the shard stream: node and worker splitters, non_empty, resampled."""

import pickle
import warnings

import pytest
import torch.utils.data

from wdsmp.pipeline import DataPipeline
from wdsmp.shardlists import (
    SimpleShardList,
    non_empty,
    resampled,
    resampled_,
    single_node_only,
    split_by_node,
    split_by_worker,
)


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


def test_resampled_stage():
    items = list(range(10))
    first = list(resampled_(iter(items), n=50, seed=3))
    assert len(first) == 50 and set(first) <= set(items)
    assert list(resampled_(iter(items), n=50, seed=3)) == first  # the same seed, the same draws
    stage = pickle.loads(pickle.dumps(resampled(n=5, seed=1)))  # curried, so it pickles
    assert list(stage(iter(items))) == list(resampled_(iter(items), n=5, seed=1))
    assert len(list(DataPipeline(range(10), resampled(n=7)))) == 7
    assert list(resampled_(iter([]), n=0)) == []
    with pytest.raises(ValueError, match="yielded nothing"):
        list(resampled_(iter([]), n=3))
    with pytest.raises(ValueError, match="non-negative int"):
        list(resampled_(iter(items), n=-1))
