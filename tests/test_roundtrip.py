"""What wdsmp writes, wdsmp reads back exactly: TarWriter/ShardWriter -> samples."""

import os
import subprocess
import sys

import numpy as np

import wdsmp as wds


def sample(i):
    rng = np.random.default_rng(i)
    return {
        "__key__": f"dir/sample{i:05d}",
        "bin": rng.bytes(int(rng.integers(0, 3000))),
        "txt": f"text {i} ✓",
        "seg.png.gz": rng.bytes(10),  # a compound extension, gzipped by the writer
    }


def read_all(urls):
    return list(wds.tarfile_samples([{"url": u} for u in urls]))


def test_tarwriter_round_trip(impl, tmp_path):
    originals = [sample(i) for i in range(50)]
    for name in ["plain.tar", "zipped.tgz"]:
        path = str(tmp_path / name)
        with wds.TarWriter(path) as sink:
            for s in originals:
                sink.write(s)
        got = read_all([path])
        assert [g["__key__"] for g in got] == [s["__key__"] for s in originals]
        for g, s in zip(got, originals):
            assert g["bin"] == s["bin"]
            assert g["txt"] == s["txt"].encode()
            assert set(g) == {"__key__", "__url__", "bin", "txt", "seg.png.gz"}
        listing = subprocess.run(["tar", "tf", path], capture_output=True, text=True, check=True)
        assert listing.stdout.splitlines()[:3] == ["dir/sample00000.bin", "dir/sample00000.seg.png.gz",
                                                   "dir/sample00000.txt"]


def test_shardwriter_round_trip_across_shards(impl, tmp_path):
    originals = [sample(i) for i in range(40)]
    pattern = str(tmp_path / "shard-%04d.tar")
    with wds.ShardWriter(pattern, maxcount=7) as sink:
        for s in originals:
            sink.write(s)
    shards = sorted(os.listdir(tmp_path))
    assert len(shards) == 6
    got = read_all([str(tmp_path / s) for s in shards])
    assert [g["bin"] for g in got] == [s["bin"] for s in originals]


def test_write_to_stdout_and_read_from_a_pipe(impl, tmp_path):
    script = ("import wdsmp as wds\n"
              "with wds.TarWriter('-') as sink:\n"
              "    for i in range(3):\n"
              "        sink.write({'__key__': f'k{i}', 'cls': i})\n")
    path = tmp_path / "out.tar"
    with open(path, "wb") as out:
        subprocess.run([sys.executable, "-c", script], stdout=out, check=True)
    got = read_all([f"pipe:cat {path}"])
    assert [(g["__key__"], g["cls"]) for g in got] == [("k0", b"0"), ("k1", b"1"), ("k2", b"2")]
