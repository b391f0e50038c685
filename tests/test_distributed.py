"""Exact epochs across ranks under torchrun (gloo), 2 ranks x 2 workers, from plain shard URLs
with no index written by the test: every sample once, the same number of batches on every
rank, and a run SIGKILLed mid-epoch resumed from its saved state with exactly the batches it
had not yet trained on; from local files (which count themselves) and from an S3-compatible
server with a shard cache per rank and an HTTP server (the index beside the shards)."""

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg

import wdsmp as wds
from wdsmp.fast.ring import SHM_DIR
from wdsmp.shards.index import write_index

SIZES = (10, 50, 23, 37, 8)  # unequal
BATCH, WORLD = 4, 2
PER_RANK = sum(SIZES) // WORLD // BATCH  # policy "drop"
pytestmark = pytest.mark.processes

JOB = os.path.join(os.path.dirname(__file__), "torchrun_job.py")
SPEC = "part-{0..4}.tar"


def _shards(directory):
    """The shard files in ``directory``, small JPEGs with labels; their names."""
    rng = np.random.default_rng(5)
    for s, size in enumerate(SIZES):
        with wds.TarWriter(str(directory / f"part-{s}.tar")) as sink:
            for i in range(size):
                pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
                sink.write({"__key__": f"s{s}-{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": s})
    return [f"part-{s}.tar" for s in range(len(SIZES))]


@pytest.fixture(scope="module")
def local_shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("distributed")
    _shards(directory)
    return str(directory / SPEC)


def _upload(directory, put):
    """The shards, and their index as index.json beside them, through ``put(name, data)``."""
    names = _shards(directory)
    write_index(str(directory / "index.json"), list(zip(names, SIZES)))
    for name in names + ["index.json"]:
        put(name, (directory / name).read_bytes())


def _torchrun(out, tag, urls, loader, workers=2, world=WORLD, **options):
    """Run the job on ``world`` ranks; its return code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", JOB,
               "--loader", loader, "--urls", urls, "--out", str(out), "--tag", tag, "--workers", str(workers),
               "--batch", str(BATCH)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [flag, str(value)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    if result.returncode != 0 and "kill_at" not in options:
        raise AssertionError(f"torchrun failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-6000:]}")
    return result.returncode


def _batches(out, tag, rank):
    with open(out / f"keys-{tag}-rank{rank}.txt") as stream:
        return [line.split() for line in stream]


def _check_exact(out, tag):
    """The epoch logged as ``tag``: every rank the same number of full batches, every sample at
    most once; the keys of each rank's batches."""
    with open(out / f"done-{tag}.json") as stream:
        done = json.load(stream)
    assert done == {"counts": [PER_RANK] * WORLD, "len": PER_RANK}  # equal batches, and len() says so
    full = [_batches(out, tag, rank) for rank in range(WORLD)]
    seen = collections.Counter(key for batches in full for batch in batches for key in batch)
    assert len(seen) == WORLD * PER_RANK * BATCH and max(seen.values()) == 1  # every sample at most once
    assert all(len(batch) == BATCH for batches in full for batch in batches)
    return full


def _check_exact_and_resumable(out, urls, loader, resume_workers=2):
    _torchrun(out, "full", urls, loader)
    full = _check_exact(out, "full")
    code = _torchrun(out, "killed", urls, loader, checkpoint_at=5, kill_at=7)
    assert code != 0  # SIGKILLed mid-epoch, every rank
    _torchrun(out, "resumed", urls, loader, workers=resume_workers, resume=True)
    for rank in range(WORLD):
        killed, resumed = _batches(out, "killed", rank), _batches(out, "resumed", rank)
        assert len(killed) == 7
        # batches 6 and 7 were seen but not saved: the resumed run gives them again, then the rest,
        # exactly as the uninterrupted run had them
        assert killed[:5] + resumed == full[rank]


def test_pipeline_exact_epochs_and_resume_under_torchrun(local_shards, tmp_path):
    _check_exact_and_resumable(tmp_path, local_shards, "pipeline", resume_workers=3)


def test_fastloader_exact_epochs_and_resume_under_torchrun(local_shards, tmp_path):
    _check_exact_and_resumable(tmp_path, local_shards, "fast", resume_workers=3)
    # the killed run's rings were swept by the resumed run's loaders (names end in -<pid>-<random>;
    # other processes on the machine may hold rings of their own)
    pids = {path.read_text() for path in tmp_path.glob("pid-*-rank*.txt")}
    assert len(pids) == 3 * WORLD
    assert not [name for name in os.listdir(SHM_DIR)
                if name.startswith("wdsmp") and any(f"-{pid}-" in name for pid in pids)]


@pytest.mark.parametrize("worlds", [(2, 3), (3, 2)])
def test_fastloader_resumes_an_epoch_on_another_number_of_ranks(local_shards, tmp_path, worlds):
    """A job SIGKILLed mid-epoch on one number of ranks comes back on another, every new rank from
    rank 0's state: the samples not yet delivered are dealt out, each at most once, in equal batches."""
    old, new = worlds
    code = _torchrun(tmp_path, "killed", local_shards, "fast", world=old, checkpoint_at=5, kill_at=7)
    assert code != 0
    _torchrun(tmp_path, "resumed", local_shards, "fast", world=new, workers=3, resume=True, state_of_rank=0)
    trained = [key for rank in range(old) for batch in _batches(tmp_path, "killed", rank)[:5] for key in batch]
    resumed = [_batches(tmp_path, "resumed", rank) for rank in range(new)]
    with open(tmp_path / "done-resumed.json") as stream:
        counts = json.load(stream)["counts"]
    per_rank = sum(SIZES) // old // BATCH  # the epoch on the old ranks, policy "drop"
    rest = old * (per_rank - 5) * BATCH
    assert counts == [rest // new // BATCH] * new  # equal batches on every new rank
    keys = trained + [key for batches in resumed for batch in batches for key in batch]
    assert all(len(batch) == BATCH for batches in resumed for batch in batches)
    assert len(keys) == len(set(keys)) == old * 5 * BATCH + new * counts[0] * BATCH  # each sample at most once


def test_exact_epochs_from_s3_with_a_cache_per_rank(s3_server, tmp_path):
    """Both loaders, an epoch each, from S3 through a cache per rank (resuming is the local
    tests' business: it does not depend on where the shards come from)."""
    data = tmp_path / "data"
    data.mkdir()
    s3_server.create_bucket("train")
    _upload(data, lambda name, data: s3_server.put("train", name, data))
    cache = tmp_path / "cache"
    _torchrun(tmp_path, "s3", f"s3://train/{SPEC}", "both", cache_dir=str(cache))
    assert _check_exact(tmp_path, "s3-pipeline") and _check_exact(tmp_path, "s3-fast")
    for rank in range(WORLD):  # each rank fetched the shards it reads once, whole, into its own cache
        cached = sorted(p.name.split("-", 1)[1] for p in (cache / f"rank{rank}").rglob("*.tar"))
        assert cached and set(cached) <= {f"part-{s}.tar" for s in range(len(SIZES))}


def test_exact_epochs_over_http(http_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _upload(data, lambda name, data: http_server.put_file(f"train/{name}", data))
    _torchrun(tmp_path, "http", http_server.url(f"train/{SPEC}"), "both")
    assert _check_exact(tmp_path, "http-pipeline") and _check_exact(tmp_path, "http-fast")
