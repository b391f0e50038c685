"""Every keyword webdataset's public functions and classes take, accepted with its meaning.

The table below names, for the functions and classes whose keywords
webdataset's releases (0.2.x, 1.0.2) take -- the tar readers, the shard
lists, the filters, the fluid API, the writers and the decoders -- each
keyword, a call that passes it, and the result that shows what it means
in webdataset. One test runs the whole table with wdsmp; when webdataset
1.0.2 is installed, the rows marked ``SAME`` run with it too and must give
the same result, which keeps the table honest (rows marked ``WDSMP`` hold
where wdsmp's result is its own: a documented difference, or a webdataset
that fails there).
"""

import pickle
import base64
import gzip
import io
import json
import os
import pathlib
import random
import tarfile
from dataclasses import dataclass
from itertools import islice

import numpy as np
import pytest

import wdsmp

from .conftest import tar_bytes, write_tar

try:
    import webdataset
except ImportError:  # a reference when present, never a requirement
    webdataset = None

SAME, WDSMP = "same", "wdsmp"


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS", "WDS_SECURE"):
        monkeypatch.delenv(name, raising=False)


@dataclass
class Data:
    """The files the table's calls read and write."""

    dir: str
    shard: str  # a.txt a.CLS, b.txt b.CLS, c.txt c.seg.png, and a __meta__ directory member
    shards: list  # s0.tar, s1.tar: keys s0_0, s0_1 / s1_0, s1_1 with txt and cls fields
    cut: str  # the shard cut inside b.txt
    missing: str
    png: bytes

    def path(self, name):
        return os.path.join(self.dir, name)


def make_data(directory):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4)).convert("RGB").save(buffer, format="PNG")
    members = [("__meta__/info.json", b"{}"), ("a.txt", b"A"), ("a.CLS", b"1"), ("b.txt", b"B" * 3000),
               ("b.CLS", b"2"), ("c.txt", b"C"), ("c.seg.png", b"P")]
    shard = write_tar(directory / "s.tar", members)
    cut = directory / "cut.tar"
    cut.write_bytes(tar_bytes(members)[:4000])
    shards = [write_tar(directory / f"s{i}.tar", [(f"s{i}_{j}.{ext}", f"{i}{j}".encode())
                                                  for j in range(2) for ext in ("txt", "cls")]) for i in range(2)]
    return Data(str(directory), shard, shards, str(cut), str(directory / "missing.tar"), buffer.getvalue())


# -- helpers the calls share


def keys(samples):
    return [s["__key__"] for s in samples]


def names(members):
    return [m["fname"] for m in members]


def members_of(wds, url, **kw):
    with open(url, "rb") as stream:
        return names(wds.tariterators.tar_file_iterator(stream, **kw))


def expanded(wds, urls, **kw):
    streams = [{"url": u, "stream": open(u, "rb")} if isinstance(u, str) else u for u in urls]
    return [m["fname"] if isinstance(m, dict) and m else m
            for m in wds.tariterators.tar_file_expander(iter(streams), **kw)]


def grouped(wds, url, **kw):
    members = wds.tariterators.tar_file_expander(wds.tariterators.url_opener([{"url": url}]))
    return [sorted(s) for s in wds.tariterators.group_by_keys(members, **kw) if s]


def samples_of(wds, urls, **kw):
    return keys(wds.tarfile_samples([{"url": u} for u in urls], **kw))


def run(wds, stage, data):
    return list(stage(iter(data)))


def dicts(n=4):
    return [{"__key__": f"k{i}", "txt": f"t{i}", "cls": i} for i in range(n)]


def tar_members(path):
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def written(wds, d, name, sample=None, **kw):
    path = d.path(f"{wds.__name__}-{name}")
    with wds.TarWriter(path, **kw) as sink:
        sink.write(sample or {"__key__": "a", "txt": "hello"})
    return path


def shard_files(wds, d, name, count=5, **kw):
    pattern = d.path(f"{wds.__name__}-{name}-%02d.tar")
    kw.setdefault("verbose", 0)
    with wds.ShardWriter(pattern, **kw) as sink:
        for i in range(count):
            sink.write({"__key__": f"k{i}", "txt": "x" * 100})
    return sorted(f for f in os.listdir(d.dir) if f.startswith(f"{wds.__name__}-{name}-"))


def fluid(wds, d, urls=None, **kw):
    kw.setdefault("shardshuffle", False)
    return keys(islice(wds.WebDataset(urls or d.shards, **kw), 20))


def decoded(wds, sample, *args, **kw):
    return wds.autodecode.Decoder(*args, **kw)(dict(sample))


def only_s0(src):
    for shard in src:
        if "s0" in shard["url"]:
            yield shard


def nothing(src):
    return iter(())


def log_lines(wds, d):
    path = d.path(f"{wds.__name__}-keys.log")
    run(wds, wds.filters.log_keys(logfile=path), dicts(2))
    with open(path) as f:
        return [line.rstrip("\n").split("\t")[-1] for line in f]


def printed(wds, **kw):
    out = io.StringIO()
    run(wds, wds.filters.info(stream=out, **kw), dicts(4))
    return out.getvalue().splitlines()


def directory_shards(wds, d, **kw):
    path = d.path(f"{wds.__name__}-dir")
    os.makedirs(path)
    for i, name in enumerate(["x0.tar", "x1.tar", "y.tgz"]):
        with open(os.path.join(path, name), "wb") as f:
            f.write(b"x")
        os.utime(os.path.join(path, name), (1000 + 10 * (3 - i),) * 2)  # the oldest last
    got = [os.path.basename(s["url"]).split(".")[0] for s in wds.shardlists.DirectoryShardList(path + "/", **kw)]
    return got, sorted(os.listdir(path))


def multishard_epochs(wds, d):
    spec = d.path(f"{wds.__name__}-spec.yaml")
    with open(spec, "w") as f:
        json.dump({"datasets": [{"name": "a", "shards": d.shards, "choose": 1}]}, f)  # JSON is YAML
    source = wds.shardlists.MultiShardSample(spec)
    draws = []
    for seed in (3, 3, 4):
        source.set_epoch(seed=seed)
        draws.append(source.get_shards_for_epoch())
    return draws[0] == draws[1], len(draws[2])


def lmdb_row(wds, d):
    pytest.importorskip("lmdb")
    stage = wds.filters.LMDBCached(d.path(f"{wds.__name__}.lmdb"), map_size=1e8, pickler=pickle, chunksize=1)
    first = list(stage.run(iter(dicts(3))))  # a PipelineStage in both: DataPipeline calls its run
    return first == list(stage.run(iter([]))), len(first)


def handler_calls(wds, d):
    calls = []
    got = members_of(wds, d.cut, handler=lambda exn: calls.append(type(exn)) or True)
    return got, [issubclass(c, tarfile.ReadError) for c in calls]


def grouping_with_a_duplicate(wds, d):
    url = d.path(f"{wds.__name__}-dup.tar")
    write_tar(pathlib.Path(url), [("a.txt", b"1"), ("a.txt", b"2"), ("b.txt", b"3")])
    members = wds.tariterators.tar_file_expander(wds.tariterators.url_opener([{"url": url}]))
    return keys(wds.tariterators.group_by_keys(members, handler=wds.ignore_and_continue))


def cache_files(wds, d, name, **kw):
    cache = d.path(f"{wds.__name__}-{name}")
    os.makedirs(cache)
    got = fluid(wds, d, urls=[f"pipe:cat {d.shards[0]}"], cache_dir=cache, **kw)
    return got, sorted(f for f in os.listdir(cache) if not f.endswith(".lock"))


# The table: (function, keyword, mode, call(wds, d), expected(d)).
TABLE = [
    # url_opener(data, handler, **kw): kw goes to gopen
    ("url_opener", "handler", SAME,
     lambda wds, d: [s["url"] for s in wds.tariterators.url_opener(
         [{"url": d.missing}, {"url": d.shard}], handler=wds.ignore_and_continue)],
     lambda d: [d.shard]),
    ("url_opener", "**kw (to gopen)", SAME,
     lambda wds, d: [s["stream"].writable() for s in wds.tariterators.url_opener(
         [{"url": d.path(f"{wds.__name__}-out.bin")}], mode="wb")],
     lambda d: [True]),
    # tar_file_iterator(fileobj, skip_meta, handler, select_files, rename_files)
    ("tar_file_iterator", "skip_meta", SAME,
     lambda wds, d: (members_of(wds, d.shard)[0], members_of(wds, d.shard, skip_meta=r".*\.CLS")),
     lambda d: ("a.txt", ["__meta__/info.json", "a.txt", "b.txt", "c.txt", "c.seg.png"])),
    ("tar_file_iterator", "select_files", SAME,
     lambda wds, d: members_of(wds, d.shard, select_files=lambda n: n.startswith("a.")),
     lambda d: ["a.txt", "a.CLS"]),
    ("tar_file_iterator", "rename_files", SAME,
     lambda wds, d: members_of(wds, d.shard, rename_files=lambda n: n.replace("CLS", "lbl"),
                               select_files=lambda n: n.endswith(".lbl")),
     lambda d: ["a.lbl", "b.lbl"]),
    ("tar_file_iterator", "handler", WDSMP,  # webdataset raises from the next header, whatever the handler
     handler_calls, lambda d: (["a.txt", "a.CLS"], [True])),
    # tar_file_expander(data, handler, select_files, rename_files, eof_value)
    ("tar_file_expander", "handler", SAME,
     lambda wds, d: expanded(wds, [{"url": "x", "stream": io.BytesIO(b"not a tar" * 200)}, d.shards[0]],
                             handler=wds.ignore_and_continue, eof_value=None),
     lambda d: ["s0_0.txt", "s0_0.cls", "s0_1.txt", "s0_1.cls"]),
    ("tar_file_expander", "select_files", SAME,
     lambda wds, d: expanded(wds, [d.shards[0]], select_files=lambda n: n.endswith(".cls"), eof_value=None),
     lambda d: ["s0_0.cls", "s0_1.cls"]),
    ("tar_file_expander", "rename_files", SAME,
     lambda wds, d: expanded(wds, [d.shards[0]], rename_files=str.upper, eof_value=None)[:1],
     lambda d: ["S0_0.TXT"]),
    ("tar_file_expander", "eof_value", SAME,
     lambda wds, d: expanded(wds, d.shards, eof_value="EOS", select_files=lambda n: n.endswith("0.cls")),
     lambda d: ["s0_0.cls", "EOS", "s1_0.cls", "EOS"]),
    # group_by_keys(data, keys, lcase, suffixes, handler)
    ("group_by_keys", "keys", SAME,  # split at the last dot: c.seg.png is sample c.seg's png
     lambda wds, d: grouped(wds, d.shard, keys=lambda n: tuple(n.rsplit(".", 1))),
     lambda d: [["__key__", "__url__", "cls", "txt"]] * 2
     + [["__key__", "__url__", "txt"], ["__key__", "__url__", "png"]]),
    ("group_by_keys", "lcase", SAME,
     lambda wds, d: grouped(wds, d.shard, lcase=False)[0],
     lambda d: ["CLS", "__key__", "__url__", "txt"]),
    ("group_by_keys", "suffixes", SAME,
     lambda wds, d: grouped(wds, d.shard, suffixes={"txt"}),
     lambda d: [["__key__", "__url__", "txt"]] * 3),
    ("group_by_keys", "handler", WDSMP,  # webdataset keeps the sample without the repeated field
     grouping_with_a_duplicate, lambda d: ["b"]),
    # tarfile_samples / tarfile_to_samples(src, handler, select_files, rename_files)
    ("tarfile_samples", "handler", SAME,
     lambda wds, d: samples_of(wds, [d.missing, d.shards[1]], handler=wds.ignore_and_continue),
     lambda d: ["s1_0", "s1_1"]),
    ("tarfile_samples", "select_files", SAME,
     lambda wds, d: [sorted(s) for s in wds.tarfile_samples([{"url": d.shards[0]}],
                                                             select_files=lambda n: n.endswith("cls"))],
     lambda d: [["__key__", "__url__", "cls"]] * 2),
    ("tarfile_to_samples", "rename_files", SAME,
     lambda wds, d: keys(wds.tarfile_to_samples(rename_files=lambda n: "x" + n)(iter([{"url": d.shards[0]}]))),
     lambda d: ["xs0_0", "xs0_1"]),
    # shard lists
    ("SimpleShardList", "seed", SAME,
     lambda wds, d: [s["url"] for s in wds.SimpleShardList([str(i) for i in range(10)], seed=7)],
     lambda d: (lambda urls: random.Random(7).shuffle(urls) or urls)([str(i) for i in range(10)])),
    ("ResampledShards", "nshards", SAME,
     lambda wds, d: len(list(wds.ResampledShards(d.shards, nshards=5))), lambda d: 5),
    ("ResampledShards", "seed, deterministic", SAME,
     lambda wds, d: [[s["url"] for s in wds.ResampledShards(list("abcdefgh"), 6, seed=s, deterministic=True)]
                     for s in (1, 1, 2)],
     None),  # checked below: the same seed draws the same, another seed others
    ("ResampledShards", "worker_seed", SAME,
     lambda wds, d: [[s["url"] for s in wds.ResampledShards(list("abcdefgh"), 6, worker_seed=lambda: w,
                                                            deterministic=True)] for w in (5, 5, 6)],
     None),
    ("ResampledShards", "max_urls", SAME,
     lambda wds, d: {s["url"] for s in wds.ResampledShards(iter("abcdef"), 50, max_urls=2)},
     lambda d: {"a", "b"}),
    ("ResampledShards", "empty_check", WDSMP,  # webdataset indexes the empty list anyway
     lambda wds, d: list(wds.ResampledShards([], 3, empty_check=False)), lambda d: []),
    ("split_by_node", "group", SAME,
     lambda wds, d: len(list(wds.split_by_node(iter(range(5)), group=None))), lambda d: 5),
    ("single_node_only", "group", SAME,
     lambda wds, d: len(list(wds.single_node_only(iter(range(5)), group=None))), lambda d: 5),
    ("resampled", "n", SAME,
     lambda wds, d: len(list(wds.resampled(n=7)(iter([{"url": "a"}])))), lambda d: 7),
    ("DirectoryShardList", "pattern, poll, mode, select", SAME,
     lambda wds, d: directory_shards(wds, d, pattern="*.tar", poll=None, mode="keep", select="oldest",
                                     timeout=1, fate=None),
     lambda d: (["x1", "x0"], ["x0.tar._done_", "x1.tar._done_", "y.tgz"])),
    ("MultiShardSample.set_epoch", "seed", SAME, multishard_epochs, lambda d: (True, 1)),
    # filters
    ("info", "fmt, n", SAME, lambda wds, d: printed(wds, fmt="{__key__}", n=2), lambda d: ["k0", "k1"]),
    ("info", "every, width, name", SAME,
     lambda wds, d: printed(wds, n=0, every=4, width=2, name="N"),
     lambda d: ["--- N", "__key__ 'k", "txt 't", "cls 3"]),
    ("shuffle", "bufsize", SAME, lambda wds, d: run(wds, wds.shuffle(1), range(10)), lambda d: list(range(10))),
    ("shuffle", "initial, rng", SAME,
     lambda wds, d: run(wds, wds.shuffle(5, initial=2, rng=random.Random(4)), range(20)),
     lambda d: list(wdsmp.filters._shuffle(iter(range(20)), 5, 2, rng=random.Random(4)))),
    ("shuffle", "seed, handler", WDSMP,  # wdsmp mixes rank and worker into the seed
     lambda wds, d: [run(wds, wds.shuffle(5, seed=s, handler=wds.reraise_exception), range(20)) for s in (1, 1)],
     None),
    ("detshuffle", "bufsize, initial, seed, epoch", SAME,
     lambda wds, d: run(wds, wds.detshuffle(bufsize=5, initial=3, seed=2, epoch=4).run, range(20)),
     lambda d: list(wdsmp.filters._shuffle(iter(range(20)), 5, 3, rng=random.Random(2 + 5)))),
    ("select", "predicate", SAME,
     lambda wds, d: keys(run(wds, wds.select(predicate=lambda s: s["cls"] % 2), dicts())), lambda d: ["k1", "k3"]),
    ("log_keys", "logfile", SAME, log_lines, lambda d: ["k0", "k1"]),
    ("decode", "handler", SAME,
     lambda wds, d: keys(run(wds, wds.decode(wds.handle_extension("txt", int), handler=wds.ignore_and_continue),
                             [{"__key__": "a", "txt": b"x"}, {"__key__": "b", "txt": b"2"}])),
     lambda d: ["b"]),
    ("decode", "only", SAME,
     lambda wds, d: run(wds, wds.decode(only=["cls"]), [{"__key__": "a", "txt": b"t", "cls": b"1"}]),
     lambda d: [{"__key__": "a", "txt": b"t", "cls": 1}]),
    ("decode", "partial", SAME,
     lambda wds, d: run(wds, wds.decode(partial=True), [{"__key__": "a", "txt": "already text", "cls": b"1"}]),
     lambda d: [{"__key__": "a", "txt": "already text", "cls": 1}]),
    ("decode", "pre, post", SAME,
     lambda wds, d: run(wds, wds.decode(pre=[lambda k, v: v.upper()], post=[lambda k, v: v + b"!"]),
                        [{"__key__": "a", "txt": b"t", "xyz": b"q"}]),
     lambda d: [{"__key__": "a", "txt": b"T", "xyz": b"Q"}]),
    ("map", "handler", SAME,
     lambda wds, d: run(wds, wds.map(lambda x: 10 // x, handler=wds.ignore_and_continue), [5, 0, 2]),
     lambda d: [2, 5]),
    ("rename", "keep", SAME,
     lambda wds, d: run(wds, wds.rename(keep=False, label="cls"), dicts(1)), lambda d: [{"label": 0}]),
    ("rename", "handler", SAME,
     lambda wds, d: len(run(wds, wds.rename(handler=wds.ignore_and_continue, x="nope"), dicts(2))), lambda d: 0),
    ("associate", "associator", SAME,
     lambda wds, d: run(wds, wds.associate(associator={"k0": {"extra": 1}}), dicts(1))[0]["extra"], lambda d: 1),
    ("map_dict", "handler, **kw", SAME,
     lambda wds, d: [s["cls"] for s in run(wds, wds.map_dict(handler=wds.ignore_and_continue, cls=lambda c: 6 // c),
                                           dicts(3))],
     lambda d: [6, 3]),
    ("to_tuple", "missing_is_error", SAME,
     lambda wds, d: run(wds, wds.to_tuple("txt", "png", missing_is_error=False), dicts(1)), lambda d: [("t0", None)]),
    ("to_tuple", "none_is_error", SAME,
     lambda wds, d: len(run(wds, wds.to_tuple("txt", none_is_error=True, handler=wds.ignore_and_continue),
                            [{"txt": None}, {"txt": "x"}])),
     lambda d: 1),
    ("map_tuple", "handler", SAME,
     lambda wds, d: run(wds, wds.map_tuple(lambda x: 6 // x, handler=wds.ignore_and_continue), [(0,), (3,)]),
     lambda d: [(2,)]),
    ("batched", "batchsize, collation_fn, partial", SAME,
     lambda wds, d: run(wds, wds.batched(batchsize=2, collation_fn=None, partial=False), range(5)),
     lambda d: [[0, 1], [2, 3]]),
    ("rsample", "p", SAME, lambda wds, d: run(wds, wds.rsample(p=0.0), range(9)), lambda d: []),
    ("slice", "*args", SAME, lambda wds, d: run(wds, wds.slice(1, 7, 2), range(9)), lambda d: [1, 3, 5]),
    ("extract_keys", "duplicate_is_error, ignore_missing", SAME,
     lambda wds, d: run(wds, wds.extract_keys("*t*", "png", duplicate_is_error=False, ignore_missing=True), dicts(1)),
     lambda d: [("t0",)]),
    ("rename_keys", "keep_unselected, must_match, duplicate_is_error", SAME,
     lambda wds, d: run(wds, wds.rename_keys(("label", "cls"), ("label", "txt"), x="png", keep_unselected=True,
                                             must_match=False, duplicate_is_error=False), dicts(1)),
     None),
    ("xdecode", "must_decode, defaults, **kw", SAME,
     lambda wds, d: run(wds, wds.xdecode(must_decode=False, defaults=[], txt=lambda s: s.read().upper()),
                        [{"a.txt": b"x", "a.bin": b"y"}]),
     lambda d: [{"a.txt": b"X", "a.bin": b"y"}]),
    ("LMDBCached", "fname, map_size, pickler, chunksize", SAME, lmdb_row, lambda d: (True, 3)),
    # the fluid API
    ("WebDataset", "handler", SAME,
     lambda wds, d: fluid(wds, d, urls=[d.missing, d.shards[1]], handler=wds.ignore_and_continue),
     lambda d: ["s1_0", "s1_1"]),
    ("WebDataset", "mode, resampled", SAME,
     lambda wds, d: (len(fluid(wds, d, mode="resampled")), len(fluid(wds, d, resampled=True))),
     lambda d: (20, 20)),
    ("WebDataset", "repeat", WDSMP,  # webdataset 1.0.2 ignores it; 0.2.x repeats, as wdsmp
     lambda wds, d: len(fluid(wds, d, repeat=True)), lambda d: 20),
    ("WebDataset", "shardshuffle, seed", SAME,
     lambda wds, d: [fluid(wds, d, urls=f"{d.shards[0]}::{d.shards[1]}", shardshuffle=10, seed=s) for s in (3, 3)],
     None),
    ("WebDataset", "detshuffle", SAME,
     lambda wds, d: (lambda ds: [[s["__url__"] for s in ds][::2] for _ in range(3)])(
         wds.WebDataset(d.shards * 4, shardshuffle=10, detshuffle=True, seed=1)),
     lambda d: [list(wdsmp.filters._shuffle(iter(d.shards * 4), 10, 10, rng=random.Random(1 + epoch)))
                for epoch in range(3)]),  # webdataset's orders: seed + epoch, the epoch advancing
    ("WebDataset", "cache_dir", SAME,
     lambda wds, d: (lambda got: (got[0], len(got[1])))(cache_files(wds, d, "cache")), lambda d: (["s0_0", "s0_1"], 1)),
    ("WebDataset", "cache_size", SAME,
     lambda wds, d: cache_files(wds, d, "nocache", cache_size=0), lambda d: (["s0_0", "s0_1"], [])),
    ("WebDataset", "url_to_name", WDSMP,  # webdataset 1.0.2 ignores it; 0.2.x names cache files with it
     lambda wds, d: cache_files(wds, d, "named", url_to_name=lambda url: "only.tar")[1], lambda d: ["only.tar"]),
    ("WebDataset", "nodesplitter, workersplitter", SAME,
     lambda wds, d: (fluid(wds, d, nodesplitter=only_s0), fluid(wds, d, workersplitter=None)),
     lambda d: (["s0_0", "s0_1"], ["s0_0", "s0_1", "s1_0", "s1_1"])),
    ("WebDataset", "select_files, rename_files", SAME,
     lambda wds, d: [sorted(s) for s in wds.WebDataset(d.shards[:1], shardshuffle=False,
                                                       rename_files=lambda n: n.replace("cls", "lbl"),
                                                       select_files=lambda n: not n.endswith("txt"))],
     lambda d: [["__key__", "__local_path__", "__url__", "lbl"]] * 2),
    ("WebDataset", "empty_check, verbose", SAME,
     lambda wds, d: fluid(wds, d, nodesplitter=nothing, empty_check=False, verbose=True), lambda d: []),
    ("FluidWrapper", "initial", SAME,
     lambda wds, d: list(wds.FluidWrapper(initial=[1, 2, 3]).map(lambda x: x * 2)), lambda d: [2, 4, 6]),
    ("WebLoader", "**kw (to DataLoader)", SAME,
     lambda wds, d: [b.tolist() for b in wds.WebLoader(wdsmp.MockDataset(1, 5), batch_size=2, num_workers=0)],
     lambda d: [[1, 1], [1, 1], [1]]),
    # writers
    ("TarWriter", "user, group, mode, mtime", SAME,
     lambda wds, d: (lambda m: (m.uname, m.gname, m.mode, m.mtime))(
         tar_members(written(wds, d, "owner.tar", user="u", group="g", mode=0o600, mtime=1234))["a.txt"]),
     lambda d: ("u", "g", 0o600, 1234)),
    ("TarWriter", "compress", SAME,
     lambda wds, d: open(written(wds, d, "zipped.tar", compress=True), "rb").read(2), lambda d: b"\x1f\x8b"),
    ("TarWriter", "encoder", SAME,
     lambda wds, d: tarfile.open(written(wds, d, "raw.tar", {"__key__": "a", "cls": b"\x00\x01"}, encoder=False))
     .extractfile("a.cls").read(),
     lambda d: b"\x00\x01"),
    ("TarWriter", "keep_meta", SAME,
     lambda wds, d: sorted(tar_members(written(wds, d, "meta.tar", {"__key__": "a", "_m": "x", "txt": "t"},
                                               keep_meta=True))),
     lambda d: ["a._m", "a.txt"]),
    ("TarWriter", "format", SAME,
     lambda wds, d: b"path=" in open(written(wds, d, "pax.tar", {"__key__": "k" * 120, "txt": "t"},
                                              format="PAX_FORMAT"), "rb").read(),
     lambda d: True),
    ("ShardWriter", "maxcount, start_shard, verbose", SAME,
     lambda wds, d: shard_files(wds, d, "count", maxcount=2, start_shard=3, verbose=0),
     None),
    ("ShardWriter", "maxsize", SAME,
     lambda wds, d: len(shard_files(wds, d, "size", maxsize=250)) > 1, lambda d: True),
    ("ShardWriter", "post", SAME,
     lambda wds, d: (lambda seen: (shard_files(wds, d, "post", maxcount=3, post=seen.append), len(seen))[1])([]),
     lambda d: 2),
    ("ShardWriter", "opener, **kw (to TarWriter)", SAME,
     lambda wds, d: (lambda opened: (shard_files(wds, d, "open", maxcount=5, compress=True,
                                                 opener=lambda f: opened.append(f) or open(f, "wb")),
                                     open(opened[0], "rb").read(2))[1])([]),
     lambda d: b"\x1f\x8b"),
    # decoders
    ("handle_extension", "extensions, f", SAME,
     lambda wds, d: decoded(wds, {"x.cls": b"7"}, [wds.handle_extension(extensions="x.cls", f=lambda b: -int(b))]),
     lambda d: {"x.cls": -7}),
    ("imagehandler", "imagespec, extensions", SAME,
     lambda wds, d: (decoded(wds, {"png": d.png}, [wds.imagehandler(imagespec="l8", extensions=["png"])])["png"].shape,
                     type(decoded(wds, {"png": d.png}, [wds.imagehandler("l8", extensions=["jpg"])])["png"])),
     lambda d: ((3, 4), bytes)),
    ("ImageHandler", "imagespec, extensions", SAME,
     lambda wds, d: decoded(wds, {"png": d.png}, [wds.autodecode.ImageHandler(imagespec="torchl8",
                                                                              extensions=["png"])])["png"].shape,
     lambda d: (3, 4)),
    ("Decoder", "handlers, pre, post, only, partial", SAME,
     lambda wds, d: decoded(wds, {"a": b"1", "b": 2, "c": b"3"}, handlers=[lambda k, v: int(v) * 10],
                            pre=[], post=[], only=["a", "b"], partial=True),
     lambda d: {"a": 10, "b": 2, "c": b"3"}),
    ("gzfilter", "(key, data)", SAME,
     lambda wds, d: (lambda c: (c.key, c.data))(wds.autodecode.gzfilter(key="x.txt.gz", data=gzip.compress(b"hi"))),
     lambda d: ("x.txt", b"hi")),
    ("basichandlers", "(key, data)", SAME,
     lambda wds, d: wds.autodecode.basichandlers(key="json", data=b"[1]"), lambda d: [1]),
    ("Continue", "key, data", SAME,
     lambda wds, d: decoded(wds, {"x.b64": b"aGk="}, [
         lambda k, v: wds.autodecode.Continue(key=k[:-4] + ".txt", data=base64.b64decode(v))
         if k.endswith(".b64") else None]),
     lambda d: {"x.b64": "hi"}),
]

# Rows whose expectation is a property of the result rather than a value.
PROPERTIES = {
    ("ResampledShards", "seed, deterministic"): lambda r, d: r[0] == r[1] != r[2],
    ("ResampledShards", "worker_seed"): lambda r, d: r[0] == r[1] != r[2],
    ("shuffle", "seed, handler"): lambda r, d: r[0] == r[1] != list(range(20)),
    ("rename_keys", "keep_unselected, must_match, duplicate_is_error"):
        lambda r, d: len(r) == 1 and "label" in r[0] and "__key__" in r[0],
    ("WebDataset", "shardshuffle, seed"):
        lambda r, d: r[0] == r[1] and sorted(r[0]) == ["s0_0", "s0_1", "s1_0", "s1_1"],
    ("ShardWriter", "maxcount, start_shard, verbose"): lambda r, d: [f.rsplit("-", 1)[1] for f in r] == [
        "03.tar", "04.tar", "05.tar"],
}


def check_row(wds, row, d):
    """None if ``row`` holds for library ``wds``, else what went wrong."""
    function, keyword, _, call, expected = row
    try:
        result = call(wds, d)
    except pytest.skip.Exception:
        return None
    except Exception as exn:  # noqa: BLE001 (a row that raises is a failing row)
        return f"{wds.__name__}: {function}({keyword}=...) raised {type(exn).__name__}: {exn}"
    prop = PROPERTIES.get((function, keyword))
    good = prop(result, d) if prop is not None else result == expected(d)
    if not good:
        want = "the property" if prop is not None else repr(expected(d))
        return f"{wds.__name__}: {function}({keyword}=...) gave {result!r}, not {want}"
    return None


def test_every_webdataset_keyword_is_accepted_with_its_meaning(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")  # MultiShardSample is obsolete in webdataset 1.0.2
    failures = []
    for library in ([wdsmp] if webdataset is None else [wdsmp, webdataset]):
        directory = tmp_path / library.__name__
        directory.mkdir()
        d = make_data(directory)
        for row in TABLE:
            if library is wdsmp or row[2] == SAME:
                failure = check_row(library, row, d)
                if failure is not None:
                    failures.append(failure)
    assert not failures, "\n".join(failures)


def test_the_table_covers_every_keyword_of_the_survey():
    """The table's functions and keywords: those of webdataset 0.2.x and 1.0.2 named in the
    module docstring (written out here, since webdataset need not be installed)."""
    covered = {}
    for function, keyword, *_ in TABLE:
        covered.setdefault(function, set()).update(k.strip() for k in keyword.split(","))
    for function in ("url_opener", "tar_file_iterator", "tar_file_expander", "group_by_keys", "WebDataset",
                     "TarWriter", "ShardWriter", "Decoder"):
        assert function in covered
    assert {"handler", "select_files", "rename_files", "eof_value"} <= covered["tar_file_expander"]
    assert {"keys", "lcase", "suffixes", "handler"} <= covered["group_by_keys"]
    assert {"handler", "mode", "resampled", "repeat", "shardshuffle", "cache_size", "cache_dir", "url_to_name",
            "detshuffle", "nodesplitter", "workersplitter", "select_files", "rename_files", "empty_check",
            "verbose", "seed"} <= covered["WebDataset"]
    assert {"user", "group", "mode", "compress", "encoder", "keep_meta", "mtime", "format"} <= covered["TarWriter"]
