"""DataPipeline on real tar shards, in this process and in DataLoader workers (fork and spawn)."""

import functools
import pickle
import time
import warnings

import pytest
import torch.utils.data

import wdsmp
import wdsmp.utils
from wdsmp.pipeline import DataPipeline, add_length_method
from wdsmp.shardlists import ResampledShards, SimpleShardList, split_by_worker
from wdsmp.tariterators import tarfile_to_samples

from .conftest import write_tar


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def make_shards(tmp_path, nshards, per_shard):
    """Shards ``s{i}.tar`` holding samples ``s{i}_{j}`` with a ``txt`` and a ``cls`` field."""
    urls = []
    for i in range(nshards):
        members = []
        for j in range(per_shard):
            members.append((f"s{i}_{j:03d}.txt", f"text {i} {j}".encode()))
            members.append((f"s{i}_{j:03d}.cls", str(i * 1000 + j).encode()))
        urls.append(write_tar(tmp_path / f"s{i}.tar", members))
    return urls


def all_keys(nshards, per_shard):
    return [f"s{i}_{j:03d}" for i in range(nshards) for j in range(per_shard)]


# Stages at module level: spawned workers import them from tests.test_pipeline.


def keys(src):
    for sample in src:
        yield sample["__key__"]


def add_suffix(src, suffix):
    for item in src:
        yield item + suffix


def count_up(n):
    return iter(range(n))


class Sized:
    """A plain object for add_length_method: it has the ``size`` the added ``__len__`` reports."""

    def __init__(self, size):
        self.size = size


class Recorder:
    """A stage with ``set_epoch`` and ``close``, to see what the pipeline forwards."""

    def __init__(self):
        self.epochs = []
        self.closed = 0

    def __call__(self, src):
        return src

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def close(self):
        self.closed += 1


# -- building and running


def test_tar_shards_to_samples(tmp_path):
    urls = make_shards(tmp_path, 3, 4)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples())
    samples = list(dataset)
    assert [s["__key__"] for s in samples] == all_keys(3, 4)
    assert samples[5]["txt"] == b"text 1 1" and samples[5]["cls"] == b"1001"
    assert samples[5]["__url__"] == urls[1]
    assert [s["__key__"] for s in dataset] == all_keys(3, 4)  # a second pass starts over


def test_stage_kinds(tmp_path):
    urls = make_shards(tmp_path, 2, 2)
    dataset = DataPipeline(SimpleShardList(urls), [tarfile_to_samples(), keys],
                           None, functools.partial(add_suffix, suffix="!"))
    assert list(dataset) == [k + "!" for k in all_keys(2, 2)]
    assert len(dataset.pipeline) == 4 and dataset.stage(2) is keys
    assert list(DataPipeline(functools.partial(count_up, 3))) == [0, 1, 2]
    assert list(DataPipeline([[1, 2, 3]], [])) == [1, 2, 3]  # lists flatten one level
    assert list(DataPipeline(range(3), functools.partial(add_suffix, suffix=1))) == [1, 2, 3]


def test_bad_stages():
    with pytest.raises(ValueError, match="stage 0 .* is not a source"):
        DataPipeline(42)
    with pytest.raises(ValueError, match="stage 1 .* is not callable"):
        DataPipeline(range(3), range(4))
    with pytest.raises(ValueError, match="no stages"):
        list(DataPipeline())


def test_append_and_compose(tmp_path):
    urls = make_shards(tmp_path, 2, 3)
    base = DataPipeline(SimpleShardList(urls), tarfile_to_samples())
    composed = base.compose(keys)
    assert len(base.pipeline) == 2 and len(composed.pipeline) == 3
    assert list(composed) == all_keys(2, 3)
    base.append(keys)
    assert list(base) == all_keys(2, 3)


# -- lengths, epochs, repeats


def test_with_length_pickles(tmp_path):
    urls = make_shards(tmp_path, 2, 3)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys)
    assert not hasattr(dataset, "__len__")  # as in webdataset: code and DataLoader test for it
    with pytest.raises(TypeError, match="has no len"):
        len(dataset)
    assert bool(dataset) and len(list(dataset)) == 6
    with pytest.warns(UserWarning, match="does not change the number of samples"):
        assert dataset.with_length(4) is dataset
    assert len(dataset) == 4 and isinstance(dataset, DataPipeline)
    copy = pickle.loads(pickle.dumps(dataset))
    assert type(copy) is type(dataset) and len(copy) == 4
    assert list(copy) == all_keys(2, 3)  # the length is only what len() says
    assert len(dataset.compose(keys)) == 4  # a composed copy keeps it
    assert not hasattr(DataPipeline(SimpleShardList(urls)).compose(keys), "__len__")
    assert len(torch.utils.data.DataLoader(dataset, batch_size=None)) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(DataPipeline(range(3)).with_length(7, silent=True)) == 7
    with pytest.raises(ValueError, match="non-negative"):
        dataset.with_length(-1, silent=True)


def test_with_length_is_the_size_attribute(tmp_path):
    # as in webdataset, with_length(n) sets .size, which __len__ reads
    dataset = DataPipeline(SimpleShardList(make_shards(tmp_path, 1, 2)), tarfile_to_samples())
    dataset.with_length(3, silent=True)
    assert dataset.size == 3
    dataset.size = 5
    assert len(dataset) == 5 and len(add_length_method(dataset)) == 5


def test_with_epoch_starts_each_epoch_afresh(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    expected = all_keys(2, 5)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys).with_epoch(4)
    assert [list(dataset) for _ in range(3)] == [expected[0:4]] * 3  # as webdataset
    assert list(dataset.with_epoch(nbatches=12)) == expected + expected[0:2]  # passes repeat
    assert list(dataset.with_epoch(12)) == expected + expected[0:2]
    assert not hasattr(dataset, "__len__")


def test_with_epoch_continuous_continues_across_epochs(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    expected = all_keys(2, 5)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys).with_epoch(4, continuous=True)
    epochs = [list(dataset) for _ in range(3)]
    assert epochs == [expected[0:4], expected[4:8], expected[8:10] + expected[0:2]]
    # a pickled copy starts its own iterator from the beginning
    assert list(pickle.loads(pickle.dumps(dataset))) == expected[0:4]
    assert list(dataset.with_epoch(nbatches=12, continuous=True)) == expected + expected[0:2]  # restarts
    assert list(dataset) == expected[2:10] + expected[0:4]
    dataset.close()
    assert list(dataset) == expected + expected[0:2]


def test_with_epoch_on_empty_data_ends():
    assert list(DataPipeline(range(0)).with_epoch(5)) == []
    assert list(DataPipeline(range(0)).with_epoch(5, continuous=True)) == []


def test_repeat(tmp_path):
    urls = make_shards(tmp_path, 2, 3)
    expected = all_keys(2, 3)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys)
    assert list(dataset.repeat(2)) == expected * 2
    assert list(dataset.repeat(nepochs=3, nbatches=8)) == (expected * 2)[:8]
    assert list(dataset.repeat(nbatches=13)) == (expected * 3)[:13]
    assert list(dataset.repeat(1, 4)) == expected[:4]
    assert list(dataset) == expected[:4]
    dataset.repeat(nbatches=13)
    assert list(dataset) == (expected * 3)[:13]  # each call starts afresh
    assert list(DataPipeline(range(0)).repeat()) == []  # an empty pass ends the repetition


def test_set_epoch_and_close_reach_stages(tmp_path):
    recorder = Recorder()
    shards = ResampledShards([f"s{i}" for i in range(10)], nshards=20, deterministic=True)
    dataset = DataPipeline(shards, recorder).with_epoch(5, continuous=True)
    first = list(dataset)
    dataset.set_epoch(3)
    assert recorder.epochs == [3] and shards._next_epoch == 3
    epoch3 = list(dataset)
    assert shards.epoch == 3 and epoch3 != first
    dataset.set_epoch(3)
    assert list(dataset) == epoch3  # set_epoch restarts the kept iterator
    dataset.close()
    dataset.close()
    assert recorder.closed == 2


def test_add_length_method_on_a_pipeline(tmp_path):
    urls = make_shards(tmp_path, 2, 3)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys)
    dataset.size = 11
    assert add_length_method(dataset) is dataset
    assert add_length_method(dataset) is dataset  # a second call adds no second layer
    assert type(dataset).__name__ == "DataPipeline_Length" and type(dataset).__bases__ == (DataPipeline,)
    assert isinstance(dataset, DataPipeline) and len(dataset) == 11
    copy = pickle.loads(pickle.dumps(dataset))  # the class made at run time still pickles
    assert type(copy) is type(dataset) and len(copy) == 11
    assert list(copy) == all_keys(2, 3)


def test_add_length_method_on_any_object():
    obj = add_length_method(Sized(5))
    assert len(obj) == 5 and isinstance(obj, Sized)
    assert isinstance(obj, torch.utils.data.IterableDataset)  # as in webdataset
    obj.size = 6
    assert len(obj) == 6  # read at call time
    assert len(pickle.loads(pickle.dumps(obj))) == 6
    assert type(add_length_method(Sized(1))) is type(obj)  # one class per base


def test_add_length_method_reaches_spawned_workers(tmp_path):
    urls = make_shards(tmp_path, 2, 3)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(), keys)
    dataset.size = 6
    add_length_method(dataset)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         multiprocessing_context="spawn")
    assert sorted(loader) == all_keys(2, 3)


# -- DataLoader workers


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_exactly_once(tmp_path, context):
    urls = make_shards(tmp_path, 5, 7)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(), keys)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         multiprocessing_context=context)
    for _ in range(2):
        assert sorted(loader) == all_keys(5, 7)


def test_dataloader_with_epoch_counts(tmp_path):
    urls = make_shards(tmp_path, 4, 5)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(),
                           keys).with_epoch(7)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         multiprocessing_context="fork")
    for _ in range(3):
        epoch = list(loader)
        assert len(epoch) == 14 and set(epoch) <= set(all_keys(4, 5))


def test_dataloader_batches(tmp_path):
    urls = make_shards(tmp_path, 2, 4)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(), keys)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=2,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert all(len(b) == 2 for b in batches)
    assert sorted(k for b in batches for k in b) == all_keys(2, 4)


def test_worker_seed_differs_per_worker():
    seeds = list(torch.utils.data.DataLoader(DataPipeline(functools.partial(seed_source)),
                                             num_workers=2, batch_size=None,
                                             multiprocessing_context="fork"))
    assert sorted(seeds) == [0, 1]


def seed_source():
    yield wdsmp.utils.pytorch_worker_seed()


def test_with_epoch_restarts_in_persistent_workers(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(),
                           keys).with_epoch(3)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         persistent_workers=True, multiprocessing_context="fork")
    shard0, shard1 = all_keys(2, 5)[:5], all_keys(2, 5)[5:]
    assert sorted(loader) == sorted(loader) == sorted(shard0[0:3] + shard1[0:3])


def test_with_epoch_continuous_continues_in_persistent_workers(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(),
                           keys).with_epoch(3, continuous=True)
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         persistent_workers=True, multiprocessing_context="fork")
    shard0, shard1 = all_keys(2, 5)[:5], all_keys(2, 5)[5:]
    assert sorted(loader) == sorted(shard0[0:3] + shard1[0:3])
    assert sorted(loader) == sorted(shard0[3:5] + shard0[0:1] + shard1[3:5] + shard1[0:1])


def test_forked_workers_start_their_own_epoch_iterator(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(),
                           keys).with_epoch(3, continuous=True)
    assert list(dataset) == all_keys(2, 5)[:3]  # the main process keeps an iterator
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None,
                                         multiprocessing_context="fork")
    shard0, shard1 = all_keys(2, 5)[:5], all_keys(2, 5)[5:]
    assert sorted(loader) == sorted(shard0[0:3] + shard1[0:3])
    assert list(dataset) == all_keys(2, 5)[3:6]  # and goes on with it


# -- stage times


def slow_keys(src):
    """``keys``, taking 20 ms per sample: the stage a user would want to find."""
    for sample in src:
        time.sleep(0.02)
        yield sample["__key__"]


def _times(figures, where=None):
    return {f["stage"]: f for f in figures if where is None or f["where"] == where}


def test_stage_times_name_each_stage_with_its_own_time_and_items(tmp_path):
    urls = make_shards(tmp_path, 2, 5)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), slow_keys,
                           wdsmp.filters.batched(4, collation_fn=None)).with_stage_times()
    assert len(list(dataset)) == 3
    figures = dataset.stage_times()
    assert [f["stage"] for f in figures] == ["SimpleShardList", "tarfile_samples", "slow_keys", "batched"]
    assert [f["items"] for f in figures] == [2, 10, 10, 3]
    times = _times(figures)
    assert times["slow_keys"]["seconds"] >= 10 * 0.02  # its own sleep, the reading before it taken out
    assert times["slow_keys"]["seconds"] == max(f["seconds"] for f in figures)
    assert times["slow_keys"]["ms_per_item"] == pytest.approx(times["slow_keys"]["seconds"] * 100)
    assert {f["where"] for f in figures} == {"this process"}


def test_stage_times_are_off_until_asked_and_then_wrap_nothing(tmp_path):
    urls = make_shards(tmp_path, 1, 2)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), keys)
    assert dataset.iterator1().gi_code is keys.__code__  # the last stage itself: no timing wrapper
    with pytest.raises(ValueError, match=r"stage times are off: call with_stage_times\(\)"):
        dataset.stage_times()
    dataset.with_stage_times()
    assert dataset.iterator1().gi_code is not keys.__code__
    dataset.with_stage_times(False)
    assert dataset.iterator1().gi_code is keys.__code__


def test_stages_appended_later_are_timed_too(tmp_path):
    urls = make_shards(tmp_path, 1, 3)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples()).with_stage_times()
    longer = dataset.compose(keys)
    assert list(longer) == all_keys(1, 3)
    assert [(f["stage"], f["items"]) for f in longer.stage_times()] == [
        ("SimpleShardList", 1), ("tarfile_samples", 3), ("keys", 3)]
    assert [f["items"] for f in dataset.stage_times()] == [0, 0]  # the original was not run
    assert pickle.loads(pickle.dumps(longer)).stage_times()[2]["stage"] == "keys"  # pickles, with a clock of its own


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_stage_times_of_a_web_loader_add_up_its_workers(tmp_path, context):
    urls = make_shards(tmp_path, 4, 3)
    dataset = DataPipeline(SimpleShardList(urls), split_by_worker, tarfile_to_samples(), slow_keys)
    loader = wdsmp.WebLoader(dataset, num_workers=2, batch_size=None, multiprocessing_context=context,
                             persistent_workers=True).batched(4, collation_fn=None).with_stage_times()
    assert sorted(k for batch in loader for k in batch) == all_keys(4, 3)
    assert sorted(k for batch in loader for k in batch) == all_keys(4, 3)  # a second epoch, same workers
    workers, here = _times(loader.stage_times(), "DataLoader workers"), _times(loader.stage_times(), "this process")
    assert workers["slow_keys"]["items"] == 24 and workers["SimpleShardList"]["items"] == 16  # 2 epochs x 2 workers
    assert workers["slow_keys"]["seconds"] >= 24 * 0.02
    assert list(here) == ["DataLoader", "batched"] and here["batched"]["items"] == 6
