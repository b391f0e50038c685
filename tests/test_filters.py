"""Pipeline stages (wdsmp.filters, with wdsmp.stages.fields, wdsmp.stages.batching, wdsmp.stages.base).

Each stage's generator is run on lists of dicts; a few tests run stages
through DataPipeline on real shards written with wdsmp's TarWriter.
"""

import io
import pickle
import random
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import wdsmp
import wdsmp.stages.batching as B
import wdsmp.stages.fields as FL
import wdsmp.filters as F
from wdsmp.errors import DecodeError, SampleError
from wdsmp.handlers import ignore_and_continue, ignore_and_stop, reraise_exception
from wdsmp.pipeline import DataPipeline
from wdsmp.shardlists import SimpleShardList
from wdsmp.tariterators import tarfile_to_samples


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS", "WDS_SECURE"):
        monkeypatch.delenv(name, raising=False)


def make_samples(n, url="shard-0.tar"):
    return [{"__key__": f"k{i:03d}", "__url__": url, "cls": i, "txt": f"text {i}"}
            for i in range(n)]


def run(stage, data):
    """Run a curried stage or a PipelineStage on a list."""
    if isinstance(stage, wdsmp.PipelineStage):
        return list(stage.run(iter(data)))
    return list(stage(iter(data)))


# User functions at module level, so that stages holding them pickle.


def double_cls(sample):
    return dict(sample, cls=sample["cls"] * 2)


def fail_on_odd(sample):
    if sample["cls"] % 2:
        raise ZeroDivisionError(f"odd {sample['cls']}")
    return sample


def is_even(sample):
    return sample["cls"] % 2 == 0


def add_one(x):
    return x + 1


def negate(x):
    return -x


def invert(x):
    return 1 // x


def extra_for(key):
    return {"extra": key.upper()}


def fail_on_odd_key(key):
    if int(key[1:]) % 2:
        raise ZeroDivisionError(key)
    return {"extra": key}


def x_if_even(sample):
    return {"x": 1} if is_even(sample) else None


def take_two(data, n=2):
    return iter(list(data)[:n])


def upper_text(stream):
    return stream.read().decode().upper()


# -- the module's surface

WEBDATASET_NAMES = """
FilterFunction RestCurried pipelinefilter reraise_exception identity compose2 compose pipeline
getfirst parse_field_spec transform_with info pick shuffle detshuffle select log_keys decode map
rename associate map_dict to_tuple map_tuple combine_values tuple2dict dict2tuple
default_collation_fn batched unlisted unbatched rsample slice extract_keys rename_keys decode_bin
decode_text decode_pickle default_decoders find_decoder xdecode Cached LMDBCached
""".split()


def test_every_webdataset_name_is_exported():
    assert set(WEBDATASET_NAMES) <= set(F.__all__)
    for name in F.__all__:
        assert getattr(F, name) is not None, name
    assert F.reraise_exception is reraise_exception and F.FilterFunction is F.Curried


def test_currying():
    stage = F.map(add_one)
    assert isinstance(stage, F.Curried) and stage.args == (add_one,)
    assert repr(stage).startswith("<_map ") and F.map.__name__ == "map"
    assert repr(F.map) == "<stage map>" and "None drops it" in F.map.__doc__
    assert isinstance(F.map, F.RestCurried)
    assert list(F.pipelinefilter(take_two)(n=3)(iter("abcde"))) == ["a", "b", "c"]


PICKLE_CASES = [
    (F.info(n=0), make_samples(3)),
    (F.log_keys(), make_samples(3)),
    (F.shuffle(5, seed=1), make_samples(9)),
    (F.detshuffle(5, seed=1, epoch=2), make_samples(9)),
    (F.rsample(1.0), make_samples(3)),
    (F.slice(1, 3), make_samples(5)),
    (F.select(is_even, handler=ignore_and_continue), make_samples(5)),
    (F.map(double_cls), make_samples(3)),
    (F.map_dict(cls=add_one), make_samples(3)),
    (F.map_tuple(add_one, None), [(1, 2), (3, 4)]),
    (F.associate(extra_for), make_samples(3)),
    (F.to_tuple("cls", "txt;png", "__key__"), make_samples(3)),
    (F.rename(label="cls", keep=False), make_samples(3)),
    (F.extract_keys("cls", "*txt"), make_samples(3)),
    (F.rename_keys(("c", "cls"), keep_unselected=True), make_samples(3)),
    (F.xdecode(txt=False, cls=False), make_samples(3)),
    (F.decode(), [{"__key__": "a", "cls": b"3"}]),
    (F.batched(2), [(i, float(i)) for i in range(5)]),
    (F.unbatched(), [(np.arange(3), np.ones(3))]),
    (F.unlisted(), [[1, 2], [3]]),
    (F.pipe(take_two, n=1), [1, 2, 3]),
    (F.map_stream(take_two), [1, 2, 3]),
    (F.Cached(), [1, 2, 3]),
]


def same(a, b):
    """Equality through nested containers of arrays and tensors."""
    if isinstance(a, (np.ndarray, torch.Tensor)):
        return type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


@pytest.mark.parametrize("stage, data", PICKLE_CASES,
                         ids=[repr(s)[:30] for s, _ in PICKLE_CASES])
def test_every_stage_pickles(stage, data):
    copy = pickle.loads(pickle.dumps(stage))
    assert type(copy) is type(stage)
    assert same(run(copy, data), run(stage, data))


# -- composing and helpers


def test_compose_pipeline_pipe():
    f = F.compose(add_one, negate, add_one)
    assert f(1) == -1 and pickle.loads(pickle.dumps(f))(1) == -1
    assert F.compose2(add_one, negate)(1) == -2
    assert F.pipeline(3, add_one, negate) == -4 and F.pipeline(3) == 3
    with pytest.raises(ValueError, match="at least one"):
        F.compose()
    assert list(F.pipe(take_two, n=1)(iter("abc"))) == ["a"]
    assert F.map_stream is F.pipe


def test_getfirst_and_specs():
    sample = {"__key__": "k", "__url__": "u.tar", "png": 1, "cls": 2}
    assert F.getfirst(sample, "jpg;png") == 1 and F.getfirst(sample, ["cls", "png"]) == 2
    assert F.getfirst(sample, "jpg", default=7, missing_is_error=False) == 7
    with pytest.raises(SampleError, match=r"no field 'jpg;gif'.*'__key__', '__url__', 'png', "
                                          r"'cls'.*shard 'u.tar', member 'k'"):
        F.getfirst(sample, "jpg;gif")
    with pytest.raises(ValueError, match="contains a space"):
        F.getfirst(sample, "jpg png")
    assert F.parse_field_spec("jpg;png cls") == [["jpg", "png"], ["cls"]]
    assert F.parse_field_spec(["a;b"]) == [["a", "b"]]
    assert F.transform_with([1, 2, 3], [add_one, None]) == [2, 2, 3]
    assert F.transform_with((1, 2), None) == (1, 2)
    with pytest.raises(ValueError, match="3 transformers for a sample of 2"):
        F.transform_with([1, 2], [None, None, None])


# -- looking at the stream


def test_info():
    out = io.StringIO()
    data = make_samples(7)
    assert list(F._info(data, n=2, every=3, width=6, stream=out, name="here")) == data
    text = out.getvalue()
    assert text.count("--- here") == 4  # samples 0, 1, then 3rd and 6th
    assert "__key__ 'k000'" in text and "txt 'text " in text and "'text 0'" not in text
    out = io.StringIO()
    list(F._info(data[:2], fmt="{__key__}:{cls}", stream=out))
    list(F._info([(1, 2)], fmt="{1}-{0}", stream=out))
    assert out.getvalue() == "k000:0\nk001:1\n2-1\n"


def test_info_writes_to_current_stderr(monkeypatch):
    out = io.StringIO()
    stage = F.info(n=1)
    monkeypatch.setattr(sys, "stderr", out)  # replaced after the stage was made
    run(stage, make_samples(2))
    assert out.getvalue().count("---") == 1


def test_log_keys(tmp_path):
    data = [dict(s, __worker__=1, __rank__=0) for s in make_samples(3)]
    assert list(F._log_keys(data)) == data
    logfile = tmp_path / "keys.log"
    assert list(F._log_keys(data, str(logfile))) == data
    assert list(F._log_keys(data[:1], str(logfile))) == data[:1]
    lines = logfile.read_text().splitlines()
    assert lines == ["0\t1\t0\tk000", "1\t1\t0\tk001", "2\t1\t0\tk002", "0\t1\t0\tk000"]


# -- shuffling and sampling


def test_pick():
    buf = [1, 2, 3]
    picked = [F.pick(buf, random.Random(0)) for _ in range(3)]
    assert sorted(picked) == [1, 2, 3] and buf == []


def test_shuffle_is_a_local_permutation():
    data = list(range(200))
    out = list(F._shuffle(iter(data), bufsize=10, initial=5, seed=0))
    assert sorted(out) == data and out != data
    assert out[0] < 5  # the first comes out once `initial` items are buffered
    assert all(x <= 2 * i + 10 for i, x in enumerate(out))  # never from further than the buffer
    # the buffer grows from `initial` to `bufsize`: late items can come from far ahead
    grown = list(F._shuffle(iter(data), bufsize=50, initial=5, seed=0))
    assert grown[0] < 5 and max(x - i for i, x in enumerate(grown)) > 20
    assert list(F._shuffle(data, bufsize=1)) == data  # a buffer of one cannot reorder
    assert list(F._shuffle([], 10)) == []
    # initial is clamped to bufsize: items come out although initial is never reached
    assert sorted(F._shuffle(data[:6], bufsize=2, initial=100, seed=1)) == data[:6]
    with pytest.raises(ValueError, match="rng or seed"):
        list(F._shuffle(data, rng=random.Random(1), seed=1))


def test_shuffle_seeds():
    data = list(range(100))
    seeded = [list(F._shuffle(data, 50, seed=7)) for _ in range(2)]
    assert seeded[0] == seeded[1] and seeded[0] != data
    assert list(F._shuffle(data, 50, seed=8)) != seeded[0]
    assert list(F._shuffle(data, 50, rng=random.Random(3))) == \
        list(F._shuffle(data, 50, rng=random.Random(3)))
    unseeded = [list(F._shuffle(data, 50)) for _ in range(2)]
    assert unseeded[0] != unseeded[1]


def test_shuffle_differs_per_worker_and_node(monkeypatch):
    data = list(range(100))
    stage = F.shuffle(50, seed=7)  # made in the "main process", iterated in "workers"
    orders = {}
    for rank, worker in [(0, 0), (0, 1), (1, 0)]:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("WORKER", str(worker))
        monkeypatch.setenv("NUM_WORKERS", "2")
        orders[rank, worker] = run(stage, data)
        assert run(pickle.loads(pickle.dumps(stage)), data) == orders[rank, worker]
    assert len({tuple(o) for o in orders.values()}) == 3


def test_detshuffle_epochs(monkeypatch):
    data = list(range(60))
    stage = F.detshuffle(30, seed=5)
    epochs = [run(stage, data) for _ in range(3)]
    assert stage.epoch == 2 and len({tuple(e) for e in epochs}) == 3
    assert [run(F.detshuffle(30, seed=5), data) for _ in range(1)] == epochs[:1]
    # as in webdataset, `epoch` is the one before the first iteration
    assert [run(F.detshuffle(30, seed=5, epoch=e - 1), data) for e in range(3)] == epochs
    # webdataset's order: its generator is seeded with seed + epoch
    assert epochs[2] == list(F._shuffle(data, 30, 100, rng=random.Random(5 + 2)))
    stage.set_epoch(1)
    assert run(stage, data) == run(stage, data) == epochs[1] and stage.epoch == 1  # pinned
    assert run(F.detshuffle(30, seed=6, epoch=0), data) != epochs[1]
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "2")
    assert run(stage, data) == epochs[1]  # the same order in every worker, to split after it
    copy = pickle.loads(pickle.dumps(stage))
    assert copy.epoch == 1 and run(copy, data) == epochs[1]
    stage.epoch = 2  # webdataset's attribute, assigned
    assert run(stage, data) == epochs[2] and copy.epoch == 1


def test_rsample():
    data = list(range(2000))
    assert list(F._rsample(data, 0.0)) == [] and list(F._rsample(data, 1.0)) == data
    random.seed(1)
    kept = list(F._rsample(data, 0.25))
    assert 400 < len(kept) < 600 and kept == sorted(kept)
    with pytest.raises(ValueError, match="p must be in"):
        list(F._rsample(data, 1.5))


def test_slice():
    assert run(F.slice(3), range(10)) == [0, 1, 2]
    assert run(F.slice(1, 8, 3), range(10)) == [1, 4, 7]


# -- user functions and their handlers


def notes(exn):
    return "\n".join(getattr(exn, "__notes__", []))


def test_map():
    data = make_samples(3)
    assert [s["cls"] for s in F._map(data, double_cls)] == [0, 2, 4]
    assert list(F._map([1, 2], add_one)) == [2, 3]
    assert list(F._map([{"__key__": "a"}], dict)) == [{"__key__": "a"}]
    assert list(F._map(data, is_even)) == [True, False, True]
    # None drops an item; a new dict gets the sample's __key__
    out = list(F._map(data, x_if_even))
    assert out == [{"x": 1, "__key__": "k000"}, {"x": 1, "__key__": "k002"}]


@pytest.mark.parametrize("stage, data, field", [
    (F.map(fail_on_odd), make_samples(4), None),
    (F.select(fail_on_odd), make_samples(4), None),
    (F.map_dict(cls=invert), [dict(s, cls=(i + 1) % 2) for i, s in enumerate(make_samples(4))],
     "field 'cls'"),
    (F.associate(fail_on_odd_key), make_samples(4), None),
])
def test_handler_policies(stage, data, field):
    with pytest.raises(ZeroDivisionError) as info:
        run(stage, data)
    name = stage.f.__name__.lstrip("_")
    where = f"in wdsmp stage {name}, sample 'k001', shard 'shard-0.tar'"
    assert notes(info.value) == (f"{where}, {field}" if field else where)
    assert len(run(F.Curried(stage.f, *stage.args, **dict(stage.kw, handler=ignore_and_continue)),
                   data)) == 2
    assert len(run(F.Curried(stage.f, *stage.args, **dict(stage.kw, handler=ignore_and_stop)),
                   data)) == 1
    seen = []
    run(F.Curried(stage.f, *stage.args, **dict(stage.kw, handler=seen.append)), data)
    assert len(seen) == 1 and isinstance(seen[0], Exception)  # None from a handler stops


def test_error_keeps_type_and_message():
    with pytest.raises(ZeroDivisionError) as info:
        list(F._map(make_samples(2), fail_on_odd))
    assert str(info.value) == "odd 1"
    assert notes(info.value) == "in wdsmp stage map, sample 'k001', shard 'shard-0.tar'"
    with pytest.raises(ZeroDivisionError) as info:
        list(F._map_tuple([(1, 1, 0)], None, add_one, invert))
    assert notes(info.value) == "in wdsmp stage map_tuple, position 2"
    with pytest.raises(TypeError, match="map_tuple needs tuple"):
        list(F._map_tuple([{"a": 1}], add_one))


def test_select():
    assert [s["cls"] for s in F._select(make_samples(5), is_even)] == [0, 2, 4]


def test_map_dict():
    data = make_samples(2)
    out = list(F._map_dict(data, cls=add_one, txt=str.upper))
    assert [(s["cls"], s["txt"]) for s in out] == [(1, "TEXT 0"), (2, "TEXT 1")]
    assert data[0]["cls"] == 0  # the input sample is not modified
    with pytest.raises(SampleError, match=r"map_dict: no field 'jpg'; the sample has fields "
                                          r"'__key__', '__url__', 'cls', 'txt' \(shard "
                                          r"'shard-0.tar', member 'k000'\)") as info:
        list(F._map_dict(data, jpg=add_one))
    assert info.value.url == "shard-0.tar" and info.value.member == "k000"
    assert len(list(F._map_dict(data, handler=ignore_and_continue, jpg=add_one))) == 0
    with pytest.raises(ValueError, match="at least one"):
        list(F._map_dict(data))
    with pytest.raises(TypeError, match="cls=3 is not callable"):
        list(F._map_dict(data, cls=3))
    with pytest.raises(TypeError, match="map_dict needs dict samples, not tuple"):
        list(F._map_dict([(1,)], cls=add_one))


def test_map_tuple():
    assert list(F._map_tuple([(1, 2, 3), [4, 5, 6]], add_one, None)) == [(2, 2, 3), (5, 5, 6)]
    assert list(F._map_tuple([(1,)], add_one, negate)) == [(2,)]
    with pytest.raises(TypeError, match="function 1"):
        list(F._map_tuple([(1, 2)], add_one, 5))


def test_associate():
    data = make_samples(2)
    assert [s["extra"] for s in F._associate(data, extra_for)] == ["K000", "K001"]
    table = {"k001": {"extra": 1}}
    assert [s.get("extra") for s in F._associate(data, table)] == [None, 1]
    assert "extra" not in data[1]
    with pytest.raises(SampleError, match="associate: no field '__key__'"):
        list(F._associate([{"cls": 1}], table))


# -- fields


def test_to_tuple():
    data = make_samples(2)
    data[1]["png"] = data[1].pop("txt")
    assert list(FL._to_tuple(data, "txt;png", "cls", "__key__")) == \
        [("text 0", 0, "k000"), ("text 1", 1, "k001")]
    assert list(FL._to_tuple(data, "__key__ cls")) == [("k000", 0), ("k001", 1)]
    with pytest.raises(SampleError, match=r"to_tuple: no field 'jpg;gif'; the sample has fields "
                                          r"'__key__', '__url__', 'cls', 'txt'"):
        list(FL._to_tuple(data, "cls", "jpg;gif"))
    # none_is_error follows missing_is_error unless given
    assert list(FL._to_tuple(data, "png", missing_is_error=False)) == [(None,), ("text 1",)]
    with pytest.raises(SampleError, match=r"field 'png' is None.*member 'k000'"):
        list(FL._to_tuple(data, "png", missing_is_error=False, none_is_error=True))
    with pytest.raises(SampleError, match="field 'x' is None"):
        list(FL._to_tuple([{"x": None}], "x"))
    assert list(FL._to_tuple(data, "png", handler=ignore_and_continue)) == [("text 1",)]
    with pytest.raises(TypeError, match="to_tuple needs dict samples"):
        list(FL._to_tuple([(1,)], "x"))


def test_rename():
    data = make_samples(1)
    assert list(FL._rename(data, label="cls;txt")) == \
        [{"__key__": "k000", "__url__": "shard-0.tar", "label": 0}]
    assert list(FL._rename(data, keep=False, label="x;cls", text="txt")) == \
        [{"label": 0, "text": "text 0"}]
    with pytest.raises(SampleError, match=r"rename: no field 'jpg;png'.*'cls', 'txt'"):
        list(FL._rename(data, image="jpg;png"))


def test_extract_keys():
    data = [{"__key__": "a", "img.jpg": 1, "seg.png": 2, "cls": 3}]
    assert list(FL._extract_keys(data, "*.jpg", "*.png;*.gif", "cls")) == [(1, 2, 3)]
    assert list(FL._extract_keys(data, "*.jpg", "*.tif", ignore_missing=True)) == [(1,)]
    with pytest.raises(SampleError, match=r"no field matches '\*.tif'.*'img.jpg'"):
        list(FL._extract_keys(data, "*.tif"))
    with pytest.raises(SampleError, match=r"fields \['img.jpg', 'seg.png'\] all match"):
        list(FL._extract_keys(data, "*.jpg;*.png"))
    assert list(FL._extract_keys(data, "*g", duplicate_is_error=False)) == [(1,)]
    assert list(FL._extract_keys([{"jpg": 1, "cls": 2}], "*.jpg", "*.cls")) == [(1, 2)]


def test_rename_keys():
    data = [{"__key__": "a", "dir/IMG.JPG": 1, "x.png": 2, "cls": 3}]
    assert list(FL._rename_keys(data, ("image", "*.jpg"), label="cls")) == \
        [{"image": 1, "label": 3}]
    assert list(FL._rename_keys(data, ("image", "*.jpg"), keep_unselected=True)) == \
        [{"__key__": "a", "image": 1, "x.png": 2, "cls": 3}]
    assert list(FL._rename_keys(data, ("a", "*.*"), ("b", "*.png"), duplicate_is_error=False)) \
        == [{"a": 1, "b": 2}]  # later renamings win
    with pytest.raises(SampleError, match=r"two fields renamed to 'a'"):
        list(FL._rename_keys(data, ("a", "*.*")))
    with pytest.raises(SampleError, match=r"no field matches \['\*.tif'\]"):
        list(FL._rename_keys(data, ("a", "*.tif"), ("b", "*.png")))
    assert list(FL._rename_keys(data, ("b", "*.png"), ("a", "*.tif"), must_match=False)) == \
        [{"b": 2}]


# -- decoding


def image_bytes(fmt, size=(6, 4)):
    image = Image.fromarray(np.arange(size[0] * size[1] * 3, dtype=np.uint8)
                            .reshape(size[1], size[0], 3))
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def _hostile_pickle(path):
    """Bytes that create ``path`` when unpickled (through ``builtins.open``)."""
    return pickle.dumps(_Opener(str(path)))


class _Opener:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import builtins

        return (builtins.open, (self.path, "w"))


def test_xdecode_refuses_pickles_the_pipeline_did_not_ask_for(tmp_path):
    marker = tmp_path / "ran"
    shard = str(tmp_path / "s.tar")
    with wdsmp.TarWriter(shard) as sink:
        sink.write({"__key__": "k", "txt": "hello", "cls": "3", "pyd": _hostile_pickle(marker)})
    dataset = wdsmp.WebDataset(shard, shardshuffle=False).xdecode(txt=F.decode_text, cls=F.decode_text)
    with pytest.raises(DecodeError, match="refusing to unpickle.*unsafe=True"):
        list(dataset)
    assert not marker.exists()  # nothing ran
    with pytest.raises(DecodeError, match="refusing to unpickle"):  # named explicitly: the same
        list(FL._xdecode([{"__key__": "k", "x.pkl": b"data"}], ("*.pkl", F.decode_pickle)))
    kept = next(iter(wdsmp.WebDataset(shard, shardshuffle=False).xdecode(cls=False, pyd=False)))
    assert kept["pyd"] == _hostile_pickle(marker) and not marker.exists()
    list(wdsmp.WebDataset(shard, shardshuffle=False).xdecode(cls=F.decode_text, unsafe=True))
    assert marker.exists()  # the caller said the data is trusted


def test_xdecode():
    sample = {"__key__": b"k", "a.txt": b"hello", "b.bin": b"\x00", "c.pyd": pickle.dumps([1]),
              "cls": b"3", "seg.png": image_bytes("PNG")}
    out = next(FL._xdecode([sample], ("*.png", "rgb8"), cls=upper_text, unsafe=True))
    assert out["__key__"] == b"k" and out["a.txt"] == "hello" and out["b.bin"] == b"\x00"
    assert out["c.pyd"] == [1] and out["cls"] == "3"
    assert np.array_equal(out["seg.png"], np.asarray(Image.open(io.BytesIO(sample["seg.png"]))))
    assert next(FL._xdecode([sample], ("*.png", False), cls=False, pyd=False))["seg.png"] == sample["seg.png"]
    with pytest.raises(SampleError, match=r"xdecode: no decoder for field 'cls'"):
        list(FL._xdecode([sample], unsafe=True))
    assert next(FL._xdecode([sample], must_decode=False, unsafe=True))["cls"] == b"3"
    with pytest.raises(UnicodeDecodeError) as info:
        list(FL._xdecode([dict(sample, __url__="u.tar")], ("*.png", upper_text), cls=False, pyd=False))
    assert notes(info.value) == "in wdsmp stage xdecode, sample b'k', shard 'u.tar', " \
                                "field 'seg.png'"
    with pytest.raises(ValueError, match="image spec 'rgb8' does not decode 'cls'"):
        list(FL._xdecode([sample], ("*.png", "rgb8"), cls="rgb8", pyd=False))
    assert F.find_decoder(F.default_decoders, "x/__meta__") is F.identity
    assert F.find_decoder(F.default_decoders, "d/X.TXT") is F.decode_text
    assert F.find_decoder(F.default_decoders, "jpg") is None


def test_decode_pickle_refused_when_secure(monkeypatch):
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(ValueError, match="WDS_SECURE"):
        list(FL._xdecode([{"c.pyd": pickle.dumps(1)}], unsafe=True))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        list(FL._xdecode([{"c.pyd": pickle.dumps(1)}]))


def test_decode_delegates_to_autodecode():
    png = image_bytes("PNG")
    data = [{"__key__": "a", "__url__": "u.tar", "png": png, "cls": b"3", "txt": b"hi"},
            {"__key__": "b", "__url__": "u.tar", "png": b"not an image", "cls": b"4"}]
    out = list(F._decode(data, "rgb8", handler=ignore_and_continue))
    assert len(out) == 1 and out[0]["cls"] == 3 and out[0]["txt"] == "hi"
    assert np.array_equal(out[0]["png"], np.asarray(Image.open(io.BytesIO(png))))
    with pytest.raises(DecodeError, match=r"shard 'u.tar', member 'b.png'") as info:
        list(F._decode(data, "rgb8"))
    assert not notes(info.value)  # a wdsmp error names the place itself: no note
    assert next(F._decode(data, only=["cls"]))["png"] == png
    assert next(F._decode(data, shout_text))["txt"] == "HI!"


def shout_text(key, data):
    """A decode handler: it takes .txt fields, and leaves the rest to the next handlers."""
    return data.decode().upper() + "!" if key == ".txt" else None


# -- batching


def test_collation_of_each_type():
    samples = [{"__key__": f"k{i}", "i": i, "f": i / 2, "b": i == 1, "s": str(i), "y": b"y",
                "a": np.full((2, 3), i, np.uint8), "t": torch.full((3,), i),
                "d": {"n": i}, "l": [i], "n": None, "i64": np.int64(i), "f64": np.float64(i)}
               for i in range(3)]
    batch = F.default_collation_fn(samples)
    assert list(batch) == list(samples[0])  # fields keep their order
    assert batch["__key__"] == ["k0", "k1", "k2"] and batch["s"] == ["0", "1", "2"]
    assert batch["i"].dtype == np.int64 and batch["i"].tolist() == [0, 1, 2]
    assert batch["f"].dtype == np.float64 and batch["f"].tolist() == [0.0, 0.5, 1.0]
    assert batch["b"].dtype == np.bool_ and batch["b"].tolist() == [False, True, False]
    assert batch["y"] == [b"y"] * 3 and batch["n"] == [None] * 3 and batch["l"] == [[0], [1], [2]]
    assert batch["d"] == [{"n": 0}, {"n": 1}, {"n": 2}]  # nested dicts: a list, as webdataset
    assert batch["a"].shape == (3, 2, 3) and batch["a"].dtype == np.uint8
    assert isinstance(batch["t"], torch.Tensor) and batch["t"].shape == (3, 3)
    assert batch["i64"] == [0, 1, 2] and isinstance(batch["i64"], list)  # as webdataset
    assert isinstance(batch["f64"], np.ndarray)  # np.float64 is a float
    tuples = F.default_collation_fn([(1, "a", np.zeros(2)), (2, "b", np.ones(2))])
    assert isinstance(tuples, tuple) and tuples[0].tolist() == [1, 2] and tuples[1] == ["a", "b"]
    assert tuples[2].tolist() == [[0, 0], [1, 1]]
    kept = F.default_collation_fn([(1, np.zeros(2))] * 2, combine_tensors=False,
                                  combine_scalars=False)
    assert kept[0] == [1, 1] and isinstance(kept[1], list) and len(kept[1]) == 2
    assert isinstance(F.combine_values([torch.ones(1)] * 2, combine_tensors=False), list)
    assert F.tuple2dict((5, 6)) == {0: 5, 1: 6} and F.dict2tuple({1: 6, 0: 5}) == (5, 6)


def test_collation_of_bare_arrays_is_a_dict_by_row():
    # a sample that is neither a dict nor a tuple/list (an array, a tensor) is taken apart
    # along its first axis, and the batch is a dict of those positions, as in webdataset
    batch = F.default_collation_fn([np.arange(6).reshape(2, 3), np.ones((2, 3), np.int64)])
    assert isinstance(batch, dict) and list(batch) == [0, 1]
    assert batch[0].tolist() == [[0, 1, 2], [1, 1, 1]] and batch[1].tolist() == [[3, 4, 5], [1, 1, 1]]
    tensors = F.default_collation_fn([torch.zeros(2), torch.ones(2)])
    assert isinstance(tensors, dict) and tensors[1].tolist() == [0.0, 1.0]
    assert isinstance(F.default_collation_fn([[1, 2], [3, 4]]), tuple)  # lists: a tuple


def test_collation_errors():
    bad = [{"img": np.zeros((2, 3))}, {"img": np.zeros((2, 3))}, {"img": np.zeros((3, 3))}]
    with pytest.raises(ValueError, match=r"cannot collate field 'img': sample 0 has shape "
                                         r"\(2, 3\), sample 2 has shape \(3, 3\)"):
        F.default_collation_fn(bad)
    with pytest.raises(ValueError, match=r"position 1: sample 0 has shape \(2,\), sample 1 "
                                         r"has shape \(3,\)"):
        F.default_collation_fn([(0, torch.zeros(2)), (1, torch.zeros(3))])
    with pytest.raises(ValueError, match=r"position 0: .*sample 1 has shape None"):
        F.default_collation_fn([(np.zeros(2),), ([0, 0],)])
    with pytest.raises(ValueError, match=r"different fields: sample 0 has \['a'\], sample 1 has "
                                         r"\['b'\]"):
        F.default_collation_fn([{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="different positions"):
        F.default_collation_fn([(1, 2), (1,)])
    with pytest.raises(ValueError, match="empty"):
        F.default_collation_fn([])


def test_batched_partial_and_lists():
    data = [(i, float(i)) for i in range(7)]
    batches = run(F.batched(3), data)
    assert [len(b[0]) for b in batches] == [3, 3, 1]
    assert batches[2][0].tolist() == [6] and batches[0][1].tolist() == [0.0, 1.0, 2.0]
    assert [len(b[0]) for b in run(F.batched(3, partial=False), data)] == [3, 3]
    assert run(F.batched(3, collation_fn=None), data[:4]) == [data[:3], data[3:4]]
    assert run(F.batched(7, partial=False), data)[0][0].tolist() == list(range(7))
    assert run(F.batched(2), []) == []
    with pytest.raises(ValueError, match="positive int"):
        run(F.batched(0), data)


def test_batches_come_out_when_full():
    source = iter(range(10))
    stage = B._batched(source, 2, collation_fn=None)
    assert next(stage) == [0, 1] and next(source) == 2  # it did not wait for a third item


def test_unbatched_inverts_batched():
    tuples = [(i, float(i), f"s{i}", np.full(2, i)) for i in range(5)]
    again = run(F.unbatched(), run(F.batched(2), tuples))
    assert [a[:3] for a in again] == [b[:3] for b in tuples]
    assert len(again) == 5 and all(np.array_equal(a[3], b[3]) for a, b in zip(again, tuples))
    dicts = make_samples(5)
    assert run(F.unbatched(), run(F.batched(3), dicts)) == dicts
    assert run(F.unlisted(), run(F.batched(2, collation_fn=None), dicts)) == dicts
    with pytest.raises(ValueError, match="different lengths"):
        run(F.unbatched(), [{"a": [1, 2], "b": [1]}])
    with pytest.raises(ValueError, match="unknown batch type int"):
        run(F.unbatched(), [3])
    with pytest.raises(TypeError, match="unlisted needs list batches"):
        run(F.unlisted(), [(1, 2)])


# -- caching


class CountingSource:
    def __init__(self, n):
        self.n = n
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(range(self.n))


def test_cached():
    source = CountingSource(4)
    stage = F.Cached()
    assert list(stage.run(source)) == [0, 1, 2, 3]
    assert list(stage.run(source)) == [0, 1, 2, 3] and source.passes == 1
    partial = F.Cached()
    assert next(partial.run(iter(range(3)))) == 0
    assert partial.cached is None  # an unfinished pass is not kept


class FakeLMDB:
    """Just enough of lmdb's API: environments whose transactions are dicts, sorted cursors."""

    stores = {}

    @classmethod
    def open(cls, fname, readonly, map_size):
        return cls(cls.stores.setdefault(fname, {}))

    def __init__(self, store):
        self.store = store

    def begin(self, write):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def get(self, key):
        return self.store.get(key)

    def put(self, key, value):
        self.store[key] = value

    def cursor(self):
        return sorted(self.store.items())


def test_lmdb_cached(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "lmdb", FakeLMDB)
    fname = str(tmp_path / "db")
    data = make_samples(5)
    stage = F.LMDBCached(fname, chunksize=2)
    assert run(stage, data) == data
    copy = pickle.loads(pickle.dumps(stage))  # the open database stays behind
    assert copy.db is None and run(copy, []) == data and run(stage, []) == data
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(ImportError, match="pip install lmdb"):
        run(F.LMDBCached(str(tmp_path / "db2")), data)


# -- through DataPipeline, on real shards


def write_shards(tmp_path, nshards, per_shard):
    urls = []
    for s in range(nshards):
        path = tmp_path / f"shard-{s}.tar"
        with wdsmp.TarWriter(str(path)) as writer:
            for i in range(per_shard):
                writer.write({"__key__": f"s{s}_{i:02d}", "png": image_bytes("PNG", (4, 2)),
                              "cls": str(s * 100 + i), "txt": f"t{i}"})
        urls.append(str(path))
    return urls


def test_pipeline_on_shards(tmp_path):
    urls = write_shards(tmp_path, 2, 5)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), F.shuffle(4, seed=1),
                           F.decode("rgb8"), F.to_tuple("jpg;png", "cls", "__key__"),
                           F.map_tuple(None, add_one), F.batched(4))
    batches = list(dataset)
    assert [len(b[2]) for b in batches] == [4, 4, 2]
    assert batches[0][0].shape == (4, 2, 4, 3) and batches[0][0].dtype == np.uint8
    labels = np.concatenate([b[1] for b in batches]).tolist()
    assert sorted(labels) == [1, 2, 3, 4, 5, 101, 102, 103, 104, 105]
    assert [b[2] for b in list(dataset)] == [b[2] for b in batches]  # seeded: the same order
    assert sorted(k for b in batches for k in b[2]) == [f"s{s}_{i:02d}" for s in (0, 1)
                                                         for i in range(5)]


def test_pipeline_errors_name_shard_and_key(tmp_path):
    urls = write_shards(tmp_path, 2, 2)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), F.to_tuple("jpg", "cls"))
    with pytest.raises(SampleError) as info:
        list(dataset)
    assert info.value.url == urls[0] and info.value.member == "s0_00"
    assert "no field 'jpg'; the sample has fields '__key__', '__url__', 'cls', " \
        "'png', 'txt'" in str(info.value)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(),
                           F.map_dict(cls=int), F.map(fail_on_odd))
    with pytest.raises(ZeroDivisionError) as info:
        list(dataset)
    assert notes(info.value) == f"in wdsmp stage map, sample 's0_01', shard {urls[0]!r}"
    skipping = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), F.map_dict(cls=int),
                            F.map(fail_on_odd, handler=ignore_and_continue))
    assert [s["__key__"] for s in skipping] == ["s0_00", "s1_00"]


def test_pipeline_set_epoch_reaches_detshuffle(tmp_path):
    urls = write_shards(tmp_path, 1, 8)
    stage = F.detshuffle(8, seed=3)
    dataset = DataPipeline(SimpleShardList(urls), tarfile_to_samples(), stage,
                           F.to_tuple("__key__"))
    dataset.set_epoch(4)
    first = list(dataset)
    assert list(dataset) == first and stage.epoch == 4
    dataset.set_epoch(5)
    assert list(dataset) != first
