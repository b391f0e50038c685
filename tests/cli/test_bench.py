"""``wdsmp bench``: the loader benchmark runs from the installed package, all three contenders."""

import argparse
import importlib.util
import os
import subprocess
import json
import shlex
import signal
import sys

import numpy as np
import pytest
import simplejpeg

import wdsmp
from wdsmp.bench.loader import CONTENDERS, STAGE_GROUPS, Result, as_json, open_corpus, picture
from wdsmp.bench.plot import rates
from wdsmp.cli import main
from wdsmp.shards.index import write_index


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


@pytest.mark.processes  # the benchmark's orchestration: DataLoader workers, fresh processes
def test_bench_prints_the_contenders_and_draws_them(tmp_path, capsys):
    _tiny_corpus(tmp_path)
    picture = tmp_path / "bench.png"
    argv = ["bench", "--corpus", str(tmp_path), "--workers", "1", "--batch-size", "8", "--seconds", "0.3",
            "--warmup", "0", "--rounds", "1", "--plot", str(picture)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"# {shlex.join(['wdsmp', *argv])}\n# corpus: 32 images")  # the command main was given
    region = "on" if wdsmp.native.core.jpeg_region_available() else "off"
    assert f"\n# region decoding: {region} (" in out
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")}
    assert list(rows) == ["contender", "DataLoader pipeline", "FastLoader", "FastLoader, fresh process",
                          "FastLoader, fresh process, fork", "decode-only ceiling"]
    assert rows["contender"][2:4] == ["first batch (s)", "new epoch (s)"]
    for name in ("DataLoader pipeline", "FastLoader"):  # a new epoch only where the window held a second one
        assert float(rows[name][2]) > 0 and (rows[name][3] == "-" or float(rows[name][3]) >= 0), rows[name]
    for name in ("FastLoader, fresh process", "FastLoader, fresh process, fork"):
        fresh = rows[name]  # no rate: a new interpreter's first batches
        assert fresh[:2] == ["-", "-"] and float(fresh[2]) > 0 and float(fresh[3]) >= 0, fresh  # 0.00: prefetched
    assert {len(cells) for cells in rows.values()} == {len(rows["contender"])}  # every row fills the columns
    assert "\n- FastLoader: " in out and "-bound" in out.split("\n- FastLoader: ")[1].split("\n")[0]
    assert "round 1/1: FastLoader" in err and f"# picture: {picture}" in err
    assert picture.read_bytes().startswith(b"\x89PNG")


def test_the_time_per_image_by_stage_of_each_contender(tmp_path):
    _tiny_corpus(tmp_path)
    args = argparse.Namespace(workers=1, batch_size=8, seconds=0.3, warmup=0.0)
    corpus = open_corpus(str(tmp_path), 1)
    for name in ("DataLoader pipeline", "FastLoader"):
        result = CONTENDERS[name](corpus, args)
        assert list(result.stages) == [*STAGE_GROUPS, "other"] and result.stages["decode"] > 0, result.stages
        assert result.series[0][1] == 8 and all(a[0] <= b[0] and a[1] < b[1]
                                                for a, b in zip(result.series, result.series[1:]))


def test_the_rate_over_time_counts_the_last_seconds():
    assert rates([]) == ([0.0], [0.0])
    times, values = rates([(1.0, 10), (2.0, 20), (2.0, 30), (5.0, 40), (9.0, 50)], window=3.0)
    assert times == [0.0, 1.0, 2.0, 2.0, 5.0, 9.0]
    # from 0 s until 3 s have passed; then over (t - 3, t]: two batches at once make no spike
    assert values == [0.0, 10 / 1, 20 / 2, 30 / 2, (40 - 30) / 3, (50 - 40) / 3]


@pytest.mark.processes  # the benchmark's orchestration: DataLoader workers, fresh processes
def test_swap_import_adds_the_user_pipeline_with_each_library(tmp_path, capsys, monkeypatch):
    _tiny_corpus(tmp_path)
    argv = ["bench", "--corpus", str(tmp_path), "--workers", "1", "--batch-size", "8", "--seconds", "0.3",
            "--warmup", "0", "--rounds", "1", "--swap-import", "--plot", str(tmp_path / "bench.png"), "--force"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| ")}
    assert list(rows)[-2:] == ["WebDataset pipeline, import webdataset", "WebDataset pipeline, import wdsmp"]
    assert rows["WebDataset pipeline, import wdsmp"].split(" | ")[1] != "-"
    try:
        import webdataset  # noqa: F401
    except ImportError:
        assert "webdataset is not installed" in out
    else:
        assert "import swapped: wdsmp delivers" in out
    monkeypatch.setitem(sys.modules, "webdataset", None)  # as if not installed
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "webdataset is not installed" in out and "| WebDataset pipeline, import webdataset |" + " - |" * 9 in out


def test_a_directory_that_is_not_a_corpus_is_a_usage_error(tmp_path, capsys):
    _tiny_corpus(tmp_path)
    shards = sorted(str(path) for path in tmp_path.glob("*.tar"))
    assert main(["index", "-q", "--force", "-o", str(tmp_path / "index.json"), *shards]) == 0  # a manifest
    assert main(["bench", "--corpus", str(tmp_path), "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"wdsmp bench: {tmp_path} is not a corpus written by benchmarks/make_corpus.py (its index.json: no "
        "'samples', 'jpg', 'ppm', 'mean_bytes', 'mean_width', 'mean_height', 'command' fields (a manifest from "
        "wdsmp index lists shards, not the images make_corpus.py describes))\n")
    (tmp_path / "index.json").write_text('{"shards": 3, "samples": 1, "jpg": 1, "ppm": 0, "mean_bytes": 1, '
                                         '"mean_width": 1, "mean_height": 1, "command": "x"}')
    assert main(["bench", "--corpus", str(tmp_path)]) == 2
    assert "'shards' is not a list" in capsys.readouterr().err
    assert main(["bench", "--corpus", str(tmp_path / "nothing")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


def test_json_summary_has_the_best_round_and_every_round():
    rounds = {name: [Result(100.0 * (i + 1) + r, images=r) for r in range(2)] for i, name in enumerate(CONTENDERS)}
    summary = as_json(rounds)
    assert list(summary) == list(CONTENDERS)
    assert summary["FastLoader"]["images_per_s"] == 201.0 and summary["FastLoader"]["rounds"] == [200.0, 201.0]
    assert json.loads(json.dumps(summary)) == summary


def test_without_matplotlib_the_benchmark_says_how_to_get_the_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    rounds = {name: [Result(100.0, series=[(1.0, 8)], stages={"decode": 1.0})] for name in CONTENDERS}
    corpus = argparse.Namespace(index={"samples": 32, "mean_width": 64, "mean_height": 48})
    args = argparse.Namespace(plot=str(tmp_path / "x.png"), workers=1, batch_size=8)
    assert picture(rounds, corpus, args) == "# no picture: the picture needs matplotlib: pip install 'wdsmp[plot]'"
    assert not (tmp_path / "x.png").exists()


# -- wdsmp bench SHARDS: FastLoader on your own shards ----------------------------------------


def _scaling_argv(inputs, tmp_path, *more):
    return ["bench", *inputs, "--max-workers", "2", "--batch-size", "8", "--seconds", "0.5", "--warmup", "0.2",
            "--plot", str(tmp_path / "scaling.png"), *more]


def _rows(out):
    """``{workers: images/s}`` of the scaling table."""
    return {int(line.split(" | ")[0][2:]): line.split(" | ")[1] for line in out.splitlines()
            if line.startswith("| ") and line[2].isdigit()}


@pytest.mark.processes  # FastLoader's workers
def test_bench_on_your_own_shards_scales_workers_and_names_the_bottleneck(tmp_path, capsys):
    _tiny_corpus(tmp_path, per_shard=24)
    shards = str(tmp_path / "train-{000000..000001}.tar")
    assert main(_scaling_argv([shards], tmp_path)) == 0
    out, err = capsys.readouterr()
    rows = _rows(out)
    assert list(rows) == [1, 2] and all(float(rate.replace(",", "")) > 0 for rate in rows.values())
    assert "image .jpg, label .cls" in err  # found in the first sample
    assert "\nBottleneck: FastLoader: " in out and "-bound" in out
    assert "\nAt 2 workers, worker time per image (ms): read shards " in out
    assert "\nTo feed 3,000 images/s at this rate per worker: about " in out
    assert (tmp_path / "scaling.png").read_bytes().startswith(b"\x89PNG")
    # The picture is not overwritten without --force; the index works as the shard list does.
    assert main(_scaling_argv([str(tmp_path / "index.json")], tmp_path, "--json")) == 2
    assert "scaling.png exists; remove it or pass --force" in capsys.readouterr().err
    assert main(_scaling_argv([str(tmp_path / "index.json")], tmp_path, "--json", "--force", "--rate", "500")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [run["workers"] for run in summary["runs"]] == [1, 2] and summary["cores_for_rate"] >= 1
    assert summary["image"] == "jpg" and summary["label"] == "cls"


@pytest.mark.processes  # FastLoader's workers reading over HTTP
def test_bench_on_shards_over_http(tmp_path, capsys, http_server):
    _tiny_corpus(tmp_path, per_shard=24)
    for shard in ("train-000000.tar", "train-000001.tar"):
        http_server.put_file(shard, (tmp_path / shard).read_bytes())
    urls = [http_server.url(f"train-00000{i}.tar") for i in range(2)]
    assert main(_scaling_argv(urls, tmp_path, "--label", "cls")) == 0
    assert list(_rows(capsys.readouterr().out)) == [1, 2]


@pytest.mark.processes  # FastLoader's workers, and a process loading the CPU beside them
def test_bench_warns_when_other_load_makes_the_figures_unreliable(tmp_path, capsys):
    _tiny_corpus(tmp_path, per_shard=24)
    # Busy loops that are not this process's descendants (the shell that starts them exits), as
    # another user's job would be: the benchmark counts its own process tree as its own load.
    start = f"for i in $(seq {os.cpu_count() or 1}); do {shlex.quote(sys.executable)} -c 'while True: pass' " \
            f">/dev/null 2>&1 & echo $!; done"
    burners = [int(pid) for pid in subprocess.run(["sh", "-c", start], capture_output=True, text=True,
                                                   check=True).stdout.split()]
    try:
        assert main(_scaling_argv([str(tmp_path / "train-000000.tar")], tmp_path, "--max-workers", "1")) == 0
    finally:
        for pid in burners:
            os.kill(pid, signal.SIGKILL)
    out = capsys.readouterr().out
    assert "WARNING: other processes kept the CPU busy while measuring (more than 0.5 cores of other load at " \
           "worker counts 1)" in out


def test_bench_needs_shards_or_a_corpus_and_an_image(tmp_path, capsys):
    assert main(["bench"]) == 2
    assert "give SHARDS" in capsys.readouterr().err
    with wdsmp.TarWriter(str(tmp_path / "text.tar")) as sink:
        sink.write({"__key__": "a", "txt": "no image here"})
    assert main(["bench", str(tmp_path / "text.tar"), "--plot", str(tmp_path / "p.png")]) == 2
    assert "has no image FastLoader reads" in capsys.readouterr().err


def test_make_corpus_indexes_sizes_and_digests_or_says_what_it_needs(tmp_path, capsys):
    """The generated corpus's index lets ``verify --index`` check every byte; without its source
    photographs (scikit-image, the ``bench`` extra) the script says so instead of hanging."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "benchmarks", "make_corpus.py")
    done = subprocess.run([sys.executable, script, str(tmp_path), "--images", "6", "--shard-size", "3",
                           "--processes", "1"], capture_output=True, text=True, timeout=120)
    if importlib.util.find_spec("skimage") is None:
        assert done.returncode == 2 and "come from scikit-image: pip install -e '.[bench]'" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    entries = json.loads((tmp_path / "index.json").read_text())["shards"]
    assert [sorted(entry) for entry in entries] == [["samples", "sha256", "size", "url"]] * 2
    assert main(["verify", "-q", "--json", "--index", str(tmp_path / "index.json")]) == 0
    assert json.loads(capsys.readouterr().out)["bad_shards"] == 0
