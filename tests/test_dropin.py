"""webdataset code run unchanged with ``import wdsmp as wds``.

Each test is data-loading code written the way training projects write it
for webdataset (their own stages, shard shuffles keyed on a shared epoch in
persistent DataLoader workers, a copied ``tarfile_to_samples`` with its own
grouping, a patched ``url_opener``, the fluid API with a cache, ``except``
clauses for webdataset's exceptions), taking the library as an argument. It
checks the results webdataset documents; when webdataset 1.0.2 is installed
the same code runs with it too and must give the same results (without it
those comparisons are skipped: the suite never needs webdataset).
"""

import multiprocessing
import os
import random
import tarfile

import numpy as np
import pytest
import torch.utils.data

import wdsmp
from .conftest import tar_bytes, write_tar
from .reference import libraries, make_shards, same_with_each


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS", "WDS_SECURE"):
        monkeypatch.delenv(name, raising=False)


def loader(dataset, **kw):
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True,
                                       multiprocessing_context="fork", **kw)


def url_and_worker(sample):
    return sample["__url__"], torch.utils.data.get_worker_info().id


def read(batches):
    """One epoch of ``(url, worker)`` items, sorted."""
    return sorted(tuple(item) for item in batches)


# -- shard shuffles keyed on the epoch, in persistent workers (image-text contrastive training)


def epoch_shard_shuffle(wds):
    """A project's shard shuffle stage: its order follows a seed and a shared epoch value."""

    class EpochShardShuffle(wds.PipelineStage):
        def __init__(self, shared_epoch, bufsize=100, seed=0):
            self.shared_epoch, self.bufsize, self.seed = shared_epoch, bufsize, seed

        def run(self, src):
            rng = random.Random(self.seed + self.shared_epoch.value)
            return wds.filters._shuffle(src, self.bufsize, self.bufsize, rng)

    return EpochShardShuffle


def shard_order(urls, seed):
    """The order a shuffle of ``urls`` with ``random.Random(seed)`` gives (webdataset's algorithm)."""
    shuffled = wdsmp.filters._shuffle(iter([{"url": u} for u in urls]), 100, 100, random.Random(seed))
    return [s["url"] for s in shuffled]


def test_epoch_keyed_shard_shuffle_in_persistent_workers(tmp_path):
    urls = make_shards(tmp_path, 6, 2)

    def user_code(wds):
        shared_epoch = multiprocessing.Value("i", 0)
        dataset = wds.DataPipeline(
            wds.SimpleShardList(urls),
            epoch_shard_shuffle(wds)(shared_epoch, seed=10),
            wds.split_by_node,
            wds.split_by_worker,
            wds.tarfile_to_samples(),
            wds.map(url_and_worker),
        ).with_epoch(4)  # samples per worker: two of its three shards
        batches = loader(dataset)
        epochs = []
        for epoch in range(3):
            shared_epoch.value = epoch
            epochs.append(read(batches))
        return epochs

    epochs = same_with_each(user_code)
    for epoch, got in enumerate(epochs):
        order = shard_order(urls, 10 + epoch)  # the epoch's order, then each worker's share
        expected = [(url, w) for w in (0, 1) for url in order[w::2][:2] for _ in range(2)]
        assert got == sorted(expected), f"epoch {epoch} read another epoch's shards"


def test_detshuffle_before_the_split_in_persistent_workers(tmp_path):
    urls = make_shards(tmp_path, 6, 2)

    def user_code(wds):
        dataset = wds.DataPipeline(wds.SimpleShardList(urls), wds.detshuffle(100, 100, seed=3),
                                   wds.split_by_worker, wds.tarfile_to_samples(), wds.map(url_and_worker))
        batches = loader(dataset)
        return [read(batches) for _ in range(3)]

    for epoch, got in enumerate(same_with_each(user_code)):
        order = shard_order(urls, 3 + epoch)  # the epoch advances with each iteration
        expected = [(url, w) for w in (0, 1) for url in order[w::2] for _ in range(2)]
        assert got == sorted(expected)  # every shard once: the workers agree on the order


def test_detshuffle_set_epoch_reaches_persistent_workers(tmp_path):
    urls = make_shards(tmp_path, 6, 1)
    shuffle = wdsmp.detshuffle(100, 100, seed=3)
    dataset = wdsmp.DataPipeline(wdsmp.SimpleShardList(urls), shuffle, wdsmp.split_by_worker,
                                 wdsmp.tarfile_to_samples(), wdsmp.map(url_and_worker))
    dataset.set_epoch(7)
    batches = loader(dataset)
    for epoch in (7, 2, 2, 5):
        dataset.set_epoch(epoch)
        order = shard_order(urls, 3 + epoch)
        assert read(batches) == sorted((url, w) for w in (0, 1) for url in order[w::2])


# -- a copied tarfile_to_samples with its own grouping (as several training codebases carry)


def group_by_keys_nothrow(data, keys=None, lcase=True, suffixes=None, handler=None):
    """A project's grouping that starts a new sample on a repeated suffix instead of raising
    (a shard may end with the key the next one starts with), and knows no end-of-shard marker."""
    keys = keys or wdsmp.tariterators.base_plus_ext
    current = None
    for filesample in data:
        fname, value = filesample["fname"], filesample["data"]
        prefix, suffix = keys(fname)
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        if current is None or prefix != current["__key__"] or suffix in current:
            if current is not None:
                yield current
            current = dict(__key__=prefix, __url__=filesample["__url__"])
        if suffixes is None or suffix in suffixes:
            current[suffix] = value
    if current is not None:
        yield current


def test_copied_tarfile_to_samples_with_eof_value_none(tmp_path):
    a = write_tar(tmp_path / "a.tar", [("x/0.txt", b"a0"), ("x/1.txt", b"a1")])
    b = write_tar(tmp_path / "b.tar", [("x/1.txt", b"b1"), ("x/2.txt", b"b2")])  # x/1 again

    def user_code(wds):
        def tarfile_to_samples_nothrow(src, handler=wds.warn_and_continue):
            streams = wds.tariterators.url_opener(src, handler=handler)
            files = wds.tariterators.tar_file_expander(streams, handler=handler, eof_value=None)
            return group_by_keys_nothrow(files, handler=handler)

        dataset = wds.DataPipeline(wds.SimpleShardList([a, b]), tarfile_to_samples_nothrow)
        return [(s["__key__"], s["__url__"], s["txt"]) for s in dataset]

    assert same_with_each(user_code) == [("x/0", a, b"a0"), ("x/1", a, b"a1"), ("x/1", b, b"b1"),
                                         ("x/2", b, b"b2")]


def test_tar_file_expander_eof_marker(tmp_path):
    a = write_tar(tmp_path / "a.tar", [("k.txt", b"a")])
    b = write_tar(tmp_path / "b.tar", [("k.txt", b"b")])

    def user_code(wds):
        streams = wds.tariterators.url_opener([{"url": a}, {"url": b}])
        members = list(wds.tariterators.tar_file_expander(streams, eof_value={}))
        grouped = wds.tariterators.group_by_keys(iter(members))  # {} ends a shard's last sample
        return [m if m == {} else m["fname"] for m in members], [s["txt"] for s in grouped]

    assert same_with_each(user_code) == (["k.txt", {}, "k.txt", {}], [b"a", b"b"])


def test_group_by_keys_with_a_project_key_function(tmp_path):
    url = write_tar(tmp_path / "frames.tar", [
        ("clip.0001.JPG", b"j1"), ("clip.0001.json", b"{}"), ("clip.0002.JPG", b"j2"), ("clip.0002.mp3", b"m"),
    ])

    def frame_keys(fname):
        """Keys up to the last dot: frame numbers stay in the key."""
        stem, dot, ext = fname.rpartition(".")
        return (stem, ext) if dot else (None, None)

    def user_code(wds):
        def samples(src, handler=wds.reraise_exception):
            files = wds.tariterators.tar_file_expander(wds.tariterators.url_opener(src, handler=handler))
            return wds.tariterators.group_by_keys(files, keys=frame_keys, lcase=False, suffixes={"JPG", "mp3"})

        return list(wds.DataPipeline(wds.SimpleShardList(url), samples))

    assert same_with_each(user_code) == [  # no __local_path__: url_opener adds none
        {"__key__": "clip.0001", "__url__": url, "JPG": b"j1"},
        {"__key__": "clip.0002", "__url__": url, "JPG": b"j2", "mp3": b"m"},
    ]


# -- a url_opener patched at import time (to log or sign URLs)


def test_url_opener_patched_at_import_time(tmp_path, monkeypatch):
    urls = make_shards(tmp_path, 2, 1)
    opened = []

    def user_code(wds):
        original = wds.tariterators.url_opener

        def logging_url_opener(data, handler=wds.reraise_exception, **kw):
            for source in original(data, handler=handler, **kw):
                opened.append(source["url"])
                yield source

        monkeypatch.setattr(wds.tariterators, "url_opener", logging_url_opener)
        return list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()))

    samples = same_with_each(user_code)
    assert opened == urls * len(libraries())
    assert samples == [{"__key__": f"s{i}/0", "__url__": urls[i], "txt": f"txt {i} 0".encode(),
                        "cls": str(100 * i).encode()} for i in range(2)]


# -- the fluid API: a cache, fixed-size epochs, lengths (retrieval inference)


def test_fluid_pipeline_with_cache_dir_and_epochs(tmp_path, http_server):
    shards = make_shards(tmp_path, 2, 3)
    urls = [http_server.put_file(f"data/{os.path.basename(s)}", open(s, "rb").read()) for s in shards]

    def user_code(wds):
        cache = tmp_path / f"cache-{wds.__name__}"
        cache.mkdir()
        dataset = wds.WebDataset(urls, cache_dir=str(cache), shardshuffle=False).decode().to_tuple("__key__", "cls")
        sized = not hasattr(dataset, "__len__")
        epochs = [list(dataset.with_epoch(4)) for _ in range(2)]  # each epoch starts over
        length = len(dataset.with_length(6, silent=True))
        return sized, epochs, length

    unsized, epochs, length = same_with_each(user_code)
    first = [(f"s0/{j}", j) for j in range(3)] + [("s1/0", 100)]
    assert unsized and epochs == [first, first] and length == 6


def test_webdataset_names_local_paths(tmp_path):
    urls = make_shards(tmp_path, 1, 1)

    def user_code(wds):
        fluid = next(iter(wds.WebDataset(urls, shardshuffle=False)))
        plain = next(iter(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())))
        return fluid.get("__local_path__"), "__local_path__" in plain

    assert same_with_each(user_code) == (urls[0], False)


def test_len_only_when_known(tmp_path):
    urls = make_shards(tmp_path, 1, 3)

    def user_code(wds):
        dataset = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
        has_len = hasattr(dataset, "__len__")  # how training loops decide to call len()
        sized = dataset.with_length(3, silent=True)
        return has_len, len(sized), len(torch.utils.data.DataLoader(sized, batch_size=None))

    assert same_with_each(user_code) == (False, 3, 3)


# -- TarWriter round trips (an audio toolkit's export and reader)


def test_tarwriter_round_trip(tmp_path):
    def export(wds):
        pattern = str(tmp_path / f"{wds.__name__}-%d.tar")
        with wds.ShardWriter(pattern, maxcount=2, verbose=0) as sink:
            for i in range(3):
                sink.write({"__key__": f"utt{i:03d}", "txt": f"words {i}", "cls": i, "json": {"id": i},
                            "npy": np.arange(i + 1)})
        return sorted(str(p) for p in tmp_path.glob(f"{wds.__name__}-*.tar"))

    exports = [export(wds) for wds in libraries()]  # each library reads what each wrote

    def user_code(wds):
        return [[(sorted(s), s["txt"], s["cls"], s["json"], s["npy"].tolist())
                 for s in wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.decode())]
                for shards in exports]

    fields = ["__key__", "__url__", "cls", "json", "npy", "txt"]
    expected = [(fields, f"words {i}", i, {"id": i}, list(range(i + 1))) for i in range(3)]
    assert same_with_each(user_code) == [expected] * len(exports)


# -- except clauses written for webdataset


def test_except_clauses_for_webdataset_errors(tmp_path):
    good = tar_bytes([("a.txt", b"x" * 2000), ("b.txt", b"y" * 2000)])
    truncated = tmp_path / "cut.tar"
    truncated.write_bytes(good[:1500])  # inside the first member
    shard = write_tar(tmp_path / "ok.tar", [("a.txt", b"a")])

    def outcome(run):
        try:
            run()
        except Exception as exn:  # noqa: BLE001 (what was raised is the result)
            return exn
        return None

    def user_code(wds):
        def read(*stages, url=shard):
            return lambda: list(wds.DataPipeline(wds.SimpleShardList(url), wds.tarfile_to_samples(), *stages))

        return [
            isinstance(outcome(read(url=str(truncated))), tarfile.ReadError),
            isinstance(outcome(read(wds.map_dict(png=bytes))), KeyError),
            isinstance(outcome(read(wds.to_tuple("png"))), ValueError),
            isinstance(outcome(read(wds.rename(image="png"))), ValueError),
            isinstance(outcome(read(url=str(tmp_path / "missing.tar"))), FileNotFoundError),
        ]

    assert same_with_each(user_code) == [True] * 5


def test_enforce_security_assignment(tmp_path, monkeypatch):
    path = tmp_path / "x.bin"
    path.write_bytes(b"x")
    monkeypatch.setenv("WDS_SECURE", "0")  # restored after the test, whatever the assignments do

    def user_code(wds):
        wds.utils.enforce_security = True
        try:
            refused = [isinstance(outcome, ValueError) for outcome in
                       (_raised(wds.gopen, str(path)), _raised(wds.gopen, "pipe:cat /dev/null"))]
        finally:
            wds.utils.enforce_security = False
        with wds.gopen(str(path)) as stream:
            return refused, stream.read()

    assert same_with_each(user_code) == ([True, True], b"x")


def _raised(f, *args):
    try:
        f(*args).close()
    except Exception as exn:  # noqa: BLE001
        return exn
    return None


def test_private_stage_generators_for_own_stages():
    data = [{"__key__": str(i), "a": i} for i in range(20)]

    def user_code(wds):
        from_filters = wds.filters
        batches = list(from_filters._batched(iter(from_filters._to_tuple(iter(data), "a")), batchsize=8))
        shuffled = list(from_filters._shuffle(iter(range(20)), 5, 5, random.Random(1)))
        return [b[0].tolist() for b in batches], shuffled

    batches, shuffled = same_with_each(user_code)
    assert batches == [list(range(8)), list(range(8, 16)), list(range(16, 20))] and sorted(shuffled) == list(range(20))


# -- a fresh process: the package's submodules and patches right after ``import wdsmp as wds``

_FRESH_SCRIPT = '''
import os
import sys
import torch.utils.data
import wdsmp as wds

# webdataset 1.0.2's submodules, listed by dir() and usable as attributes before anything imports them
SUBMODULES = ["autodecode", "cache", "compat", "extradatasets", "filters", "handlers", "mix", "pipeline",
              "pytorch", "shardlists", "tariterators", "tenbin", "utils", "writer"]
listed = set(dir(wds))
assert set(SUBMODULES) <= listed, sorted(set(SUBMODULES) - listed)
assert set(wds.__all__) <= listed
handler = wds.autodecode.ImageHandler("pil")
shards = wds.shardlists.SimpleShardList(sys.argv[1:])
assert callable(wds.tariterators.tar_file_expander) and wds.utils.enforce_security in (True, False)
assert wds.writer.TarWriter is wds.TarWriter and wds.filters.to_tuple is wds.to_tuple
assert callable(wds.tenbin.encode_buffer) and callable(wds.gopen)  # the function, not its module
assert wds.pytorch.DataLoader is torch.utils.data.DataLoader
assert wds.pytorch.IterableDataset is torch.utils.data.IterableDataset
OPENED = []


def counting_file(url, mode="rb", bufsize=8192, **kw):
    OPENED.append(url)
    return open(url[len("counted:"):], mode)


def shout(text):
    return text.upper()


wds.gopen_schemes["counted"] = counting_file  # at import time: spawned workers run it too
original_url_opener = wds.tariterators.url_opener


def logging_url_opener(data, handler=wds.reraise_exception, **kw):
    for source in original_url_opener(data, handler=handler, **kw):
        os.write(2, f"opened {source['url']}\\n".encode())  # one write: the two workers' lines never interleave
        yield source


wds.tariterators.url_opener = logging_url_opener

if __name__ == "__main__":
    urls = ["counted:" + url for url in sys.argv[1:]]
    dataset = wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("txt", "cls").map_tuple(shout, int)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    print(sorted(tuple(sample) for sample in loader))
'''


def test_submodules_and_patches_right_after_import_in_spawned_workers(tmp_path):
    """``import wdsmp as wds`` in a fresh script: webdataset's submodules are listed and resolve,
    a scheme added to ``gopen_schemes`` and a patched ``tariterators.url_opener`` hold, and the
    pipeline's stages pickle into spawned DataLoader workers."""
    import subprocess
    import sys

    urls = make_shards(tmp_path, 2, 2)
    script = tmp_path / "train.py"
    script.write_text(_FRESH_SCRIPT)
    result = subprocess.run([sys.executable, str(script), *urls], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(sorted((f"TXT {i} {j}", 100 * i + j) for i in range(2) for j in range(2)))
    assert sorted(line for line in result.stderr.splitlines() if line.startswith("opened")) == [
        f"opened counted:{url}" for url in urls]
