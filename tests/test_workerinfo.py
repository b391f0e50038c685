"""pytorch_worker_info and pytorch_worker_seed: node and worker from torch, then the environment."""

import pytest

from wdsmp._internal.workerinfo import pytorch_worker_info, pytorch_worker_seed


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """No rank or worker from the environment unless a test sets one."""
    for name in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def test_worker_info_from_environment(monkeypatch):
    assert pytorch_worker_info() == (0, 1, 0, 1)
    assert pytorch_worker_seed() == 0
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("WORKER", "1")
    monkeypatch.setenv("NUM_WORKERS", "3")
    assert pytorch_worker_info() == (2, 4, 1, 3)
    assert pytorch_worker_seed() == 2001
    monkeypatch.setenv("RANK", "four")
    with pytest.raises(ValueError, match="RANK='four' is not an integer"):
        pytorch_worker_info()
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="0 <= RANK < WORLD_SIZE"):
        pytorch_worker_info()


def test_worker_info_prefers_torch_distributed(tmp_path, monkeypatch):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        assert pytorch_worker_info() == (0, 1, 0, 1)
    finally:
        dist.destroy_process_group()
    assert pytorch_worker_info() == (1, 3, 0, 1)
