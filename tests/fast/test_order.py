"""Sample order end to end (NOTE [sample order] in loader.py): shards written in label order
train well by default, the global order is exact and resumable, and the loader says so where it
cannot shuffle every sample."""

import gzip
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

import wdsmp
from wdsmp.fast.loader import FastLoader
from wdsmp.fast.variety import expected_distinct

# Real workers throughout, and what is checked is the plan and the delivery: the twins of the readers
# are test_samplespans.py's business.
pytestmark = pytest.mark.processes

LABELS, PER_LABEL, SHARDS = 48, 50, 6  # 2,400 samples written class by class: 8 labels per shard
BATCH = 64


@pytest.fixture(scope="module")
def ordered(tmp_path_factory):
    """Shards written in label order, as ImageFolder lists the files: their URLs."""
    directory = tmp_path_factory.mktemp("ordered")
    pixels = np.full((16, 16, 3), 128, np.uint8)
    jpeg = simplejpeg.encode_jpeg(pixels, 90)
    per_shard = LABELS * PER_LABEL // SHARDS
    urls = []
    for s in range(SHARDS):
        url = str(directory / f"train-{s}.tar")
        with wdsmp.TarWriter(url) as sink:
            for i in range(s * per_shard, (s + 1) * per_shard):
                sink.write({"__key__": f"{i:05d}", "jpg": jpeg, "cls": i // PER_LABEL})
        urls.append(url)
    return urls


def _epoch(loader):
    """Keys and per-batch distinct label counts of one epoch."""
    keys, distinct = [], []
    for batch in loader:
        keys += batch.keys
        distinct.append(len(set(batch.labels.tolist())))
    return keys, distinct


def _uniform_median():
    """The median distinct labels per batch of a uniform shuffle of the same labels."""
    labels = np.repeat(np.arange(LABELS), PER_LABEL)
    rng = np.random.default_rng(0)
    medians = []
    for _ in range(20):
        shuffled = rng.permutation(labels)[: len(labels) // BATCH * BATCH].reshape(-1, BATCH)
        medians.append(np.median([len(set(row)) for row in shuffled]))
    return float(np.median(medians))


def test_label_ordered_shards_give_varied_batches_by_default(ordered):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the global order has nothing to warn about
        with FastLoader(ordered, BATCH, num_workers=2, image_size=16, keys=True) as loader:
            assert loader.order == "global"
            keys, distinct = _epoch(loader)
    assert len(keys) == len(set(keys)) == LABELS * PER_LABEL // BATCH * BATCH
    uniform = _uniform_median()
    assert np.median(distinct) >= 0.9 * uniform, (np.median(distinct), uniform)


def test_shard_order_on_label_ordered_shards_warns_once(ordered):
    with pytest.warns(RuntimeWarning, match=r"median of [\d.]+ distinct labels(.|\n)*label order(.|\n)*"
                                            r"wdsmp split --shuffle") as caught:
        with FastLoader(ordered, BATCH, num_workers=2, image_size=16, keys=True, order="shards") as loader:
            assert loader.order == "shards"
            for _ in range(2):
                keys, distinct = _epoch(loader)
    assert sum("distinct labels" in str(w.message) for w in caught) == 1  # once, not every epoch
    assert np.median(distinct) < 0.7 * expected_distinct([PER_LABEL] * LABELS, BATCH)


def test_shuffled_shards_read_shard_by_shard_do_not_warn(tmp_path):
    rng = np.random.default_rng(1)
    jpeg = simplejpeg.encode_jpeg(np.full((16, 16, 3), 90, np.uint8), 90)
    url = str(tmp_path / "mixed.tar")
    with wdsmp.TarWriter(url) as sink:
        for i, label in enumerate(rng.integers(0, LABELS, 20 * BATCH)):
            sink.write({"__key__": f"{i:05d}", "jpg": jpeg, "cls": int(label)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FastLoader(url, BATCH, num_workers=1, image_size=16, order="shards") as loader:
            assert len(list(loader)) == 20


def test_global_order_is_exact_across_ranks_and_new_each_epoch(ordered):
    total = LABELS * PER_LABEL
    epochs = []
    for epoch in range(2):
        seen, counts = [], []
        for rank in range(2):
            with FastLoader(ordered, BATCH, num_workers=2, image_size=16, keys=True, rank=rank, world_size=2,
                            policy="drop") as loader:
                loader.set_epoch(epoch)
                assert loader.order == "global"
                keys, _ = _epoch(loader)
                counts.append(len(keys) // BATCH)
                seen += keys
        assert counts[0] == counts[1] == total // 2 // BATCH
        assert len(seen) == len(set(seen)) == 2 * counts[0] * BATCH  # every sample at most once, ranks disjoint
        epochs.append(seen)
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("workers_after", [2, 3])
def test_global_order_resumes_mid_epoch_exactly(ordered, workers_after):
    options = dict(batch_size=BATCH, image_size=16, keys=True, seed=3)
    with FastLoader(ordered, num_workers=2, **options) as loader:
        full = [list(batch.keys) for batch in loader]
    with FastLoader(ordered, num_workers=2, **options) as loader:
        iterator = iter(loader)
        first = [list(next(iterator).keys) for _ in range(7)]
        state = loader.state_dict()
    assert state["order"] == "global"
    with FastLoader(ordered, num_workers=workers_after, **options) as loader:
        loader.load_state_dict(state)
        rest = [list(batch.keys) for batch in loader]
    assert first + rest == full
    with FastLoader(ordered, num_workers=2, order="shards", **options) as loader:
        with pytest.raises(ValueError, match="global order.*order='global'"):
            loader.load_state_dict(state)


def test_gzip_shards_are_read_shard_by_shard_and_global_order_says_why(ordered, tmp_path):
    packed = str(tmp_path / "train-0.tar.gz")
    with open(ordered[0], "rb") as source, gzip.open(packed, "wb") as sink:
        shutil.copyfileobj(source, sink)
    with pytest.warns(RuntimeWarning, match="gzip-compressed"):  # the label order is noticed, and why
        with FastLoader([packed] + ordered[1:], BATCH, num_workers=1, image_size=16) as loader:
            assert loader.order == "shards"
            list(loader)
    with pytest.raises(ValueError, match=r"order='global' reads each sample at its offset(.|\n)*gzip-compressed"):
        FastLoader([packed, ordered[1]], BATCH, num_workers=1, image_size=16, order="global")
    with pytest.raises(ValueError, match="order='global'.*shuffle=True"):
        FastLoader(ordered, BATCH, num_workers=1, image_size=16, train=False, order="global")


def test_eval_reads_shard_by_shard_without_a_warning(ordered):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FastLoader(ordered, BATCH, num_workers=1, image_size=16, train=False, keys=True) as loader:
            assert loader.order == "shards"
            keys, _ = _epoch(loader)
    assert keys == sorted(keys)  # in the order written


def test_remote_shards_global_order_through_the_cache(ordered, http_server, tmp_path):
    for url in ordered:
        http_server.put_file(os.path.basename(url), Path(url).read_bytes())
    remote = [http_server.url(os.path.basename(url)) for url in ordered]
    counts = [(url, LABELS * PER_LABEL // SHARDS) for url in remote]
    with pytest.warns(RuntimeWarning, match=r"label order(.|\n)*is remote; order='global' with cache_dir"):
        with FastLoader(counts, BATCH, num_workers=1, image_size=16) as loader:
            assert loader.order == "shards"
            list(loader)
    cache = str(tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FastLoader(counts, BATCH, num_workers=2, image_size=16, keys=True, cache_dir=cache,
                        order="global") as loader:
            keys, distinct = _epoch(loader)
    assert len(keys) == len(set(keys)) == LABELS * PER_LABEL // BATCH * BATCH
    assert np.median(distinct) >= 0.9 * _uniform_median()


def _delivered(loader, batches):
    """Keys of the first ``batches`` batches of the loader's next epoch, and its state after them."""
    iterator, keys = iter(loader), []
    for _ in range(batches):
        keys += next(iterator).keys
    return keys, loader.state_dict()


@pytest.mark.parametrize("worlds", [(2, 3), (3, 2)])
def test_an_epoch_resumes_on_another_number_of_ranks(ordered, worlds):
    """NOTE [elastic resume]: any old rank's state deals what no rank delivered to the new ranks, each
    sample at most once, in equal full batches; the next epoch is an ordinary one on the new ranks."""
    old, new = worlds
    options = dict(batch_size=BATCH, image_size=16, keys=True, seed=2, num_workers=2)
    trained, states = [], []
    for rank in range(old):
        with FastLoader(ordered, rank=rank, world_size=old, **options) as loader:
            keys, state = _delivered(loader, 5)
            trained += keys
            states.append(state)
    rest, counts = [], []
    for rank in range(new):
        with FastLoader(ordered, rank=rank, world_size=new, **options) as loader:
            loader.load_state_dict(states[-1 - rank % old])  # any old rank's state will do
            planned = len(loader)
            keys, sizes = [], []
            for batch in loader:
                keys += batch.keys
                sizes.append(batch.count)
            assert sizes == [BATCH] * planned
            counts.append(planned)
            rest += keys
            assert loader.state_dict()["epoch"] == 1 and len(loader) == LABELS * PER_LABEL // new // BATCH
    left = old * (LABELS * PER_LABEL // old // BATCH - 5) * BATCH
    assert counts == [left // new // BATCH] * new
    assert len(trained + rest) == len(set(trained + rest))  # each sample at most once in the epoch


def test_elastic_resume_refuses_what_it_cannot_know(ordered):
    options = dict(batch_size=BATCH, image_size=16, keys=True, num_workers=1)
    with FastLoader(ordered, world_size=2, rank=0, shuffle_buffer=64, **options) as loader:
        _, buffered = _delivered(loader, 2)
    with FastLoader(ordered, world_size=3, rank=0, shuffle_buffer=64, **options) as loader:
        with pytest.raises(ValueError, match=r"saved on 2 ranks on 3: a shuffle buffer"):
            loader.load_state_dict(buffered)
    with FastLoader(ordered, world_size=2, rank=0, handler=wdsmp.ignore_and_continue,
                    stages=[wdsmp.select(_odd_key)], **options) as loader:
        _, dropped = _delivered(loader, 2)
    with FastLoader(ordered, world_size=3, rank=0, **options) as loader:
        with pytest.raises(ValueError, match="stages or the handler dropped samples"):
            loader.load_state_dict(dropped)
        _, clean = _delivered(FastLoader(ordered, world_size=2, rank=1, **options), 1)
        loader.load_state_dict(clean)
        _, elastic = _delivered(loader, 1)
    assert elastic["origin"] == [2, 1, 1]
    with FastLoader(ordered, world_size=2, rank=0, **options) as loader:
        with pytest.raises(ValueError, match="itself of an epoch resumed from 2 ranks"):
            loader.load_state_dict(elastic)


def _odd_key(sample):
    return int(sample["__key__"]) % 2 == 1
