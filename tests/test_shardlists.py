"""Shard specs, shard sources and splitters: braces, globs, seeds, nodes and workers."""

import os
import pickle
import random
import re
import subprocess
import sys
import threading
import time
import warnings
from itertools import islice

import pytest
import torch.utils.data

import wdsmp.utils
from wdsmp.pipeline import DataPipeline
import wdsmp.tariterators
from wdsmp.shardlists import (
    DirectoryShardList,
    MSSource,
    MultiShardSample,
    ResampledShards,
    SimpleShardList,
    check_pid_is_running,
    default_rng,
    envlookup,
    expand,
    expand_urls,
    get_pid_from_filename,
    non_empty,
    resampled,
    resampled_,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
    without_last_extension,
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



# -- small helpers webdataset's shardlists exposes


def test_envlookup(monkeypatch):
    match = re.match(r"\$\{(\w+)\}", "${SPLIT}")
    monkeypatch.setenv("WDS_SPLIT", "train")
    assert envlookup(match) == "train"
    monkeypatch.delenv("WDS_SPLIT")
    with pytest.raises(ValueError, match="WDS_SPLIT is not set"):
        envlookup(match)


def test_expand(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DATA_ROOT", "/data")
    assert expand("$DATA_ROOT/x-{0..1}.tar") == "/data/x-{0..1}.tar"
    assert expand("~/shards") == os.path.join(str(tmp_path), "shards")


def test_pid_helpers():
    assert check_pid_is_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not check_pid_is_running(child.pid)  # reaped: no such process
    assert not check_pid_is_running(0) and not check_pid_is_running(-1)
    assert get_pid_from_filename("/d/a.tar._1234_") == 1234
    assert get_pid_from_filename("/d/a.tar._done_") is None
    assert get_pid_from_filename("/d/a.tar") is None


@pytest.mark.parametrize("name, expected", [
    ("/d/a.tar._12_", "/d/a.tar"),
    ("a.tar", "a"),
    ("noext", "noext"),
    ("dir.d/file", "dir.d/file"),  # only the last path component loses an extension
])
def test_without_last_extension(name, expected):
    assert without_last_extension(name) == expected


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


def test_default_rng_and_mssource():
    assert isinstance(default_rng, random.Random)
    source = MSSource()
    assert (source.name, source.perepoch, source.resample, source.urls) == ("", -1, -1, [])
    assert MSSource().urls is not source.urls


# -- MultiShardSample


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


def test_shardspec(tmp_path):
    assert isinstance(shardspec(spec_file(tmp_path)), MultiShardSample)
    assert isinstance(shardspec(spec_file(tmp_path, name="spec.yml")), MultiShardSample)
    plain = shardspec("a-{0..2}.tar")
    assert isinstance(plain, SimpleShardList) and len(plain) == 3


# -- DirectoryShardList


def shard_dir(tmp_path, names=("a.tar", "b.tar", "c.tgz")):
    directory = tmp_path / "shards"
    directory.mkdir()
    for name in names:
        (directory / name).write_bytes(name.encode())
    return directory


def test_directory_unlink_serves_each_shard_once(tmp_path):
    directory = shard_dir(tmp_path, ["a.tar", "b.tar", "c.tgz", "d.tar.tgz", "notes.txt"])
    seen = []
    for sample in DirectoryShardList(str(directory), poll=None, mode="unlink"):
        url = sample["url"]
        assert url.endswith(f"._{os.getpid()}_") and os.path.exists(url)  # claimed while in use
        seen.append(os.path.basename(without_last_extension(url)))
    assert sorted(seen) == ["a.tar", "b.tar", "c.tgz", "d.tar.tgz"]  # the braced default pattern
    assert os.listdir(directory) == ["notes.txt"]


def test_directory_keep_marks_shards_done(tmp_path):
    directory = shard_dir(tmp_path)
    urls = [s["url"] for s in DirectoryShardList(str(directory) + "/", poll=None, mode="keep",
                                                 pattern="*.tar")]
    assert len(urls) == 2
    assert sorted(os.listdir(directory)) == ["a.tar._done_", "b.tar._done_", "c.tgz"]
    assert list(DirectoryShardList(str(directory), pattern="*", poll=None, mode="keep")) == [
        {"url": f"{directory}/c.tgz._{os.getpid()}_"}]  # done and claimed files are never candidates


def test_directory_resample_returns_shards(tmp_path):
    directory = shard_dir(tmp_path, ["a.tar", "b.tar"])
    urls = [s["url"] for s in islice(DirectoryShardList(str(directory), poll=None), 20)]
    assert len(urls) == 20 and {os.path.basename(u).split(".")[0] for u in urls} == {"a", "b"}
    assert sorted(os.listdir(directory)) == ["a.tar", "b.tar"]  # all back, the last one included


@pytest.mark.parametrize("mode", ["unlink", "keep", "resample"])
def test_directory_early_close_gives_the_shard_back(tmp_path, mode):
    directory = shard_dir(tmp_path, ["a.tar"])
    iterator = iter(DirectoryShardList(str(directory), poll=None, mode=mode))
    url = next(iterator)["url"]
    assert os.listdir(directory) == [os.path.basename(url)]
    iterator.close()  # the consumer stopped before asking for more: the shard may be unfinished
    assert os.listdir(directory) == ["a.tar"]


def test_directory_select_oldest(tmp_path):
    directory = shard_dir(tmp_path)
    for age, name in enumerate(["c.tgz", "a.tar", "b.tar"]):
        os.utime(directory / name, (1000 - age * 100, 1000 - age * 100))
    urls = [s["url"] for s in DirectoryShardList(str(directory), poll=None, mode="unlink", select="oldest")]
    assert [os.path.basename(without_last_extension(u)) for u in urls] == ["b.tar", "a.tar", "c.tgz"]


def test_directory_readers_never_share_a_shard(tmp_path):
    directory = shard_dir(tmp_path, [f"s{i}.tar" for i in range(6)])
    first = iter(DirectoryShardList(str(directory), poll=None, mode="keep"))
    second = iter(DirectoryShardList(str(directory), poll=None, mode="keep"))
    urls = []
    for _ in range(3):
        urls += [next(first)["url"], next(second)["url"]]
    assert len(set(urls)) == 6


def test_directory_gives_back_claims_of_dead_processes(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    directory = shard_dir(tmp_path, [f"orphan.tar._{child.pid}_", f"held.tar._{os.getppid()}_"])
    urls = [s["url"] for s in DirectoryShardList(str(directory), poll=None, mode="unlink")]
    assert [os.path.basename(u) for u in urls] == [f"orphan.tar._{os.getpid()}_"]  # given back, then served
    assert os.listdir(directory) == [f"held.tar._{os.getppid()}_"]  # its owner still runs


def test_directory_waits_for_producers(tmp_path):
    directory = shard_dir(tmp_path, [])
    producer = threading.Timer(0.2, (directory / "late.tar").write_bytes, [b"x"])
    producer.start()
    try:
        iterator = iter(DirectoryShardList(str(directory), poll=0.02, timeout=10, mode="unlink"))
        assert next(iterator)["url"].startswith(str(directory / "late.tar._"))
    finally:
        producer.join()
    start = time.monotonic()
    assert list(DirectoryShardList(str(directory), poll=0.01, timeout=0.1)) == []
    assert time.monotonic() - start < 5


def test_directory_validates_and_pickles(tmp_path):
    directory = shard_dir(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        DirectoryShardList(str(directory / "a.tar"))
    with pytest.raises(ValueError, match="mode must be one of"):
        DirectoryShardList(str(directory), mode="delete")
    with pytest.raises(ValueError, match="select must be one of"):
        DirectoryShardList(str(directory), select="newest")
    with pytest.raises(ValueError, match="poll must be"):
        DirectoryShardList(str(directory), poll=-1)
    copy = pickle.loads(pickle.dumps(DirectoryShardList(str(directory), poll=None, mode="unlink")))
    assert len(list(copy)) == 3


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
