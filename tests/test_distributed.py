"""Exact epochs across ranks under torchrun (gloo), 2 ranks x 2 workers: every sample once, the
same number of batches on every rank, and a run SIGKILLed mid-epoch resumed from its saved
state with exactly the batches it had not yet trained on; from local files and from an
S3-compatible server with a shard cache per rank."""

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
from wdsmp.shardindex import write_index

SIZES = (37, 5, 60)  # unequal, and fewer shards than ranks x workers
BATCH, WORLD = 4, 2
PER_RANK = sum(SIZES) // WORLD // BATCH  # policy "drop"
JOB = os.path.join(os.path.dirname(__file__), "torchrun_job.py")


def _shards(directory):
    """The shard files and their index in ``directory``: small JPEGs with labels."""
    rng = np.random.default_rng(5)
    for s, size in enumerate(SIZES):
        with wds.TarWriter(str(directory / f"part-{s}.tar")) as sink:
            for i in range(size):
                pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
                sink.write({"__key__": f"s{s}-{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": s})
    write_index(str(directory / "index.json"), [(f"part-{s}.tar", size) for s, size in enumerate(SIZES)])
    return ["index.json"] + [f"part-{s}.tar" for s in range(len(SIZES))]


@pytest.fixture(scope="module")
def local_index(tmp_path_factory):
    directory = tmp_path_factory.mktemp("distributed")
    _shards(directory)
    return str(directory / "index.json")


def _torchrun(out, tag, index, loader, workers=2, **options):
    """Run the job on WORLD ranks; its return code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", JOB,
               "--loader", loader, "--index", index, "--out", str(out), "--tag", tag, "--workers", str(workers),
               "--batch", str(BATCH)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [flag, str(value)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    if result.returncode != 0 and "kill_at" not in options:
        raise AssertionError(f"torchrun failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result.returncode


def _batches(out, tag, rank):
    with open(out / f"keys-{tag}-rank{rank}.txt") as stream:
        return [line.split() for line in stream]


def _check_exact_and_resumable(out, index, loader, resume_workers=2, cache_dir=None):
    cache = {} if cache_dir is None else {"cache_dir": cache_dir}
    _torchrun(out, "full", index, loader, **cache)
    with open(out / "done-full.json") as stream:
        done = json.load(stream)
    assert done == {"counts": [PER_RANK] * WORLD, "len": PER_RANK}  # equal batches, and len() says so
    full = [_batches(out, "full", rank) for rank in range(WORLD)]
    seen = collections.Counter(key for batches in full for batch in batches for key in batch)
    assert len(seen) == WORLD * PER_RANK * BATCH and max(seen.values()) == 1  # every sample at most once
    assert all(len(batch) == BATCH for batches in full for batch in batches)

    code = _torchrun(out, "killed", index, loader, checkpoint_at=5, kill_at=7, **cache)
    assert code != 0  # SIGKILLed mid-epoch, every rank
    _torchrun(out, "resumed", index, loader, workers=resume_workers, resume=True, **cache)
    for rank in range(WORLD):
        killed, resumed = _batches(out, "killed", rank), _batches(out, "resumed", rank)
        assert len(killed) == 7
        # batches 6 and 7 were seen but not saved: the resumed run gives them again, then the rest,
        # exactly as the uninterrupted run had them
        assert killed[:5] + resumed == full[rank]


def test_pipeline_exact_epochs_and_resume_under_torchrun(local_index, tmp_path):
    _check_exact_and_resumable(tmp_path, local_index, "pipeline", resume_workers=3)


def test_fastloader_exact_epochs_and_resume_under_torchrun(local_index, tmp_path):
    before = set(os.listdir(SHM_DIR))
    _check_exact_and_resumable(tmp_path, local_index, "fast", resume_workers=3)
    # the killed run's rings were swept by the resumed run's loaders
    assert not [name for name in set(os.listdir(SHM_DIR)) - before if name.startswith("wdsmp")]


@pytest.mark.parametrize("loader", ["pipeline", "fast"])
def test_exact_epochs_from_s3_with_a_cache_per_rank(loader, s3_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    s3_server.create_bucket("train")
    for name in _shards(data):
        s3_server.put("train", name, (data / name).read_bytes())
    cache = tmp_path / "cache"
    _check_exact_and_resumable(tmp_path, "s3://train/index.json", loader, cache_dir=str(cache))
    for rank in range(WORLD):  # each rank fetched the shards it reads once, whole, into its own cache
        cached = sorted(p.name.split("-", 1)[1] for p in (cache / f"rank{rank}").rglob("*.tar"))
        assert cached and set(cached) <= {f"part-{s}.tar" for s in range(len(SIZES))}
