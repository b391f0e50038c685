"""The loader benchmark's user pipeline (``wdsmp.bench.loader.user_webdataset_loader``: decode("pil"),
to_tuple, a torchvision-like crop, flip and to-tensor, batched, in a DataLoader with two workers;
here after turning each image upright by its EXIF orientation) gives the same batches with
``import wdsmp as wds`` as with webdataset 1.0.2 (skipped without it), and wdsmp's batches leave
the workers in shared memory, as one buffer."""

import io

import numpy as np
import PIL.Image
import PIL.ImageOps
import pytest
import torch
import torch.utils.data

import wdsmp
from wdsmp.bench.loader import CropFlipToTensor

try:
    import webdataset
except ImportError:  # a reference when present, never a requirement
    webdataset = None


def _jpeg(rng, sampling, orientation):
    height, width = (int(n) for n in rng.integers(40, 90, 2))
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * y) % 251], -1)
    pixels = np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)
    exif = PIL.Image.Exif()
    exif[0x0112] = orientation  # as a camera writes it; decoders leave it to the user
    stream = io.BytesIO()
    PIL.Image.fromarray(pixels).save(stream, "JPEG", quality=int(rng.integers(70, 96)), subsampling=sampling,
                                     exif=exif.tobytes())
    return stream.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(3)
    urls = []
    for s in range(2):
        urls.append(str(directory / f"part-{s}.tar"))
        with wdsmp.TarWriter(urls[-1]) as sink:
            for i in range(10):
                jpeg = _jpeg(rng, ["4:4:4", "4:2:0", "4:2:2"][i % 3], [1, 3, 6, 8][i % 4])
                sink.write({"__key__": f"{s}-{i}", "jpg": jpeg,
                            "cls": str(10 * s + i).encode()})
    return urls


class Upright:
    """A user's transform that first turns the image as its EXIF orientation says (as many
    training scripts do), then the benchmark's crop, flip and to-tensor."""

    def __init__(self, size):
        self.transform = CropFlipToTensor(size)

    def __call__(self, image):
        return self.transform(PIL.ImageOps.exif_transpose(image))


def user_loader(wds, urls):
    """The benchmark's user code without its shuffles (webdataset's are seeded from the clock)."""
    dataset = (wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg;ppm", "cls")
               .map_tuple(Upright(224), int).batched(2))  # 1.2 MB batches: big enough to reuse memory
    return torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None)


def batches(wds, urls):
    torch.manual_seed(0)  # the DataLoader seeds each worker's random module, and so the crops, from it
    return [(images.clone(), torch.as_tensor(labels)) for images, labels in user_loader(wds, urls)]


@pytest.mark.skipif(webdataset is None, reason="webdataset is not installed (pip install 'wdsmp[bench]')")
def test_the_same_batches_as_webdataset(shards):
    ours, theirs = batches(wdsmp, shards), batches(webdataset, shards)
    assert len(ours) == len(theirs) == 10
    for (images, labels), (their_images, their_labels) in zip(ours, theirs):
        assert images.dtype == their_images.dtype and torch.equal(images, their_images)
        assert torch.equal(labels, their_labels)


def corner(image):
    return image[:, :32, :32].contiguous()


def shared(batch):
    """Run in the worker, after batched: whether the images are in shared memory there."""
    images, labels = batch
    return images.is_shared(), images, labels


def test_batches_leave_the_workers_in_shared_memory(shards):
    dataset = (wdsmp.WebDataset(shards, shardshuffle=False).decode("torchrgb8").to_tuple("jpg", "cls")
               .map_tuple(corner, int).batched(4).map(shared))
    received = list(torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None))
    assert len(received) == 6 and all(flag for flag, _, _ in received)
    in_process = list(dataset)  # no worker: a plain stack, the same values
    assert not any(flag for flag, _, _ in in_process)
    rows = {int(label): image for _, images, labels in in_process for image, label in zip(images, labels)}
    received_rows = {int(label): image for _, images, labels in received for image, label in zip(images, labels)}
    assert received_rows.keys() == rows.keys() and all(torch.equal(received_rows[k], rows[k]) for k in rows)
