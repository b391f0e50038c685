"""RandomMix and RoundRobin: order, proportions, end conditions, seeds and epochs."""

import pickle
import random
from collections import Counter
from itertools import islice

import pytest
from torch.utils.data import IterableDataset

import wdsmp as wds
from wdsmp.mix import RandomMix, RoundRobin, random_samples


class Forever(IterableDataset):
    """An endless stream of one label."""

    def __init__(self, label):
        super().__init__()
        self.label = label

    def __iter__(self):
        while True:
            yield self.label


class EpochRecorder(IterableDataset):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter([1, 2])


def _shard(tmp_path, name, n):
    path = str(tmp_path / name)
    with wds.TarWriter(path) as writer:
        for i in range(n):
            writer.write({"__key__": f"{i:03d}", "txt": f"{name} {i}"})
    return wds.DataPipeline(wds.SimpleShardList(path), wds.tarfile_to_samples())


def test_round_robin_stops_at_the_first_exhausted_source():
    assert list(RoundRobin([[1, 2, 3], [10, 20, 30, 40]])) == [1, 10, 2, 20, 3, 30]
    assert list(RoundRobin([[1, 2, 3], [10]])) == [1, 10, 2]


def test_round_robin_longest_goes_on_with_the_rest():
    got = list(RoundRobin([[1, 2, 3], [10], [100, 200, 300, 400]], longest=True))
    assert got == [1, 10, 100, 2, 200, 3, 300, 400]


def test_round_robin_over_tar_pipelines(tmp_path):
    a, b = _shard(tmp_path, "a.tar", 5), _shard(tmp_path, "b.tar", 5)
    texts = [s["txt"].decode() for s in wds.DataPipeline(RoundRobin([a, b]))]
    assert texts[:4] == ["a.tar 0", "b.tar 0", "a.tar 1", "b.tar 1"]
    assert len(texts) == 10


def test_random_mix_proportions():
    mix = RandomMix([Forever("a"), Forever("b"), Forever("c")], [6, 3, 1], seed=1)
    counts = Counter(islice(mix, 20000))
    for label, expected in [("a", 0.6), ("b", 0.3), ("c", 0.1)]:
        assert counts[label] / 20000 == pytest.approx(expected, abs=0.015)


def test_random_mix_default_weights_are_equal():
    counts = Counter(islice(RandomMix([Forever("a"), Forever("b")], seed=2), 10000))
    assert counts["a"] / 10000 == pytest.approx(0.5, abs=0.02)


def test_random_mix_is_deterministic_under_a_seed():
    def first(mix):
        return list(islice(mix, 500))

    sources = [Forever("a"), Forever("b")]
    mix = RandomMix(sources, seed=7)
    epoch0 = first(mix)
    assert epoch0 == first(RandomMix(sources, seed=7))
    assert epoch0 != first(RandomMix(sources, seed=8))
    epoch1 = first(mix)
    assert epoch1 != epoch0  # each iteration is a new epoch
    mix.set_epoch(0)
    assert first(mix) == epoch0
    assert first(pickle.loads(pickle.dumps(RandomMix(sources, seed=7)))) == epoch0


def test_random_mix_differs_per_worker(monkeypatch):
    sources = [Forever("a"), Forever("b")]
    monkeypatch.setenv("NUM_WORKERS", "2")
    monkeypatch.setenv("WORKER", "0")
    worker0 = list(islice(RandomMix(sources, seed=7), 200))
    monkeypatch.setenv("WORKER", "1")
    worker1 = list(islice(RandomMix(sources, seed=7), 200))
    assert worker0 != worker1
    monkeypatch.setenv("WORKER", "0")
    assert list(islice(RandomMix(sources, seed=7), 200)) == worker0


def test_random_mix_without_seed_uses_the_global_random():
    sources = [Forever("a"), Forever("b")]
    random.seed(3)
    first = list(islice(RandomMix(sources), 200))
    random.seed(3)
    assert list(islice(RandomMix(sources), 200)) == first


def test_random_mix_ends_when_a_source_runs_out():
    short, long = ["s"] * 10, list(range(1000))
    got = list(RandomMix([short, long], seed=0))
    assert got.count("s") == 10
    assert len(got) < 1010
    assert [x for x in got if x != "s"] == list(range(len(got) - 10))


def test_random_mix_longest_reads_everything_in_order():
    short, long = ["s"] * 10, list(range(1000))
    got = list(RandomMix([short, long], longest=True, seed=0))
    assert len(got) == 1010
    assert [x for x in got if x != "s"] == long


def test_zero_weight_sources_are_never_picked():
    got = list(RandomMix([["a"] * 50, Forever("never"), ["b"] * 50], [1, 0, 1], longest=True))
    assert sorted(got) == ["a"] * 50 + ["b"] * 50


def test_random_samples_function_with_rng():
    def draw():
        return list(islice(random_samples([iter(Forever("a")), iter(Forever("b"))], [1, 1],
                                          rng=random.Random(5)), 100))

    assert draw() == draw()
    assert set(draw()) == {"a", "b"}


@pytest.mark.parametrize("probs, message", [
    ([1], "got 1 probabilities for 2 datasets"),
    ([1, -1], r"probability 1 must be a finite number >= 0, not -1"),
    ([1, float("nan")], "probability 1 must be a finite number"),
    ([0, 0], "must not all be zero"),
])
def test_random_mix_rejects_bad_probabilities(probs, message):
    with pytest.raises(ValueError, match=message):
        RandomMix([[1], [2]], probs)


def test_set_epoch_reaches_the_mixed_datasets():
    a, b = EpochRecorder(), EpochRecorder()
    pipeline = wds.DataPipeline(RandomMix([a, b], seed=0))
    pipeline.set_epoch(4)
    RoundRobin([a]).set_epoch(5)
    assert (a.epochs, b.epochs) == ([4, 5], [4])
    assert pipeline.stage(0).epoch == -1
    list(pipeline)
    assert pipeline.stage(0).epoch == 4


def test_mix_as_the_source_of_a_pipeline(tmp_path):
    a, b = _shard(tmp_path, "a.tar", 30), _shard(tmp_path, "b.tar", 30)
    pipeline = wds.DataPipeline(RandomMix([a, b], longest=True, seed=3), _texts)
    got = list(pipeline)
    assert sorted(got) == sorted(f"{name} {i}" for name in ("a.tar", "b.tar") for i in range(30))
    assert got == list(wds.DataPipeline(RandomMix([a, b], longest=True, seed=3), _texts))


def _texts(samples):
    for sample in samples:
        yield sample["txt"].decode()
