"""Tests of wdsmp.datasets.dbcache.DBCache: a real SQLite file, real shards, real processes."""

import multiprocessing
import pickle
import sqlite3

import pytest
from torch.utils.data import DataLoader

import wdsmp
from wdsmp.datasets.dbcache import DBCache
from wdsmp.pipeline import DataPipeline
from wdsmp.shardlists import SimpleShardList
from wdsmp.tariterators import tarfile_to_samples


class Counted:
    """An iterable source that counts how often it was iterated and how many samples it gave."""

    def __init__(self, n, keyed=True):
        self.n = n
        self.keyed = keyed
        self.passes = 0
        self.given = 0

    def __iter__(self):
        self.passes += 1
        for i in range(self.n):
            self.given += 1
            if self.keyed:
                yield {"__key__": f"k{i:04d}", "value": i, "blob": bytes([i % 256]) * 100}
            else:
                yield (i, f"v{i}")


def processes():
    """Fresh processes, as spawned workers are; forkserver with wdsmp imported once in
    the server, because importing torch in every spawned child takes seconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def keys(samples):
    return [s["__key__"] for s in samples]


def test_first_pass_stores_size_then_passes_and_restarts_read_the_db(tmp_path):
    db = tmp_path / "cache.db"
    source = Counted(50)
    cache = DBCache(source, db, 20, verbose=False)
    first = list(cache)
    assert keys(first) == [f"k{i:04d}" for i in range(20)]  # the pass ends once 20 are stored
    assert first[3] == {"__key__": "k0003", "value": 3, "blob": b"\x03" * 100}
    assert source.passes == 1
    assert list(cache) == first
    restarted = DBCache(source, str(db), 20, verbose=False)  # a new process would do the same
    assert list(restarted) == first
    assert source.passes == 1  # neither touched the source again
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 20


def test_source_running_out_first_completes_the_cache(tmp_path):
    source = Counted(7)
    cache = DBCache(source, tmp_path / "c.db", 1000, verbose=False)
    assert len(list(cache)) == 7
    assert len(list(cache)) == 7
    assert len(list(DBCache(source, tmp_path / "c.db", 1000, verbose=False))) == 7
    assert source.passes == 1


def test_early_stop_keeps_what_was_stored_and_continues(tmp_path):
    source = Counted(30)
    cache = DBCache(source, tmp_path / "c.db", 10, verbose=False)
    samples = iter(cache)
    assert keys([next(samples) for _ in range(4)]) == ["k0000", "k0001", "k0002", "k0003"]
    samples.close()
    again = DBCache(source, tmp_path / "c.db", 10, verbose=False)
    assert keys(again) == [f"k{i:04d}" for i in range(10)]  # k0000..3 passed through, not stored twice
    assert source.passes == 2
    assert keys(again) == [f"k{i:04d}" for i in range(10)]
    assert source.passes == 2


def test_samples_without_keys_are_stored_by_content(tmp_path):
    source = Counted(5, keyed=False)
    cache = DBCache(source, tmp_path / "c.db", 100, verbose=False)
    assert list(cache) == [(i, f"v{i}") for i in range(5)]
    assert list(cache) == [(i, f"v{i}") for i in range(5)]
    assert source.passes == 1


def test_shuffle_serves_the_same_samples(tmp_path):
    source = Counted(40)
    list(DBCache(source, tmp_path / "c.db", 40, verbose=False))
    shuffled = [keys(DBCache(source, tmp_path / "c.db", 40, verbose=False, shuffle=True)) for _ in range(3)]
    assert all(sorted(k) == [f"k{i:04d}" for i in range(40)] for k in shuffled)
    assert any(k != sorted(k) for k in shuffled)


def test_fname_none_passes_through(tmp_path, capsys):
    source = Counted(5)
    cache = DBCache(source, None, 3)
    assert len(list(cache)) == 5 and len(list(cache)) == 5
    assert source.passes == 2
    assert capsys.readouterr().err == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", [0, -1, 2.5, None, True])
def test_bad_size(tmp_path, size):
    with pytest.raises(ValueError, match="size must be a positive number"):
        DBCache(Counted(1), tmp_path / "c.db", size)


def test_verbose_messages(tmp_path, capsys):
    fname = str(tmp_path / "cache.db")
    cache = DBCache(Counted(50), fname, 10)
    assert capsys.readouterr().err == f"[DBCache opened {fname} size 10 total 0]\n"
    list(cache)
    assert capsys.readouterr().err == ("[DBCache total 0 size 10 more caching]\n"
                                       "[DBCache finished caching total 10 (size 10)]\n")
    list(cache)
    assert capsys.readouterr().err == "[DBCache starting dbiter total 10 size 10]\n"
    DBCache(Counted(50), fname, 10)
    assert capsys.readouterr().err == f"[DBCache opened {fname} size 10 total 10]\n"


def test_wraps_a_pipeline_of_shards(tmp_path):
    shard = str(tmp_path / "shard.tar")
    with wdsmp.TarWriter(shard) as writer:
        for i in range(12):
            writer.write({"__key__": f"{i:03d}", "txt": f"sample {i}"})
    log = tmp_path / "log"
    url = f"pipe:echo run >> {log}; cat {shard}"
    pipeline = DataPipeline(SimpleShardList([url]), tarfile_to_samples())
    expected = list(pipeline)[:8]
    cache = DBCache(pipeline, tmp_path / "c.db", 8, verbose=False)
    assert list(cache) == expected
    assert list(cache) == expected
    assert list(pipeline.compose(DBCache, tmp_path / "c.db", 8, verbose=False)) == expected
    assert len(log.read_text().splitlines()) == 2  # the pipeline above, then the first pass
    assert expected[0]["__url__"] == url and expected[0]["txt"] == b"sample 0"


def test_same_keys_in_different_shards_are_different_samples(tmp_path):
    # Keys are a sample's name within its shard: shards written apart often reuse them.
    for number in range(2):
        with wdsmp.TarWriter(str(tmp_path / f"shard-{number}.tar")) as writer:
            for i in range(4):
                writer.write({"__key__": f"{i:06d}", "txt": f"shard {number} sample {i}"})
    pipeline = DataPipeline(SimpleShardList(str(tmp_path / "shard-{0..1}.tar")), tarfile_to_samples())
    cache = DBCache(pipeline, tmp_path / "c.db", 100, verbose=False)
    first = list(cache)
    assert len(first) == 8
    assert list(cache) == first  # served from the file: all 8, not one per key


def _unversioned(path, samples):
    """A cache file with samples and no format version, as no release of wdsmp writes it."""
    codec = wdsmp.formats.samplecodec.SampleCodec("test")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE samples (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, data BLOB NOT NULL)")
    db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for sample in samples:
        db.execute("INSERT INTO samples (key, data) VALUES (?, ?)", (sample["__key__"], codec.dumps(sample)))
    db.commit()
    db.close()


def test_the_file_carries_its_format_version_and_another_version_is_refused(tmp_path):
    source = [{"__key__": f"{i:06d}", "txt": f"sample {i}"} for i in range(4)]
    path = tmp_path / "cache.db"
    assert list(DBCache(source, path, 8, verbose=False)) == source
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT name, value FROM meta WHERE name IN ('format', 'version')")) == {
            "format": "wdsmp.DBCache", "version": "1"}
        db.execute("UPDATE meta SET value = '7' WHERE name = 'version'")
    with pytest.raises(ValueError, match=r"DBCache '.*cache\.db' .* is wdsmp\.DBCache version 7; this wdsmp reads "
                                         r"version 1"):
        DBCache(source, path, 8, verbose=False)
    _unversioned(tmp_path / "other.db", source[:2])
    with pytest.raises(ValueError, match=r"other\.db' .* is not in a known version of wdsmp\.DBCache .*"
                                         r"version=None; this wdsmp reads wdsmp\.DBCache version 1"):
        DBCache(source, tmp_path / "other.db", 8, verbose=False)
    assert list(DBCache(source, path.with_name("new.db"), 8, verbose=False)) == source  # a new file is stamped


def test_a_file_that_is_no_database_is_named_in_the_error(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError, match=r"DBCache '.*garbage\.db': file is not a database"):
        DBCache(Counted(3), garbage, 10, verbose=False)
    with pytest.raises(sqlite3.OperationalError, match=r"DBCache '.*missing/c\.db': unable to open"):
        DBCache(Counted(3), tmp_path / "missing" / "c.db", 10, verbose=False)


def test_pickles_and_splits_among_dataloader_workers(tmp_path):
    source = Counted(12)
    list(DBCache(source, tmp_path / "c.db", 12, verbose=False))
    cache = pickle.loads(pickle.dumps(DBCache(source, tmp_path / "c.db", 12, verbose=False)))
    loader = DataLoader(cache, batch_size=None, num_workers=2,
                        multiprocessing_context=processes())
    assert sorted(s["__key__"] for s in loader) == [f"k{i:04d}" for i in range(12)]  # each once


def _fill(fname, start, barrier, results):
    barrier.wait(timeout=60)
    source = ({"__key__": f"k{i:04d}", "blob": bytes(10_000)} for i in range(start, start + 300))
    try:
        results.put(len(list(DBCache(source, fname, 450, verbose=False))))
    except Exception as exn:  # report it, rather than die with it in the child
        results.put(repr(exn))


def test_two_processes_share_one_file(tmp_path):
    """Two processes fill one file at once (overlapping keys): no locking errors, the cap
    holds, every stored sample reads back."""
    fname = str(tmp_path / "c.db")
    DBCache(Counted(0), fname, 450, verbose=False)  # create it first, as a training script would
    context = processes()
    barrier, results = context.Barrier(2), context.Queue()
    procs = [context.Process(target=_fill, args=(fname, start, barrier, results)) for start in (0, 150)]
    for proc in procs:
        proc.start()
    counts = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert all(isinstance(c, int) for c in counts), counts
    stored = list(DBCache(Counted(0), fname, 450, verbose=False))
    assert len(stored) == 450
    assert len({s["__key__"] for s in stored}) == 450
    assert {s["__key__"] for s in stored} == {f"k{i:04d}" for i in range(450)}


class _Opener:
    """Unpickles into ``open(path, "w")``: what a cache file from someone else can do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import builtins

        return (builtins.open, (self.path, "w"))


def _decoded_jpeg_with_metadata():
    """A JPEG as decode("pil") gives it: its info holds the file's dpi, EXIF and ICC profile,
    which a pickled image keeps, and so must a plain record."""
    import io

    from PIL import Image

    stream = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation
    Image.new("RGB", (5, 4), (9, 80, 200)).save(stream, "JPEG", dpi=(300, 300), exif=exif.tobytes(),
                                                 icc_profile=b"\0" * 132, comment=b"kept")
    image = Image.open(io.BytesIO(stream.getvalue())).convert("RGB")
    assert {"dpi", "exif", "icc_profile", "comment"} <= image.info.keys()
    return image


def test_samples_are_stored_without_pickle_and_a_hostile_file_runs_nothing_in_secure_mode(tmp_path, monkeypatch):
    import numpy as np
    import torch
    from PIL import Image

    monkeypatch.delenv("WDS_SECURE", raising=False)
    sample = {"__key__": "k0", "jpg": b"\xff\xd8", "cls": 3, "big": 1 << 70, "x": 0.5, "ok": True, "no": None,
              "t": ("a", [1, 2]), "a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.int64(7),
              "p": torch.arange(4, dtype=torch.bfloat16), "img": Image.new("RGB", (3, 2), (1, 2, 3)),
              "jpeg": _decoded_jpeg_with_metadata()}
    db = tmp_path / "plain.db"
    assert list(DBCache([sample], db, 5, verbose=False)) == [sample]
    with sqlite3.connect(db) as con:
        stored = con.execute("SELECT data FROM samples").fetchone()[0]
    assert stored.startswith(b"WDSP1") and b"\x80" != stored[:1]
    back = list(DBCache([], db, 5, verbose=False))[0]
    assert back.keys() == sample.keys() and back["big"] == 1 << 70 and back["t"] == ("a", [1, 2])
    assert np.array_equal(back["a"], sample["a"]) and back["a"].dtype == np.float32
    assert type(back["s"]) is np.int64 and back["s"] == 7
    assert back["p"].dtype == torch.bfloat16 and torch.equal(back["p"], sample["p"])
    assert back["img"].tobytes() == sample["img"].tobytes() and back["img"].mode == "RGB"
    assert back["jpeg"].info == sample["jpeg"].info and back["jpeg"].tobytes() == sample["jpeg"].tobytes()
    # A file from elsewhere: its rows are pickles that run code when loaded.
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile.db"
    DBCache([], hostile, 1, verbose=False)  # the schema
    with sqlite3.connect(hostile) as con:
        con.execute("INSERT INTO samples (key, data) VALUES (?, ?)", ("k", pickle.dumps(_Opener(str(marker)))))
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(ValueError, match=r"DBCache '.*hostile.db' holds pickled samples .* WDS_SECURE=1 refuses "
                                         r"to unpickle them"):
        list(DBCache([], hostile, 1, verbose=False))
    assert not marker.exists()
    assert list(DBCache([], db, 5, verbose=False))[0].keys() == sample.keys()  # plain files still read
    with pytest.raises(ValueError, match="WDS_SECURE=1 stores only plain samples .* holds a .*Counted"):
        list(DBCache([Counted(1)], tmp_path / "other.db", 1, verbose=False))
    monkeypatch.delenv("WDS_SECURE")
    assert list(DBCache([], hostile, 1, verbose=False)) and marker.exists()  # outside secure mode, as before


def test_plain_records_are_checked_as_they_are_read():
    from wdsmp.formats.samplecodec import decode_plain, encode_plain

    good = encode_plain({"a": [1, b"x"]})
    for bad in (good[:-1], good + b"\0", b"WDSP1Z", b"WDSP1b" + (1 << 40).to_bytes(8, "little")):
        with pytest.raises(ValueError, match="plain sample record"):
            decode_plain(bad)
