"""FastLoader.cuda(): batches on the GPU equal the CPU batches; slots are pinned and recycled safely.

Skipped without CUDA (CI has none); run them on a GPU machine.
"""

import pytest
import torch

from wdsmp.fast.loader import FastLoader
from tests.fast.test_loader import shards  # noqa: F401  (the module's shard fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _loader(index, **kw):
    return FastLoader(index, 4, num_workers=2, image_size=24, train=False, shuffle=False, keys=True, **kw)


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
        assert loader._resources.pinned  # the ring was registered as pinned memory


def test_cuda_normalises_on_the_gpu(shards):  # noqa: F811
    _, index, _ = shards
    mean, std = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
    with _loader(index, copy=True) as loader:
        reference = next(iter(loader)).images.permute(0, 3, 1, 2).float()
    reference = (reference - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with _loader(index) as loader:
        for dtype in (torch.float32, torch.bfloat16):
            batch = next(iter(loader.cuda(mean=mean, std=std, dtype=dtype)))
            assert batch.images.dtype == dtype
            assert batch.images.is_contiguous(memory_format=torch.channels_last)
            assert torch.allclose(batch.images.float().cpu(), reference, atol=0.05 if dtype == torch.bfloat16 else 1e-4)


def test_slots_are_not_reused_before_their_copy(shards):  # noqa: F811
    """Hold every GPU batch of an epoch: with copies in flight, none may show a later batch."""
    _, index, _ = shards
    with _loader(index, copy=True) as loader:
        expected = [batch.images.clone() for batch in loader]
    with _loader(index, prefetch=1) as loader:
        got = [batch.images for batch in loader.cuda(depth=3)]
        torch.cuda.synchronize()
    assert all(torch.equal(g.permute(0, 2, 3, 1).cpu(), e) for g, e in zip(got, expected))
