"""Exact, resumable epochs on the reference path: ExactSamples under DataPipeline, WebDataset
and WebLoader, with real shards and real DataLoader worker processes."""

import collections
import pathlib
import pickle
import re
import warnings

import pytest

import wdsmp as wds
from wdsmp.shards.index import write_index

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores

SIZES = (17, 5, 30)  # unequal, and fewer shards than ranks x workers
BATCH = 4


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A shard index of 3 shards of SIZES text samples; keys ``s<shard>-<n>``."""
    directory = tmp_path_factory.mktemp("exact")
    for s, size in enumerate(SIZES):
        with wds.TarWriter(str(directory / f"part-{s}.tar")) as sink:
            for i in range(size):
                sink.write({"__key__": f"s{s}-{i:03d}", "txt": f"{s} {i}", "cls": s})
    path = str(directory / "index.json")
    write_index(path, [(f"part-{s}.tar", size) for s, size in enumerate(SIZES)])
    return path


def _dataset(index, rank=0, world_size=2, **kw):
    kw.setdefault("shuffle_buffer", 8)
    source = wds.ExactSamples(index, batch_size=BATCH, rank=rank, world_size=world_size, **kw)
    return wds.DataPipeline(source, wds.to_tuple("__key__", "cls"), wds.batched(BATCH, partial=False))


def _keys(batches):
    return [key for keys, _ in batches for key in keys]


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_every_sample_once_and_equal_batches(index, num_workers, policy):
    total = sum(SIZES)
    seen, counts = collections.Counter(), []
    for rank in range(2):
        loader = wds.WebLoader(_dataset(index, rank, policy=policy), batch_size=None, num_workers=num_workers)
        loader.set_epoch(3)
        batches = list(loader)
        counts.append(len(batches))
        assert len(loader) == len(batches)
        assert all(len(keys) == BATCH for keys, _ in batches)
        seen.update(_keys(batches))
    per_rank = total // 2 // BATCH if policy == "drop" else -(-(-(-total // 2)) // BATCH)
    assert counts == [per_rank, per_rank]
    if policy == "drop":  # every sample at most once; the few dropped ones differ by epoch
        assert max(seen.values()) == 1 and len(seen) == 2 * per_rank * BATCH
    else:  # every sample at least once; the repeats fill the last batches
        assert len(seen) == total and sum(seen.values()) == 2 * per_rank * BATCH


def test_plain_local_urls_count_themselves(index):
    """No index given: the shards' own counts make the same plan, so the same batches."""
    spec = str(pathlib.Path(index).parent / "part-{0..2}.tar")
    for rank in range(2):
        epochs = []
        for source in (spec, index):
            loader = wds.WebLoader(_dataset(source, rank), batch_size=None, num_workers=2)
            epochs.append((len(loader), _keys(loader)))
        assert epochs[0] == epochs[1] and epochs[0][0] == sum(SIZES) // 2 // BATCH


def test_order_follows_seed_and_epoch(index):
    def epoch_keys(epoch, num_workers, seed=0):
        loader = wds.WebLoader(_dataset(index, seed=seed), batch_size=None, num_workers=num_workers)
        loader.set_epoch(epoch)
        return _keys(loader)

    first = epoch_keys(1, 2)
    assert first == epoch_keys(1, 2)
    assert first != epoch_keys(2, 2)
    assert first != epoch_keys(1, 2, seed=5)
    assert sorted(first) != first  # shuffled


@pytest.mark.parametrize("before,after", [(2, 2), (2, 3), (3, 0), (0, 2)])
def test_resume_gives_exactly_the_rest_in_order(index, before, after):
    def run(num_workers, state=None, stop=None):
        loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=num_workers)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(4)  # the loaded state is for epoch 4: it is kept
        keys = []
        for i, (batch, _) in enumerate(loader):
            keys.extend(batch)
            if i + 1 == stop:
                return keys, loader.state_dict()
        return keys, loader.state_dict()

    full, end = run(before)
    assert (end["epoch"], end["batches_done"]) == (5, 0)  # a finished epoch: the next one's start
    head, state = run(before, stop=3)
    assert state["epoch"] == 4 and state["batches_done"] == 3 and state["streams"] == max(before, 1)
    tail, end = run(after, state=state)
    assert head + tail == full
    assert (end["epoch"], end["batches_done"]) == (5, 0)


def test_resume_twice_with_other_worker_counts(index):
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=2)
    full = _keys(loader)
    keys, state = [], None
    for num_workers, stop in ((2, 1), (3, 2), (0, 1), (1, None)):
        loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=num_workers)
        if state is not None:
            loader.load_state_dict(state)
        for i, (batch, _) in enumerate(loader):
            keys.extend(batch)
            if i + 1 == stop:
                break
        state = loader.state_dict()
    assert keys == full


def test_pipeline_iterated_directly_and_fluid_form(index):
    direct = _dataset(index)
    keys = _keys(direct)
    assert len(keys) // BATCH == len(direct)
    state = direct.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    source = wds.ExactSamples(index, batch_size=BATCH, rank=0, world_size=2, shuffle_buffer=8)
    fluid = wds.WebDataset(source).to_tuple("__key__", "cls").batched(BATCH, partial=False)
    assert _keys(fluid) == keys
    state = dict(fluid.state_dict(), epoch=0, batches_done=2)
    fluid.load_state_dict(state)
    assert _keys(fluid) == keys[2 * BATCH:]


def test_state_checked_against_the_source(index):
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=0)
    state = loader.state_dict()
    for name, value in (("batch_size", 8), ("seed", 1), ("world_size", 3), ("shards", 2), ("policy", "pad")):
        with pytest.raises(ValueError, match=f"saved with {name}="):
            loader.load_state_dict(dict(state, **{name: value}))
    with pytest.raises(ValueError, match="batches_done=99, not within the epoch's 6 batches"):
        loader.load_state_dict(dict(state, batches_done=99))
    assert (state["format"], state["version"]) == ("wdsmp.ExactSamples", 1)
    with pytest.raises(ValueError, match="state is wdsmp.ExactSamples version 3; this wdsmp reads version 1"):
        loader.load_state_dict(dict(state, version=3))
    with pytest.raises(ValueError, match="not in a known version of wdsmp.ExactSamples .*format=None, version=None"):
        loader.load_state_dict({name: value for name, value in state.items() if name not in ("format", "version")})
    with pytest.raises(ValueError, match="state lacks streams: it is not a whole state_dict"):
        loader.load_state_dict({name: value for name, value in state.items() if name != "streams"})
    with pytest.raises(ValueError, match="need a pipeline that reads from wds.ExactSamples"):
        wds.DataPipeline(range(3)).state_dict()


def test_set_epoch_drops_a_state_of_another_epoch(index):
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=0)
    loader.set_epoch(2)
    state = dict(loader.state_dict(), batches_done=5)
    loader.load_state_dict(state)
    loader.set_epoch(2)
    assert len(list(loader)) == 1
    loader.set_epoch(3)
    assert len(list(loader)) == 6


def test_arguments_and_misuse_are_refused(index, tmp_path):
    with pytest.raises(ValueError, match="needs the sample count of every shard"):
        wds.ExactSamples([f"pipe:cat {tmp_path / 'a.tar'}"], batch_size=4)
    with pytest.raises(ValueError, match="too few for 2 ranks of batch_size 64"):
        wds.ExactSamples(index, batch_size=64, rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank 2 is not below world_size 2"):
        wds.ExactSamples(index, batch_size=4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="policy must be one of"):
        wds.ExactSamples(index, batch_size=4, policy="even")
    with pytest.raises(ValueError, match=r"use ExactSamples\(\.\.\., shuffle_buffer=n\)"):
        _dataset(index).compose(wds.shuffle(100))
    with pytest.raises(ValueError, match="with_epoch"):
        iter(_dataset(index).with_epoch(10))
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        next(iter(loader))


def _drop_one(samples):
    for sample in samples:
        if sample["__key__"] != "s2-007":
            yield sample


def test_dropping_stage_still_gives_the_planned_batches_with_a_warning(index):
    source = wds.ExactSamples(index, batch_size=BATCH, rank=0, world_size=1, shuffle=False)
    dataset = wds.DataPipeline(source, _drop_one, wds.to_tuple("__key__", "cls"), wds.batched(BATCH, partial=False))
    with pytest.warns(UserWarning, match="1 fewer batches than the 13 planned.*last batch is repeated"):
        batches = list(dataset)
    assert len(batches) == 13
    assert batches[-1] is batches[-2]


def test_remote_shards_cached_whole_per_node(index, http_server, tmp_path):
    """Shards split between ranks and workers are fetched once each, whole, into the cache."""
    directory = pathlib.Path(index).parent  # the module fixture's shards, served over HTTP
    for name in ["index.json"] + [f"part-{s}.tar" for s in range(len(SIZES))]:
        http_server.put_file(name, (directory / name).read_bytes())
    cache = tmp_path / "cache"
    seen = collections.Counter()
    for rank in range(2):
        source = wds.ExactSamples(http_server.url("index.json"), batch_size=BATCH, rank=rank, world_size=2,
                                  cache_dir=str(cache))
        dataset = wds.DataPipeline(source, wds.to_tuple("__key__", "cls"), wds.batched(BATCH, partial=False))
        seen.update(_keys(wds.WebLoader(dataset, batch_size=None, num_workers=2)))
    assert len(seen) == 2 * (sum(SIZES) // 2 // BATCH) * BATCH and max(seen.values()) == 1
    fetched = collections.Counter(r.path for r in http_server.requests(method="GET"))
    assert {path: n for path, n in fetched.items() if path.endswith(".tar")} == {
        f"/part-{s}.tar": 1 for s in range(len(SIZES))}
    assert len([p for p in cache.rglob("*.tar") if p.is_file()]) == len(SIZES)


def test_a_worker_without_batches_left_is_no_error(index):
    """Resumed one batch before the end, one of two workers has nothing left to make."""
    def fluid():
        source = wds.ExactSamples(index, batch_size=BATCH, rank=0, world_size=2, shuffle_buffer=8)
        return wds.WebDataset(source).to_tuple("__key__", "cls").batched(BATCH, partial=False)

    full = _keys(wds.WebLoader(fluid(), batch_size=None, num_workers=2))
    for left in (1, 0):
        loader = wds.WebLoader(fluid(), batch_size=None, num_workers=2)
        loader.load_state_dict(dict(loader.state_dict(), batches_done=6 - left))
        assert _keys(loader) == full[len(full) - left * BATCH:]


def test_no_stage_may_follow_the_loader(index):
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=0)
    with pytest.raises(ValueError, match="no stage may follow the DataLoader of a WebLoader over ExactSamples"):
        loader.unbatched().shuffle(10).batched(BATCH)
    with pytest.raises(ValueError, match="in_order=False"):
        next(iter(wds.WebLoader(_dataset(index), batch_size=None, num_workers=1, in_order=False)))


def test_rank_is_fixed_for_workers_when_pickled(index, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    source = wds.ExactSamples(index, batch_size=BATCH)
    copy = pickle.loads(pickle.dumps(source))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert copy.node() == (1, 2) and source.node() == (0, 1)


def test_loader_batch_size_without_workers_is_counted_once(index):
    """The DataLoader batches the samples (no batched stage): counted where they are handed out."""
    source = wds.ExactSamples(index, batch_size=BATCH, rank=0, world_size=2)
    dataset = wds.DataPipeline(source, wds.to_tuple("__key__", "cls"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = list(wds.WebLoader(dataset, batch_size=BATCH, num_workers=0))
    assert [len(keys) for keys, _ in batches] == [BATCH] * 6


def test_an_epoch_ends_or_goes_on(index):
    """A finished epoch moves on to the next; one left early goes on where it was."""
    loader = wds.WebLoader(_dataset(index), batch_size=None, num_workers=0)
    loader.set_epoch(2)
    epoch2 = _keys(loader)
    epoch3 = _keys(loader)
    assert epoch2 != epoch3 and loader.state_dict()["epoch"] == 4
    loader.set_epoch(2)
    head = []
    for keys, _ in loader:
        head.extend(keys)
        if len(head) == 2 * BATCH:
            break
    assert head + _keys(loader) == epoch2
    state = loader.state_dict()
    with pytest.raises(ValueError, match="batches_done"):
        loader.load_state_dict(dict(state, epoch=7, batches_done=99))
    assert loader.state_dict() == state


def test_a_shard_too_big_for_the_cache_is_read_directly(index, http_server, tmp_path, monkeypatch):
    directory = pathlib.Path(index).parent
    for name in ["index.json"] + [f"part-{s}.tar" for s in range(len(SIZES))]:
        http_server.put_file(name, (directory / name).read_bytes())
    monkeypatch.setenv("WDS_CACHE_SIZE", "1000")  # smaller than any shard
    source = wds.ExactSamples(http_server.url("index.json"), batch_size=BATCH, rank=0, world_size=1,
                              shuffle=False, cache_dir=str(tmp_path / "cache"))
    dataset = wds.DataPipeline(source, wds.to_tuple("__key__", "cls"), wds.batched(BATCH, partial=False))
    gets = lambda: [len(http_server.requests(f"part-{s}.tar", "GET")) for s in range(len(SIZES))]  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = _keys(dataset)
    said = [str(w.message) for w in caught]
    assert any(re.search(r"part-0.tar \(\d+ bytes\) is larger than cache_size \(1000 bytes\); not caching it", m)
               for m in said), said
    assert any(re.search("could not cache .*part-0.tar.*reading it directly", m) for m in said), said
    assert keys == sorted(keys) and len(keys) == sum(SIZES) // BATCH * BATCH
    assert gets() == [2, 2, 2]  # fetched for the cache, refused, read directly
    with pytest.warns(UserWarning, match="larger than cache_size .* not fetched for the cache again"):
        assert _keys(dataset) == keys
    assert gets() == [3, 3, 3]  # the next epochs read them directly at once
    assert not list((tmp_path / "cache").glob("*.tar"))
