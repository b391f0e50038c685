"""``wdsmp bench``: the loader benchmark runs from the installed package, all three contenders."""

import json

import numpy as np
import simplejpeg

import wdsmp
from wdsmp.benchmark import CONTENDERS, Result, as_json
from wdsmp.shardindex import write_index


def _tiny_corpus(directory, shards=2, per_shard=16):
    """A corpus as make_corpus.py writes it (shards and an index.json), of small noise JPEGs."""
    rng = np.random.default_rng(0)
    entries, total = [], 0
    for shard in range(shards):
        name = f"train-{shard:06d}.tar"
        with wdsmp.TarWriter(str(directory / name)) as sink:
            for i in range(per_shard):
                data = simplejpeg.encode_jpeg(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
                sink.write({"__key__": f"{shard:02d}{i:04d}", "jpg": data, "cls": str(i % 10)})
                total += len(data)
        entries.append((name, per_shard))
    samples = shards * per_shard
    write_index(str(directory / "index.json"), entries, samples=samples, classes=10, jpg=samples, ppm=0,
                total_bytes=total, mean_bytes=total // samples, mean_width=64, mean_height=48,
                command="test_bench.py")


def test_bench_prints_the_three_contenders(tmp_path, wdsmp_run):
    _tiny_corpus(tmp_path)
    result = wdsmp_run("bench", "--corpus", tmp_path, "--workers", "1", "--batch-size", "8", "--seconds", "0.3",
                       "--warmup", "0", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# wdsmp bench --corpus")
    rows = [line.split(" | ")[0] for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["| contender", "| DataLoader pipeline", "| FastLoader", "| decode-only ceiling"]
    assert "round 1/1: FastLoader" in result.stderr


def test_json_summary_has_the_best_round_and_every_round():
    rounds = {name: [Result(100.0 * (i + 1) + r, images=r) for r in range(2)] for i, name in enumerate(CONTENDERS)}
    summary = as_json(rounds)
    assert list(summary) == list(CONTENDERS)
    assert summary["FastLoader"]["images_per_s"] == 201.0 and summary["FastLoader"]["rounds"] == [200.0, 201.0]
    assert json.loads(json.dumps(summary)) == summary

