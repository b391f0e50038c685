"""The code examples of the seed documents, run with ``import wdsmp as wds``.

Each test is one example, changed only where it must be: shards are written
here (OpenImages-like jpg+json, PubLayNet-like png+json) and served from
local files or a local HTTP server instead of public buckets, and
torchvision's transforms (not installed with the CPU-only torch used here)
are replaced by a function doing the same crop, flip, tensor conversion and
normalisation. The assertions are what the seeds print: shapes, dtypes, keys,
counts, batch shapes.
"""

import io
import pickle
import random
import subprocess
from functools import partial
from itertools import islice
from random import randrange

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import IterableDataset

import wdsmp as wds

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


# -- the corpus


def _noise_image(rng, height, width):
    """A smooth random image (compresses like a photo, unlike white noise)."""
    small = rng.integers(0, 256, size=(height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.BILINEAR)
    return np.asarray(image)


def _openimages(directory, nshards=4, per_shard=25):
    """Shards of ``<key>.jpg`` + ``<key>.json`` (a list of annotation dicts)."""
    rng = np.random.default_rng(0)
    for shard in range(nshards):
        with wds.TarWriter(str(directory / f"openimages-train-{shard:06d}.tar")) as sink:
            for i in range(per_shard):
                key = f"{shard:02d}{i:014x}"
                sink.write({"__key__": key,
                            "jpg": _noise_image(rng, 48 + i % 5, 64 + i % 7),
                            "json": [{"ImageID": key, "Source": "xclick", "Confidence": 1}]})
    return str(directory / f"openimages-train-{{000000..{nshards - 1:06d}}}.tar")


def _publaynet(directory, nshards=4, per_shard=3):
    """Shards of ``<key>.png`` + ``<key>.json``, pages large enough for 256x256 patches."""
    rng = np.random.default_rng(1)
    for shard in range(nshards):
        with wds.TarWriter(str(directory / f"publaynet-train-{shard:06d}.tar")) as sink:
            for i in range(per_shard):
                sink.write({"__key__": f"page{shard:02d}{i:04d}",
                            "png": _noise_image(rng, 280, 300),
                            "json": {"annotations": [{"category_id": 1 + (i % 5)}]}})
    return str(directory / f"publaynet-train-{{000000..{nshards - 1:06d}}}.tar")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("seeds")
    return {"openimages": _openimages(directory), "publaynet": _publaynet(directory),
            "dir": directory}


@pytest.fixture(scope="module")
def url(corpus):
    return corpus["openimages"]


def _preproc():
    """torchvision's RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize."""
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def preproc(image):
        width, height = image.size
        w, h = randrange(width // 2, width + 1), randrange(height // 2, height + 1)
        x, y = randrange(width - w + 1), randrange(height - h + 1)
        image = image.crop((x, y, x + w, y + h)).resize((224, 224), Image.BILINEAR)
        if random.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        tensor = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (tensor - mean) / std

    return preproc


preproc = _preproc()


def identity(x):
    return x


def add_noise(source, noise=0.01):
    for inputs, targets in source:
        inputs = inputs + noise * torch.randn_like(inputs)
        yield inputs, targets


# -- 001: the WebDataset README notebook


def test_001_shard_list(url):
    dataset = wds.SimpleShardList(url)
    assert list(islice(dataset, 3)) == [
        {"url": url.replace("{000000..000003}", f"{i:06d}")} for i in range(3)]


def test_001_tarfile_to_samples(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
    )
    samples = list(islice(dataset, 0, 3))
    assert len(samples) == 3
    for sample in samples:
        assert {"__key__", "__url__", "jpg", "json"} <= set(sample)
        assert sample["jpg"][:3] == b"\xff\xd8\xff"


def test_001_decode_rgb_to_tuple(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
        wds.decode("rgb"),
        wds.to_tuple("jpg;png", "json")
    )
    for image, data in islice(dataset, 0, 3):
        assert isinstance(image, np.ndarray) and image.dtype == np.float32
        assert image.ndim == 3 and image.shape[2] == 3 and 0.0 <= image.min() <= image.max() <= 1.0
        assert data[0]["Source"] == "xclick"


def test_001_torchvision_style_augmentation(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
        wds.decode("pil"),
        wds.to_tuple("jpg;png", "json"),
        wds.map_tuple(preproc, None)
    )
    for image, data in islice(dataset, 0, 3):
        assert image.shape == (3, 224, 224) and image.dtype == torch.float32
        assert type(data) is list


def test_001_iterator_stage(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
        wds.shuffle(100),
        wds.decode("torchrgb"),
        wds.to_tuple("jpg;png", "json"),
        add_noise
    )
    image, cls = next(iter(dataset))
    assert image.ndim == 3 and image.shape[0] == 3 and image.dtype == torch.float32


def test_001_partial_stage(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
        wds.shuffle(100),
        wds.decode("torchrgb"),
        wds.to_tuple("jpg;png", "json"),
        partial(add_noise, noise=0.1)
    )
    image, cls = next(iter(dataset))
    assert image.shape[0] == 3


def test_001_split_by_worker_and_shuffled_shards(url):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.split_by_worker,
        wds.shuffle(50),
        wds.tarfile_to_samples(),
        wds.shuffle(100),
        wds.decode("torchrgb"),
        wds.to_tuple("jpg;png", "json"),
    )
    x, y = next(iter(dataset))
    assert x.shape[0] == 3 and str(y).startswith("[{'ImageID'")


def _batched_pipeline(url, bs):
    return wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.split_by_worker,
        wds.shuffle(50),
        wds.tarfile_to_samples(),
        wds.shuffle(100),
        wds.decode("pil"),
        wds.to_tuple("jpg;png", "json"),
        wds.map_tuple(preproc, None),
        wds.batched(bs),
    )


def test_001_batched_in_dataloader_workers(url):
    bs = 20
    dataset = _batched_pipeline(url, bs)
    dataloader = torch.utils.data.DataLoader(dataset, num_workers=4, batch_size=None)
    images, targets = next(iter(dataloader))
    assert images.shape == (20, 3, 224, 224) and len(targets) == 20


def test_001_rebatch_after_the_loader(url):
    bs = 20
    dataset = _batched_pipeline(url, bs)
    dataloader = wds.DataPipeline(
        torch.utils.data.DataLoader(dataset, num_workers=4, batch_size=None),
        wds.unbatched(),
        wds.shuffle(500),
        wds.batched(bs)
    )
    batches = list(dataloader)
    images, targets = batches[0]
    assert images.shape == (20, 3, 224, 224)
    assert sum(len(b[0]) for b in batches) == 100  # every sample of every worker, once


def _png_bytes(array):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def png_dataset(tmp_path_factory):
    """Samples with ``.png`` fields, as the decoding examples expect."""
    path = tmp_path_factory.mktemp("png") / "png.tar"
    rng = np.random.default_rng(2)
    with wds.TarWriter(str(path), encoder=False) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i}", "input.png": _png_bytes(_noise_image(rng, 20, 30)),
                        "target.cls": str(i)})
    return wds.DataPipeline(wds.SimpleShardList(str(path)), wds.tarfile_to_samples())


def test_001_processor_with_a_sample_decoder(png_dataset):
    def my_sample_decoder(sample):
        result = dict(__key__=sample["__key__"])
        for key, value in sample.items():
            if key == "png" or key.endswith(".png"):
                result[key] = np.asarray(Image.open(io.BytesIO(value)))
        return result

    dataset = wds.Processor(wds.map, my_sample_decoder)(png_dataset)
    samples = list(dataset)
    assert [s["__key__"] for s in samples] == ["s0", "s1", "s2", "s3"]
    assert samples[0]["input.png"].shape == (20, 30, 3)


def test_001_decoder_with_handlers_on_a_dataset(png_dataset):
    def my_png_decoder(key, value):
        if not key.endswith(".png"):
            return None
        assert isinstance(value, bytes)
        return np.asarray(Image.open(io.BytesIO(value)))

    dataset = wds.Decoder(my_png_decoder, wds.torch_video, wds.torch_audio)(png_dataset)
    for _ in range(2):  # a dataset: iterable again
        samples = list(dataset)
        assert len(samples) == 4 and samples[1]["input.png"].shape == (20, 30, 3)
        assert samples[1]["target.cls"] == 1


def test_001_decoder_handle_extension(png_dataset):
    def my_decoder(value):
        return np.asarray(Image.open(io.BytesIO(value)))

    dataset = wds.Decoder(wds.handle_extension(".png", my_decoder))(png_dataset)
    sample = next(iter(dataset))
    assert sample["input.png"].shape == (20, 30, 3)


def test_001_resampled_webloader_with_epoch(url):
    dataset = wds.DataPipeline(
        wds.ResampledShards(url),
        wds.tarfile_to_samples(),
        wds.shuffle(100),
        wds.decode("pil"),
        wds.to_tuple("jpg;png", "json"),
        wds.map_tuple(preproc, None),
        wds.batched(8),
    )
    dataloader = wds.WebLoader(dataset, num_workers=7, batch_size=None).with_epoch(20)
    one_epoch = list(iter(dataloader))
    assert (len(one_epoch), one_epoch[0][0].shape) == (20, (8, 3, 224, 224))


def test_001_fluid_interface(url):
    dataset = (
        wds.WebDataset(url, shardshuffle=100)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg;png", "json")
        .map_tuple(preproc, None)
        .batched(8)
    )
    sample = next(iter(dataset))
    assert sample[0].shape == (8, 3, 224, 224)


def test_001_direct_copy_of_a_shard(url):
    local = url.replace("{000000..000003}", "000000")
    dataset = wds.DataPipeline(
        wds.SimpleShardList(local),
        wds.tarfile_to_samples(),
    )
    assert repr(next(iter(dataset)))[:200].startswith("{'__key__': '00")


def _listing(path):
    return subprocess.run(["tar", "tf", path], check=True, capture_output=True,
                          text=True).stdout.split()


def test_001_writing_pickles(tmp_path):
    def open_my_dataset():
        return enumerate([(np.arange(3), {"label": 1}), (np.ones(2), {"label": 2})])

    dest = str(tmp_path / "dest.tar")
    sink = wds.TarWriter(dest)
    dataset = open_my_dataset()
    for index, (input, output) in dataset:
        sink.write({
            "__key__": "sample%06d" % index,
            "input.pyd": input,
            "output.pyd": output,
        })
    sink.close()
    assert _listing(dest) == ["sample000000.input.pyd", "sample000000.output.pyd",
                              "sample000001.input.pyd", "sample000001.output.pyd"]
    sample = next(iter(wds.DataPipeline(wds.SimpleShardList(dest), wds.tarfile_to_samples())))
    assert pickle.loads(sample["output.pyd"]) == {"label": 1}


def test_001_writing_images_and_classes(tmp_path):
    def open_my_dataset():
        rng = np.random.default_rng(3)
        return enumerate((rng.random((16, 24, 3), dtype=np.float32), i) for i in range(3))

    dest = str(tmp_path / "dest.tar")
    sink = wds.TarWriter(dest)
    dataset = open_my_dataset()
    for index, (input, output) in dataset:
        assert input.ndim == 3 and input.shape[2] == 3
        assert input.dtype == np.float32 and np.amin(input) >= 0 and np.amax(input) <= 1
        assert type(output) == int
        sink.write({
            "__key__": "sample%06d" % index,
            "input.jpg": input,
            "output.cls": output,
        })
    sink.close()
    decoded = list(wds.DataPipeline(wds.SimpleShardList(dest), wds.tarfile_to_samples(),
                                    wds.decode("rgb8"), wds.to_tuple("input.jpg", "output.cls")))
    assert [cls for _, cls in decoded] == [0, 1, 2]
    assert decoded[0][0].shape == (16, 24, 3) and decoded[0][0].dtype == np.uint8


def test_001_writing_without_encoder(tmp_path):
    rng = np.random.default_rng(4)
    basenames = [str(tmp_path / f"img{i}") for i in range(2)]
    for basename in basenames:
        Image.fromarray(_noise_image(rng, 10, 12)).save(f"{basename}.png")

    def lookup_cls(basename):
        return str(basenames.index(basename))  # "an integer encoded in ASCII"

    dest = str(tmp_path / "dest.tar")
    sink = wds.TarWriter(dest, encoder=False)
    for basename in basenames:
        with open(f"{basename}.png", "rb") as stream:
            image = stream.read()
        cls = lookup_cls(basename)
        sample = {
            "__key__": basename.rsplit("/", 1)[1],
            "input.png": image,
            "target.cls": cls
        }
        sink.write(sample)
    sink.close()
    decoded = list(wds.DataPipeline(wds.SimpleShardList(dest), wds.tarfile_to_samples(),
                                    wds.decode("rgb8"), wds.to_tuple("input.png", "target.cls")))
    assert [(image.shape, cls) for image, cls in decoded] == [((10, 12, 3), 0), ((10, 12, 3), 1)]


def extract_class(data):
    # mock implementation
    return 0


def augment_wds(input, output, maxcount=999999999):
    keys = []
    src = wds.DataPipeline(
        wds.SimpleShardList(input),
        wds.tarfile_to_samples(),
        wds.decode("pil"),
        wds.to_tuple("__key__", "jpg;png", "json"),
        wds.map_tuple(None, preproc, None),
    )
    with wds.TarWriter(output) as dst:
        for key, image, data in islice(src, 0, maxcount):
            keys.append(key)
            image = image.numpy().transpose(1, 2, 0)
            image -= np.amin(image)
            image /= np.amax(image)
            sample = {
                "__key__": key,
                "png": image,
                "cls": extract_class(data)
            }
            dst.write(sample)
    return keys


def test_001_offline_augmentation(url, tmp_path):
    shard = url.replace("{000000..000003}", "000000")
    source = f"pipe:cat {shard} || true"
    output = str(tmp_path / "_temp.tar")
    keys = augment_wds(source, output, maxcount=5)
    assert len(keys) == 5
    assert _listing(output) == [f"{k}.{ext}" for k in keys for ext in ("cls", "png")]


# -- 002: a fork's README (fluid interface, compose, WebLoader)


def preprocess(sample):
    image, json = sample
    try:
        label = json["annotations"][0]["category_id"]
    except:  # noqa: E722 (as the seed writes it)
        label = 0
    return 1-image, label


def get_patches(src):
    for sample in src:
        image, label = sample
        h, w = image.shape[:2]
        for i in range(16):
            y, x = randrange(h-256), randrange(w-265)
            patch = image[y:y+256, x:x+256]
            yield (patch, label)


@pytest.fixture(scope="module")
def publaynet(corpus):
    return corpus["publaynet"]


def test_002_fluid_decode_to_tuple(publaynet):
    url = publaynet
    dataset = wds.WebDataset(url).shuffle(1000).decode("rgb").to_tuple("png", "json")
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    for image, json in dataset:
        break
    assert image.shape == (280, 300, 3) and image.dtype == np.float32
    dataset = dataset.map(preprocess)
    for image, label in dataset:
        break
    assert 1 <= label <= 5


def _patches_dataset(url):
    dataset = wds.WebDataset(url).shuffle(1000).decode("rgb").to_tuple("png", "json")
    dataset = dataset.map(preprocess)
    return dataset.compose(get_patches).shuffle(10000)


def test_002_compose_iterator_function(publaynet):
    dataset = _patches_dataset(publaynet)
    for image, json in dataset:
        break
    assert image.shape == (256, 256, 3)


def test_002_dataloader(publaynet):
    dataset = _patches_dataset(publaynet)
    loader = torch.utils.data.DataLoader(dataset, num_workers=4, batch_size=8)
    batch = next(iter(loader))
    assert (batch[0].shape, batch[1].shape) == (torch.Size([8, 256, 256, 3]), torch.Size([8]))


def test_002_webloader_rebatching(publaynet):
    dataset = _patches_dataset(publaynet)
    loader = wds.WebLoader(dataset, num_workers=4, batch_size=8)
    loader = loader.unbatched().shuffle(1000).batched(12)
    batch = next(iter(loader))
    assert (batch[0].shape, batch[1].shape) == (torch.Size([12, 256, 256, 3]), torch.Size([12]))


def test_002_complete_pipeline(publaynet):
    url = publaynet
    dataset = wds.WebDataset(url).shuffle(1000).decode("rgb").to_tuple("png", "json").map(preprocess)
    dataset = dataset.compose(get_patches)
    dataset = dataset.batched(16)

    loader = wds.WebLoader(dataset, num_workers=4, batch_size=None)
    loader = loader.unbatched().shuffle(1000).batched(12)

    batch = next(iter(loader))
    assert (batch[0].shape, batch[1].shape) == (torch.Size([12, 256, 256, 3]), torch.Size([12]))
    batches = list(loader)
    assert sum(len(b[1]) for b in batches) == 4 * 3 * 16  # every patch of every page, once


def test_002_pipeline_interface(publaynet):
    url = publaynet
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.shuffle(100),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.shuffle(1000),
        wds.decode("torchrgb"),
        # at this point, we have an list of decompressed training samples from each shard in this worker in sequence
        get_patches,  # note that can put iterator->iterator functions into the pipeline directly
        wds.shuffle(10000),
        wds.batched(16)
    )
    assert isinstance(dataset, IterableDataset)  # the seed builds it and goes on with `loader`


def test_002_resampled_fluid_with_epoch(publaynet):
    url = publaynet
    dataset = (wds.WebDataset(url, resampled=True).shuffle(1000).decode("rgb").to_tuple("png", "json")
               .map(preprocess).with_epoch(10000))
    sample = next(iter(dataset))
    assert sample[0].shape == (280, 300, 3)
    assert len(list(islice(dataset, 50))) == 50  # endless shards: more than the 12 pages


def test_002_resampled_pipeline_with_epoch(publaynet):
    url = publaynet
    dataset = wds.DataPipeline(
        wds.ResampledShards(url),
        wds.tarfile_to_samples(),
        wds.shuffle(1000),
        wds.decode("rgb8"),
        wds.to_tuple("png", "json"),
        wds.map(preprocess),
        get_patches,
        wds.shuffle(10000),
        wds.batched(16)
    ).with_epoch(10)
    batches = list(dataset)
    assert len(batches) == 10 and batches[0][0].shape == (16, 256, 256, 3)


def test_002_length_and_epoch_combined(publaynet):
    dataset = wds.WebDataset(publaynet, resampled=True).with_epoch(7).with_length(7, silent=True)
    assert len(dataset) == 7 and len(list(dataset)) == 7


def test_002_tar_header_overhead_msgpack_samples(tmp_path):
    dest = str(tmp_path / "mp.tar")
    with wds.TarWriter(dest) as writer:
        for i in range(5):
            sample = {"text": f"line {i}", "label": i}
            sample = dict(__key__=f"k{i}", mp=sample)
            writer.write(sample)
    dataset = wds.WebDataset(dest).decode()
    dataset = dataset.map(lambda sample: sample["mp"])
    assert [s["label"] for s in dataset] == [0, 1, 2, 3, 4]


# -- 004: a user's tutorial (npy fields, a custom decoder)


def npy_decoder(key, value):
    if not key.endswith(".npy"):
        return None
    assert isinstance(value, bytes)
    return np.load(io.BytesIO(value))


def test_004_npy_fields_and_custom_decoder(tmp_path):
    def open_my_dataset():
        return enumerate((np.full(4, i, np.float32), np.array([i])) for i in range(3))

    dest = str(tmp_path / "dest.tar")
    sink = wds.TarWriter(dest)
    dataset = open_my_dataset()
    for index, (input, output) in dataset:
        sink.write({
            "__key__": "sample%06d" % index,
            "input.npy": input,
            "output.npy": output,
        })
    sink.close()

    from wdsmp import DataPipeline

    dataset = DataPipeline(
        wds.SimpleShardList(dest),
        wds.tarfile_to_samples(),
        wds.decode(npy_decoder),
        wds.to_tuple("input.npy", "output.npy"),
    )
    pairs = list(dataset)
    assert [int(out[0]) for _, out in pairs] == [0, 1, 2]
    assert pairs[2][0].dtype == np.float32 and pairs[2][0].tolist() == [2.0] * 4

    # The tutorial reads fields it never wrote ("seq.npy", "target.npy"):
    # webdataset fails obscurely there; wdsmp names the field, sample and shard.
    dataset = DataPipeline(
        wds.SimpleShardList(dest),
        wds.tarfile_to_samples(),
        wds.decode(npy_decoder),
        wds.to_tuple("seq.npy", "target.npy"),
    )
    with pytest.raises(wds.SampleError, match=r"seq\.npy.*sample000000|sample000000.*seq\.npy"):
        next(iter(dataset))


# -- remote shards: 000 (caching) and the URL sections of 001 and 002


def _shard_path(corpus, name="openimages", index=0):
    return corpus[name].replace("{000000..000003}", f"{index:06d}")


@pytest.fixture
def served(corpus, http_server):
    """The OpenImages-like shards on a local HTTP server; the brace URL of all four."""
    for index in range(4):
        with open(_shard_path(corpus, index=index), "rb") as stream:
            http_server.put_file(f"openimages-train-{index:06d}.tar", stream.read())
    return http_server.url("openimages-train-{000000..000003}.tar")


def test_001_pipe_curl_urls(served):
    url = served
    url = f"pipe:curl -L -s {url} || true"
    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        wds.tarfile_to_samples(),
    )
    samples = list(dataset)
    assert len(samples) == 100 and samples[0]["jpg"][:3] == b"\xff\xd8\xff"


def test_000_local_copy(corpus):
    dataset = wds.WebDataset(_shard_path(corpus))
    assert repr(next(iter(dataset)))[:200].startswith("{'__key__': '00")


def test_000_shard_cache_second_pass_reads_no_network(corpus, http_server, tmp_path,
                                                       monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with open(_shard_path(corpus), "rb") as stream:
        original = stream.read()
    url = http_server.put_file("openimages-train-000000.tar", original)
    dataset = wds.WebDataset(url, cache_dir="./cache", verbose=True)

    print("=== first pass")
    for sample in dataset:
        pass
    fetched = len(http_server.requests())
    assert fetched >= 1

    print("=== second pass")
    for i, sample in enumerate(dataset):
        for key, value in sample.items():
            print(key, repr(value)[:50])
        print()
        if i >= 3: break

    assert len(http_server.requests()) == fetched  # served from ./cache
    cached = [p for p in (tmp_path / "cache").iterdir() if p.is_file() and p.suffix == ".tar"]
    assert len(cached) == 1 and cached[0].read_bytes() == original  # bit-identical
    out = capsys.readouterr()
    assert "jpg b'\\xff\\xd8\\xff" in out.out and "caching" in out.err


def test_000_dbcache_serves_the_second_pass(served, http_server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    url = served.replace("{000000..000003}", "000000")
    dataset = wds.WebDataset(url).compose(wds.DBCache, "./cache.db", 1000)

    print("=== first pass")
    for sample in dataset:
        pass
    fetched = len(http_server.requests())

    print("=== second pass")
    keys = []
    for i, sample in enumerate(dataset):
        keys.append(sample["__key__"])
        if i >= 3: break
    assert len(http_server.requests()) == fetched
    assert len(keys) == 4 and (tmp_path / "cache.db").exists()
    assert "[DBCache opened ./cache.db size 1000 total 0]" in capsys.readouterr().err
    restarted = wds.WebDataset(url).compose(wds.DBCache, "./cache.db", 1000)
    assert len(list(restarted)) == 25 and len(http_server.requests()) == fetched


def test_002_verbose_cache_variable(corpus, http_server, tmp_path, monkeypatch, capsys):
    import os
    monkeypatch.setitem(os.environ, "WDS_VERBOSE_CACHE", "1")
    with open(_shard_path(corpus), "rb") as stream:
        url = http_server.put_file("shard.tar", stream.read())
    assert len(list(wds.WebDataset(url, cache_dir=str(tmp_path / "cache")))) == 25
    assert "caching" in capsys.readouterr().err


def test_002_cbors(tmp_path, monkeypatch):
    import cbor2 as cbor

    monkeypatch.chdir(tmp_path)
    with open("test.cbors", "wb") as stream:
        for i in np.linspace(-5.0, 5.0, 1000):
            cbor.dump((i, str(i)[-5:]), stream)
    with open("test.cbors", "rb") as stream:
        assert [cbor.load(stream) for i in range(3)][0] == [-5.0, "-5.0"]
    dataset = wds.DataPipeline(
        wds.SimpleShardList("test.cbors"),
        wds.cbors_to_samples(),
    )
    data = list(iter(dataset))
    assert (len(data), data[0]) == (1000, [-5.0, "-5.0"])


def test_002_yaml_dataset_spec(corpus, tmp_path):
    openimages, publaynet = corpus["openimages"], corpus["publaynet"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
dataset:
  - shards: {openimages}
    scaleprob: 0.3
  - shards: {publaynet}
    scale: [1.0, 3.0]
  - shards: {openimages}
    extensions: jpg
    scale: [0.3, 1.0]
""")
    samples = list(islice(wds.WebDataset(str(spec), resampled=True, seed=1), 60))
    assert len(samples) == 60
    kinds = {("png" if "png" in s else "jpg") for s in samples}
    assert kinds == {"png", "jpg"}
    assert any("json" not in s for s in samples)  # the third collection keeps jpg only


def test_002_url_rewriting(corpus, monkeypatch):
    directory = str(corpus["dir"])
    monkeypatch.setenv("WDS_REWRITE", f"gs://nvdata-openimages/={directory}/")
    dataset = wds.WebDataset("gs://nvdata-openimages/openimages-train-{000000..000001}.tar")
    assert len(list(dataset)) == 50


def test_002_ais_proxy(corpus, http_server, monkeypatch):
    with open(_shard_path(corpus), "rb") as stream:
        http_server.put_file("v1/objects/nvdata-openimages/openimages-train-000000.tar",
                             stream.read())
    monkeypatch.setenv("AIS_ENDPOINT", http_server.endpoint)
    monkeypatch.setenv("USE_AIS_FOR", "gs")
    dataset = wds.WebDataset("gs://nvdata-openimages/openimages-train-000000.tar")
    assert len(list(dataset)) == 25
    [request] = http_server.requests()
    assert request.path.startswith("/v1/objects/nvdata-openimages/openimages-train-000000.tar")


def test_002_downloaded_shards_override_through_the_cache(corpus, http_server, tmp_path):
    import os
    import shutil

    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(_shard_path(corpus), cache / "openimages-train-000000.tar")
    url = http_server.url("openimages-train-000000.tar")  # not on the server at all
    dataset = wds.WebDataset(url, cache_dir=str(cache), cache_name=os.path.basename)
    assert len(list(dataset)) == 25 and http_server.requests() == []


# -- 000's table of usage scenarios, one test per row that the tests above do not cover


@pytest.fixture
def bucket(corpus, s3_server):
    """The OpenImages-like shards in an S3 bucket on the local S3 server."""
    s3_server.create_bucket("nvdata-openimages")
    for index in range(4):
        with open(_shard_path(corpus, index=index), "rb") as stream:
            s3_server.put("nvdata-openimages", f"openimages-train-{index:06d}.tar", stream.read())
    return "s3://nvdata-openimages/openimages-train-{000000..000003}.tar"


def test_000_cloud_training_against_cloud_buckets(bucket):
    """Row 1: use WebDataset directly with cloud URLs."""
    dataset = wds.WebDataset(bucket, shardshuffle=10).decode("rgb8").to_tuple("jpg", "json")
    loader = wds.WebLoader(dataset.listed(25), num_workers=2, batch_size=None)
    batches = list(loader)
    assert [len(batch) for batch in batches] == [25] * 4
    assert batches[0][0][0].dtype == torch.uint8 and batches[0][0][0].shape[2] == 3  # DataLoader converts


def test_000_slower_object_store_with_shard_cache(bucket, s3_server, tmp_path):
    """Row 4: shard caching for the entire dataset; the second pass needs no store at all."""
    dataset = wds.WebDataset(bucket, cache_dir=str(tmp_path / "cache"))
    first = [s["__key__"] for s in dataset]
    for index in range(4):
        s3_server.client().delete_object(Bucket="nvdata-openimages",
                                         Key=f"openimages-train-{index:06d}.tar")
    assert [s["__key__"] for s in dataset] == first and len(first) == 100


def test_000_other_iterable_sources_with_dbcache(tmp_path):
    """Row 6: DBCache in front of an IterableDataset that is not a WebDataset."""

    class SlowSource(IterableDataset):
        reads = 0

        def __iter__(self):
            SlowSource.reads += 1
            for i in range(30):
                yield {"__key__": f"row{i}", "value": i * i}

    dataset = wds.DBCache(SlowSource(), str(tmp_path / "cache.db"), 30, verbose=False)
    assert [s["value"] for s in dataset] == [i * i for i in range(30)]
    assert [s["value"] for s in dataset] == [i * i for i in range(30)]
    assert SlowSource.reads == 1
