"""FastLoader.cuda(): the arithmetic, device choice, defaults and clean-up on the CPU; on a GPU,
batches equal the CPU batches, slots are recycled only after their copies, the staging fallback,
copy=True, break and resume, and close() with an iterator suspended or after a CUDA error.

The GPU tests skip without CUDA (CI has none): run them, and ``benchmarks/gpu_check.py``, on a
GPU machine."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import numpy as np
import pytest
import torch

from wdsmp.fast.bottleneck import diagnose
from wdsmp.fast.loader import FastLoader
from wdsmp.fast.options import default_workers
from wdsmp.fast.transfer import rank_device_warning, to_model_input
from tests.fast.test_loader import shards  # noqa: F401  (the module's shard fixture)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEAN, STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def _loader(index, **kw):
    return FastLoader(index, 4, num_workers=2, image_size=24, train=False, shuffle=False, keys=True, **kw)


def _scale_bias(device="cpu"):
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (1 / std).float().to(device), (-mean / std).float().to(device)


def _reference(nhwc):
    """The normalised images in float64: what every dtype is compared with."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (nhwc.permute(0, 3, 1, 2).double().cpu() - mean) / std


# -- on the CPU: the same functions .cuda() runs on the GPU ---------------------------------


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 0.008),
                                              (torch.float16, 0.002)])
def test_normalisation_rounds_once(dtype, tolerance):
    """Every pixel value of every channel, computed in float32 and rounded once: one bfloat16
    rounding of values in [-2.2, 2.7] is at most 2**-7 (casting mean, 1/std and the pixels
    first gave 0.027)."""
    nhwc = torch.arange(256, dtype=torch.uint8).view(1, 16, 16, 1).expand(2, 16, 16, 3).contiguous()
    scale, bias = _scale_bias()
    out = to_model_input(nhwc, scale=scale, bias=bias, dtype=dtype)
    assert out.dtype == dtype and out.shape == (2, 3, 16, 16)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert (out.double() - _reference(nhwc)).abs().max().item() <= tolerance


def test_model_input_layouts():
    nhwc = torch.randint(0, 256, (3, 5, 7, 3), dtype=torch.uint8)
    as_is = to_model_input(nhwc)
    assert as_is.shape == (3, 3, 5, 7) and as_is.data_ptr() == nhwc.data_ptr()  # channels_last: no copy
    assert torch.equal(as_is, nhwc.permute(0, 3, 1, 2))
    flat = to_model_input(nhwc, channels_last=False)
    assert flat.is_contiguous() and torch.equal(flat, nhwc.permute(0, 3, 1, 2))
    halves = to_model_input(nhwc, dtype=torch.float16)
    assert halves.dtype == torch.float16 and torch.equal(halves.float(), nhwc.permute(0, 3, 1, 2).float())
    scale, bias = _scale_bias()
    normalised = to_model_input(nhwc, scale=scale, bias=bias, dtype=torch.float32, channels_last=False)
    assert normalised.is_contiguous()
    assert (normalised.double() - _reference(nhwc)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("kwargs, message", [
    ({"depth": 0}, "depth"),
    ({"mean": MEAN}, "both mean and std"),
    ({"mean": MEAN, "std": (58.0, 0.0, 57.0)}, "positive"),
    ({"mean": MEAN, "std": (58.0, -1.0, 57.0)}, "positive"),
    ({"mean": (1.0, 2.0), "std": (1.0, 2.0)}, "3 finite numbers"),
    ({"mean": (1.0, float("nan"), 2.0), "std": STD}, "3 finite numbers"),
    ({"mean": MEAN, "std": STD, "dtype": torch.int32}, "floating dtype"),
    ({"dtype": "bfloat16"}, "torch dtype"),
])
def test_cuda_arguments_are_checked_before_cuda(shards, kwargs, message):  # noqa: F811
    """A wrong argument says so on any machine, before the CUDA check (std=0 was taken)."""
    _, index, _ = shards
    with _loader(index) as loader, pytest.raises(ValueError, match=message):
        loader.cuda(**kwargs)


def test_rank_device_warning():
    assert rank_device_warning(0, {}, 8) is None
    assert rank_device_warning(3, {"LOCAL_RANK": "3"}, 8) is None
    assert "LOCAL_RANK is 3 but batches go to cuda:0" in rank_device_warning(0, {"LOCAL_RANK": "3"}, 8)
    # One GPU visible per rank (CUDA_VISIBLE_DEVICES): cuda:0 is this rank's.
    assert rank_device_warning(0, {"LOCAL_RANK": "3"}, 1) is None
    assert rank_device_warning(0, {"LOCAL_RANK": "x"}, 8) is None


def test_default_workers_share_the_node_among_torchrun_ranks(shards):  # noqa: F811
    cpus = len(os.sched_getaffinity(0))
    assert default_workers({}) == cpus
    assert default_workers({"LOCAL_WORLD_SIZE": "8"}) == max(1, cpus // 8)
    assert default_workers({"LOCAL_WORLD_SIZE": "1"}) == cpus
    assert default_workers({"LOCAL_WORLD_SIZE": ""}) == cpus
    _, index, _ = shards
    code = textwrap.dedent(f"""
        from wdsmp.fast.loader import FastLoader
        if __name__ == "__main__":
            with FastLoader({index!r}, 4, image_size=16) as loader:
                print(loader.num_workers, sum(1 for _ in loader))
    """)
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(cpus))  # as many ranks as CPUs: one worker each
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "1"


def test_close_runs_every_cleanup_and_keeps_the_users_exception(shards):  # noqa: F811
    """A clean-up that fails (an unregistration after a CUDA error) neither skips the others
    nor the ring's unlinking, nor replaces the exception leaving a ``with`` block."""
    _, index, _ = shards
    ran = []

    def failing():
        raise RuntimeError("CUDA error: device-side assert triggered")

    loader = _loader(index)
    ring = f"/dev/shm/{loader._resources.ring.name}"
    assert os.path.exists(ring)
    loader._resources.on_close(lambda: ran.append("first"))
    loader._resources.on_close(failing)
    with pytest.raises(KeyError), pytest.warns(RuntimeWarning, match="device-side assert"):
        with loader:
            next(iter(loader))
            raise KeyError("the user's")
    assert ran == ["first"] and not os.path.exists(ring) and loader.closed
    loader = _loader(index)
    loader._resources.on_close(failing)
    with pytest.raises(RuntimeError, match="device-side assert"):
        loader.close()  # called by the user, it raises
    assert loader.closed


def test_bottleneck_names_a_failed_pinning():
    figures = {"wait_s": 1.0, "training_s": 3.0, "transfer_s": 0.5, "batches": 10, "wait_fraction": 0.01,
               "workers_busy": 0.9, "pinned": False, "pin_error": "operation not permitted (cudaError 800)"}
    line = diagnose(figures, num_workers=2, source="local files")
    assert line.startswith("training-bound") and "could not be pinned (operation not permitted" in line
    assert "pinned" not in diagnose(dict(figures, pinned=True), num_workers=2, source="local files")


def test_an_epoch_taken_without_waiting_keeps_its_order(shards):  # noqa: F811
    """``.cuda()`` takes batches ahead only as they arrive (``next_message(wait=False)``): taken
    that way, the epoch is the same batches in the same order."""
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        expected = [list(batch.keys) for batch in loader]
        delivery = iter(loader).delivery
        got, polls = [], 0
        while True:
            try:
                message = delivery.next_message(wait=False)
            except StopIteration:
                break
            polls += 1
            if message is None:
                continue
            got.append(delivery.slots.views(message).keys)
            delivery.hand(message)
            delivery.release(message)
        assert got == expected and polls >= len(expected)
        assert delivery.handed_out
        assert [list(batch.keys) for batch in loader] == [list(k) for k in expected]  # epoch 2: same order


# -- on a GPU ---------------------------------------------------------------------------------


@needs_cuda
def test_cuda_batches_equal_cpu_batches(shards):  # noqa: F811
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        cpu = {key: image for batch in loader for key, image in zip(batch.keys, batch.images)}
    with _loader(index) as loader:
        count = 0
        for batch in loader.cuda(channels_last=False):
            assert batch.images.is_cuda and batch.labels.is_cuda
            assert batch.images.shape == (4, 3, 24, 24) and batch.images.dtype == torch.uint8
            for key, image in zip(batch.keys, batch.images.cpu()):
                assert torch.equal(image, cpu[key].permute(2, 0, 1))
            count += 1
        assert count == len(loader)
        assert loader.stats["pinned"] is True and loader.stats["h2d_s"] > 0


@needs_cuda
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 0.008),
                                              (torch.float16, 0.002)])
def test_cuda_normalises_on_the_gpu(shards, dtype, tolerance):  # noqa: F811
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        reference = _reference(next(iter(loader)).images)
    with _loader(index) as loader:
        batch = next(iter(loader.cuda(mean=MEAN, std=STD, dtype=dtype)))
        assert batch.images.dtype == dtype
        assert batch.images.is_contiguous(memory_format=torch.channels_last)
        assert (batch.images.double().cpu() - reference).abs().max().item() <= tolerance


def _epoch_with_late_copies(loader, **cuda_kwargs):
    """Every GPU batch of an epoch, held, with the side stream held back 20 ms before each batch:
    a slot handed back before its copy finished would show a later batch's pixels."""
    gpu = loader.cuda(**cuda_kwargs)
    batches = iter(gpu)
    got = []
    while True:
        if gpu.stream is not None:
            with torch.cuda.stream(gpu.stream):
                torch.cuda._sleep(20_000_000)
        try:
            got.append(next(batches))
        except StopIteration:
            break
    torch.cuda.synchronize()
    return got


@needs_cuda
def test_slots_are_not_reused_before_their_copy(shards):  # noqa: F811
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        expected = [batch.images.clone() for batch in loader]
    with _loader(index, prefetch=1) as loader:
        got = _epoch_with_late_copies(loader, depth=3)
    assert len(got) == len(expected)
    assert all(torch.equal(g.images.permute(0, 2, 3, 1).cpu(), e) for g, e in zip(got, expected))


@needs_cuda
def test_the_staging_fallback_warns_and_gives_the_same_batches(shards):  # noqa: F811
    """The ring registered already (by this test), CUDA refuses a second registration: the real
    failure path, staged copies, a warning naming CUDA's error, ``stats`` saying so."""
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        expected = [batch.images.clone() for batch in loader]
    with _loader(index, prefetch=1) as loader:
        memory = np.frombuffer(loader._resources.ring.buffer, np.uint8)
        cudart = torch.cuda.cudart()
        assert int(cudart.cudaHostRegister(memory.ctypes.data, memory.nbytes, 0)) == 0
        try:
            with pytest.warns(RuntimeWarning, match="could not be registered as pinned memory"):
                got = _epoch_with_late_copies(loader, depth=2)
            stats = loader.stats
            torch.ones(1, device="cuda").sum().item()  # no stale CUDA error surfaces in torch
        finally:
            torch.cuda.synchronize()
            cudart.cudaHostUnregister(memory.ctypes.data)
    assert stats["pinned"] is False and "cudaError" in stats["pin_error"]
    assert "could not be pinned" in stats["bottleneck"]
    assert all(torch.equal(g.images.permute(0, 2, 3, 1).cpu(), e) for g, e in zip(got, expected))


@needs_cuda
def test_copy_true_break_and_resume(shards):  # noqa: F811
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        expected = [list(batch.keys) for batch in loader]
        gpu = [list(batch.keys) for batch in loader.cuda()]  # copy=True: no CPU copy, same batches
        assert gpu == expected
    with _loader(index) as loader:
        for i, batch in enumerate(loader.cuda()):
            if i == 2:
                break
        state = loader.state_dict()
    with _loader(index) as loader:
        loader.load_state_dict(state)
        assert [list(batch.keys) for batch in loader.cuda()] == expected[3:]


@needs_cuda
def test_close_with_a_suspended_cuda_iterator(shards):  # noqa: F811
    _, index, _ = shards
    loader = _loader(index)
    ring = f"/dev/shm/{loader._resources.ring.name}"
    batches = iter(loader.cuda(mean=MEAN, std=STD))
    next(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.close()
    assert not os.path.exists(ring)
    with pytest.raises(ValueError, match="closed"):
        next(batches)


@needs_cuda
def test_close_after_a_device_side_assert(shards):  # noqa: F811
    """A device-side assert breaks the context: the user's error propagates out of ``with``, the
    workers stop and the ring goes (``gpu_check.py``'s step, in a fresh interpreter)."""
    gpu_check = _gpu_check()
    data = gpu_check.Data(None)
    data.index = shards[1]
    assert gpu_check.step_device_assert(data)["raised"].endswith("Error")


@needs_cuda
def test_batches_read_at_once_on_a_late_side_stream_or_a_busy_training_stream(shards):  # noqa: F811
    """The consumer waits for each batch's last kernel, and its memory is not reused while the
    training stream may read it (``gpu_check.py``'s step)."""
    gpu_check = _gpu_check()
    data = gpu_check.Data(types.SimpleNamespace(batch=8))
    data.index = shards[1]
    data.make_reference()
    gpu_check.step_late_kernels(data)


def _gpu_check():
    """``benchmarks/gpu_check.py`` as a module."""
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "benchmarks", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.processes  # a script of its own, running loaders
def test_gpu_check_script_runs_its_cpu_parts(tmp_path):
    """``benchmarks/gpu_check.py`` as a GPU machine runs it; here, without CUDA, its CPU parts
    pass and every GPU step is reported skipped."""
    summary = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--images", "64",
                           "--batch", "16", "--budget", "240", "--seconds", "3", "--corpus", str(tmp_path / "corpus"),
                           "--json", str(summary)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = json.loads(summary.read_text())["steps"]
    for name in ("environment", "corpus", "reference", "shm"):
        assert steps[name]["status"] == "pass", steps[name]
    if not torch.cuda.is_available():
        assert steps["no_cuda"]["status"] == "pass"
        assert {entry["status"] for name, entry in steps.items() if name in ("equal", "staging", "throughput")} \
            == {"skipped"}
    assert done.stdout.strip().splitlines()[-1].startswith("gpu_check: passed")
