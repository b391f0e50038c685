"""MultiShardSample: YAML and dict specs, per-dataset choices, seeds and epochs, errors."""

import os
import pickle
import random

import pytest

from wdsmp.shardlists import MSSource, MultiShardSample, default_rng, expand


def test_expand(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DATA_ROOT", "/data")
    assert expand("$DATA_ROOT/x-{0..1}.tar") == "/data/x-{0..1}.tar"
    assert expand("~/shards") == os.path.join(str(tmp_path), "shards")


def test_default_rng_and_mssource():
    assert isinstance(default_rng, random.Random)
    source = MSSource()
    assert (source.name, source.perepoch, source.resample, source.urls) == ("", -1, -1, [])
    assert MSSource().urls is not source.urls


SPEC_YAML = """\
prefix: /data/
datasets:
  - name: big
    buckets: b1
    shards: big-{000..009}.tar
    choose: 3
  - name: small
    shards:
      - small-{0..1}.tar
      - extra.tar
    resample: 5
  - shards: all-{0..1}.tar
    buckets: [b2]
"""


def spec_file(tmp_path, text=SPEC_YAML, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_multishardsample_from_yaml(tmp_path):
    dataset = MultiShardSample(spec_file(tmp_path), seed=0)
    big, small, rest = dataset.sources
    assert big.name == "big" and big.urls[0] == "/data/b1/big-000.tar" and len(big.urls) == 10
    assert big.perepoch == 3 and big.resample == -1
    assert small.urls == ["/data/small-0.tar", "/data/small-1.tar", "/data/extra.tar"] and small.resample == 5
    assert rest.name == "@b2" and rest.urls == ["/data/b2/all-0.tar", "/data/b2/all-1.tar"]
    urls = [sample["url"] for sample in dataset]
    assert len(urls) == 3 + 5 + 2
    chosen = [u for u in urls if "/big-" in u]
    assert len(set(chosen)) == 3  # without replacement
    assert sum("/small-" in u or "/extra" in u for u in urls) == 5
    assert sorted(u for u in urls if "/all-" in u) == rest.urls  # all of them, once


def test_multishardsample_from_dict_with_default_bucket():
    spec = {"buckets": "root", "datasets": [{"shards": "x-{0..2}.tar"}]}
    (source,) = MultiShardSample(spec).sources
    assert source.name == "@root" and source.urls == ["root/x-0.tar", "root/x-1.tar", "root/x-2.tar"]
    assert sorted(s["url"] for s in MultiShardSample(spec)) == source.urls


def test_multishardsample_expands_variables(monkeypatch):
    monkeypatch.setenv("SHARD_ROOT", "/mnt")
    spec = {"prefix": "$SHARD_ROOT/", "datasets": [{"shards": "a-{0..1}.tar"}]}
    assert MultiShardSample(spec).sources[0].urls == ["/mnt/a-0.tar", "/mnt/a-1.tar"]


def test_multishardsample_is_deterministic_under_a_seed(tmp_path):
    fname = spec_file(tmp_path)
    one, two = MultiShardSample(fname, seed=5), MultiShardSample(fname, seed=5)
    epochs = [list(one) for _ in range(3)]
    assert [list(two) for _ in range(3)] == epochs
    assert epochs[0] != epochs[1]  # successive epochs differ
    assert list(MultiShardSample(fname, seed=6)) != epochs[0]


def test_multishardsample_set_epoch_agrees_across_processes(tmp_path):
    fname = spec_file(tmp_path)
    for seed in (None, 7):
        first, second = MultiShardSample(fname, seed=seed), MultiShardSample(fname, seed=seed)
        list(first)  # consume an epoch first: set_epoch must not depend on history
        first.set_epoch(3)
        second.set_epoch(3)
        assert first.epoch == 3
        assert list(first) == list(second)
        copy = pickle.loads(pickle.dumps(second))  # what a DataLoader worker gets
        first.set_epoch(4)
        copy.set_epoch(4)
        assert list(first) == list(copy)


@pytest.mark.parametrize("spec, message", [
    ({"datasets": [{"shards": "a"}], "shuffle": True}, "unknown key.*'shuffle'"),
    ({"prefix": "/x/"}, "missing key 'datasets'"),
    ({"datasets": []}, "'datasets' must be a non-empty list"),
    ({"prefix": 3, "datasets": [{"shards": "a"}]}, "'prefix' must be a string"),
    ({"datasets": ["a.tar"]}, r"datasets\[0\] must be a mapping"),
    ({"datasets": [{"shards": "a"}, {"name": "b", "shard": "x"}]}, r"datasets\[1\] \('b'\) has unknown key.*'shard'"),
    ({"datasets": [{"name": "c"}]}, r"datasets\[0\] \('c'\): missing key 'shards'"),
    ({"datasets": [{"shards": 5}]}, r"datasets\[0\]: 'shards' must be a string or a list"),
    ({"datasets": [{"shards": "a-{0..3}.tar", "choose": 9}]}, r"'choose' is 9 but the dataset has only 4"),
    ({"datasets": [{"shards": "a-{0..3}.tar", "choose": 2, "resample": 2}]}, "only one of 'resample'"),
    ({"datasets": [{"shards": "a", "choose": "2"}]}, "'choose' must be an int"),
    ({"datasets": [{"shards": "a", "resample": True}]}, "'resample' must be an int"),
    ({"datasets": [{"shards": "a", "buckets": ["b1", "b2"]}]}, "only one per dataset"),
    ({"datasets": [{"shards": "a", "name": 3}]}, "'name' must be a string"),
    ({"datasets": [{"shards": "a-{0..3.tar"}]}, "unbalanced braces"),
    ({"datasets": [{"shards": []}]}, "names no shards"),
])
def test_multishardsample_rejects_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        MultiShardSample(spec)


def test_multishardsample_needs_a_file_name_or_a_dict():
    with pytest.raises(TypeError, match="YAML file name or a dict"):
        MultiShardSample([{"shards": "a.tar"}])


def test_multishardsample_bad_yaml_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"bad\.yaml: not valid YAML"):
        MultiShardSample(spec_file(tmp_path, "datasets: [\n", "bad.yaml"))
    with pytest.raises(ValueError, match=r"list\.yaml must be a mapping"):
        MultiShardSample(spec_file(tmp_path, "- a\n- b\n", "list.yaml"))
    with pytest.raises(ValueError, match=r"keys\.yaml: datasets\[0\] \('x'\): 'choose' is 5"):
        MultiShardSample(spec_file(tmp_path, "datasets:\n  - {name: x, shards: a.tar, choose: 5}\n",
                                   "keys.yaml"))
