"""The fluid interface: WebDataset's arguments, chaining, WebLoader, the older forms."""

import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import wdsmp as wds
from wdsmp.compat import FluidWrapper


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def make_shards(tmp_path, nshards=4, per_shard=5):
    for shard in range(nshards):
        with wds.TarWriter(str(tmp_path / f"shard-{shard}.tar")) as sink:
            for i in range(per_shard):
                sink.write({"__key__": f"s{shard}-{i}", "txt": f"{shard} {i}", "cls": i,
                            "extra.bin": b"x"})
    return str(tmp_path / f"shard-{{0..{nshards - 1}}}.tar")


def keys(dataset):
    return [sample["__key__"] for sample in dataset]


ALL = [f"s{shard}-{i}" for shard in range(4) for i in range(5)]


def test_reads_every_sample_in_order(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path))
    assert isinstance(dataset, IterableDataset)
    assert keys(dataset) == ALL
    assert keys(dataset) == ALL  # a second epoch


def test_fluid_decode_keeps_the_key_as_map_does(tmp_path):
    # webdataset's .decode() is a .map(): each decoded sample gets its source's __key__,
    # None where a renaming dropped it; the wds.decode stage does not add one
    renamed = wds.WebDataset(make_shards(tmp_path, 1, 2)).rename(t="txt", keep=False)
    assert list(renamed.decode()) == [{"t": b"0 0", "__key__": None}, {"t": b"0 1", "__key__": None}]
    assert next(iter(renamed.decode("rgb8").batched(2)))["__key__"] == [None, None]
    stage = wds.DataPipeline(renamed, wds.decode())
    assert list(stage) == [{"t": b"0 0"}, {"t": b"0 1"}]


def test_fluid_decode_checks_its_arguments_when_called(tmp_path):
    # as in webdataset: a bad spec or keyword is an error at .decode(), not at the first sample
    dataset = wds.WebDataset(make_shards(tmp_path, 1, 1))
    with pytest.raises(ValueError, match="nope"):
        dataset.decode("nope")
    with pytest.raises(TypeError):
        dataset.decode("rgb", bogus=1)
    with pytest.raises(TypeError):
        dataset.decode(3)


def test_chaining_returns_a_new_pipeline(tmp_path):
    base = wds.WebDataset(make_shards(tmp_path))
    decoded = base.decode().to_tuple("txt", "cls")
    assert list(decoded)[:2] == [("0 0", 0), ("0 1", 1)]
    assert keys(base) == ALL  # the original is unchanged
    batches = list(decoded.batched(6))
    assert [len(b[1]) for b in batches] == [6, 6, 6, 2]
    assert list(decoded.batched(6, partial=False).unbatched())[:1] == [("0 0", 0)]
    assert len(list(decoded.listed(7))) == 3
    assert list(decoded.slice(2)) == [("0 0", 0), ("0 1", 1)]
    assert len(list(decoded.select(lambda t: t[1] == 0))) == 4


def test_fluid_methods_reach_their_stages(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path)).decode()
    renamed = next(iter(dataset.rename(text="txt", keep=False)))
    assert "text" in renamed and "txt" not in renamed
    mapped = next(iter(dataset.map_dict(cls=lambda c: c + 10)))
    assert mapped["cls"] == 10
    assert next(iter(dataset.to_tuple("txt", "cls").map_tuple(str.upper, None))) == ("0 0", 0)
    assert next(iter(dataset.map(lambda s: s["__key__"]))) == "s0-0"
    assert len(list(dataset.rsample(1.0))) == 20 and list(dataset.rsample(0.0)) == []
    assert len(list(dataset.shuffle(0))) == 20
    assert sorted(keys(dataset.shuffle(10))) == sorted(ALL)


def test_shardshuffle_with_a_seed_is_repeatable(tmp_path):
    url = make_shards(tmp_path)

    def shard_order(seed):
        dataset = wds.WebDataset(url, shardshuffle=10, seed=seed)
        return [k.split("-")[0] for k in keys(dataset)[::5]]

    assert shard_order(3) == shard_order(3)
    assert sorted(shard_order(3)) == ["s0", "s1", "s2", "s3"]
    assert any(shard_order(seed) != ["s0", "s1", "s2", "s3"] for seed in range(5))


def test_detshuffle_follows_set_epoch(tmp_path):
    url = make_shards(tmp_path)
    dataset = wds.WebDataset(url, shardshuffle=10, detshuffle=True, seed=1)
    orders = []
    for epoch in (0, 1, 0):
        dataset.set_epoch(epoch)
        orders.append(keys(dataset)[::5])
    assert orders[0] == orders[2]
    assert sorted(orders[0]) == sorted(orders[1])


def test_resampled_draws_shards_forever(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path), resampled=True, seed=5).with_epoch(50)
    first = keys(dataset)
    assert len(first) == 50 and set(first) <= set(ALL)
    again = wds.WebDataset(make_shards(tmp_path), resampled=True, seed=5).with_epoch(50)
    assert keys(again) == first


def test_resampled_streams_are_deterministic_per_worker_and_epoch(tmp_path):
    """Two DataLoader workers draw different shards; a run with the same seed draws the same."""
    def epoch_keys(epoch, seed=5):
        dataset = wds.WebDataset(make_shards(tmp_path), resampled=True, seed=seed)
        dataset = dataset.to_tuple("__key__").batched(5).with_epoch(4)  # batches per worker
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
        loader.set_epoch(epoch)
        return [list(batch[0]) for batch in loader]

    first = epoch_keys(0)
    assert len(first) == 8 and first == epoch_keys(0)
    assert first[0::2] != first[1::2]  # the workers' batches alternate, from different draws
    assert first != epoch_keys(1) and first != epoch_keys(0, seed=6)


def test_select_and_rename_files(tmp_path):
    url = make_shards(tmp_path)
    dataset = wds.WebDataset(url, select_files=lambda name: not name.endswith(".bin"))
    assert all("extra.bin" not in s for s in dataset)
    dataset = wds.WebDataset(url, rename_files=lambda name: name.replace(".txt", ".text"))
    assert "text" in next(iter(dataset))


def test_repeat(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path, nshards=1), repeat=True)
    from itertools import islice
    assert len(list(islice(dataset, 12))) == 12


def test_handler_skips_a_broken_shard(tmp_path):
    url = make_shards(tmp_path, nshards=2)
    (tmp_path / "shard-1.tar").write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(wds.TarFormatError, match="shard-1.tar"):
        list(wds.WebDataset(url))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert keys(wds.WebDataset(url, handler=wds.warn_and_continue)) == ALL[:5]


def test_empty_worker_is_an_error_naming_the_worker(tmp_path, monkeypatch):
    url = make_shards(tmp_path, nshards=1)
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "2")
    with pytest.warns(UserWarning, match="worker 1 of 2 received no shards"):
        with pytest.raises(ValueError, match="no samples in worker 1 of 2"):
            list(wds.WebDataset(url))
    with pytest.warns(UserWarning, match="received no shards"):
        assert list(wds.WebDataset(url, empty_check=False)) == []


def test_multinode_needs_a_node_splitter(tmp_path, monkeypatch):
    url = make_shards(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="add a node splitter"):
        list(wds.WebDataset(url))
    assert keys(wds.WebDataset(url, nodesplitter=wds.split_by_node)) == ALL[5:10] + ALL[15:20]


def test_in_dataloader_workers_every_sample_once(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path)).decode().to_tuple("__key__", "cls")
    loader = DataLoader(dataset, num_workers=2, batch_size=None)
    assert sorted(k for k, _ in loader) == sorted(ALL)


def test_webloader_rebatches_across_workers(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path)).decode().to_tuple("cls", "txt").batched(3)
    loader = wds.WebLoader(dataset, num_workers=2, batch_size=None)
    loader = loader.unbatched().shuffle(10).batched(8)
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [8, 8, 4]
    assert isinstance(batches[0][0], torch.Tensor) or hasattr(batches[0][0], "shape")
    assert len(list(wds.WebLoader(dataset, num_workers=2, batch_size=None).with_epoch(3))) == 3


def test_pickles_for_spawned_workers(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path), shardshuffle=5, seed=2).decode().to_tuple(
        "__key__", "cls").batched(4)
    clone = pickle.loads(pickle.dumps(dataset))
    assert [b[0] for b in clone] == [b[0] for b in dataset]


class Doubler(IterableDataset):
    """An IterableDataset wrapping another, as the older ``compose(cls, *args)`` expects."""

    def __init__(self, dataset, times):
        self.dataset = dataset
        self.times = times

    def __iter__(self):
        for sample in self.dataset:
            for _ in range(self.times):
                yield sample


def test_compose_with_a_class_wraps_and_keeps_chaining(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path, nshards=1)).compose(Doubler, 2)
    assert isinstance(dataset, FluidWrapper)
    assert keys(dataset) == [k for k in ALL[:5] for _ in range(2)]
    assert len(list(dataset.slice(3))) == 3
    plain = wds.DataPipeline(wds.SimpleShardList(make_shards(tmp_path, nshards=1)),
                             wds.tarfile_to_samples()).compose(Doubler, times=3)
    assert isinstance(plain, Doubler) and len(keys(plain)) == 15


def test_compose_rejects_keywords_without_a_class(tmp_path):
    with pytest.raises(TypeError, match="only with a class"):
        wds.WebDataset(make_shards(tmp_path)).compose(lambda src: src, times=2)


def test_processor_older_form(tmp_path):
    def upper(sample):
        return dict(sample, txt=sample["txt"].upper())

    dataset = wds.Processor(wds.map, upper)(wds.WebDataset(make_shards(tmp_path)).decode())
    assert [s["txt"] for s in dataset][:2] == ["0 0", "0 1"]


def test_fluid_wrapper_over_any_iterable():
    wrapped = FluidWrapper([{"__key__": "a", "x": 1}, {"__key__": "b", "x": 2}])
    assert list(wrapped.to_tuple("x")) == [(1,), (2,)]


def _remove_shards(tmp_path):
    for path in tmp_path.glob("shard-*.tar"):
        path.unlink()


def test_mcached_replays_the_first_complete_pass_without_reading_again(tmp_path):
    dataset = wds.WebDataset(make_shards(tmp_path), shardshuffle=False).mcached()
    assert keys(dataset) == ALL
    _remove_shards(tmp_path)  # a second pass that read the shards would fail
    assert keys(dataset) == ALL


def test_lmdb_cached_keeps_the_first_pass_in_a_real_lmdb_database(tmp_path):
    pytest.importorskip("lmdb")  # in the test extras; the message names the install otherwise
    dataset = wds.WebDataset(make_shards(tmp_path), shardshuffle=False).lmdb_cached(str(tmp_path / "samples.lmdb"))
    assert keys(dataset) == ALL
    _remove_shards(tmp_path)
    assert keys(dataset) == ALL
    assert (tmp_path / "samples.lmdb").exists()

