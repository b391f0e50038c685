"""decode("pil")'s lazy JPEG images (``wdsmp/images/lazyjpeg.py``): a crop or a resize that decodes only
its region gives Pillow's result byte for byte, and everything else behaves as the plain image
webdataset's decode("pil") returns."""

import copy
import io
import os
import pickle
import random
import sys

import hypothesis
import hypothesis.strategies as st
import numpy as np
import PIL.Image
import pytest
import simplejpeg

from wdsmp import autodecode
from wdsmp.native import core as native
from wdsmp.images.lazyjpeg import LazyJpegImage, crop_region, one_clean_scan, resize_region

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
from photos import photo  # noqa: E402

FILTERS = [PIL.Image.Resampling.NEAREST, PIL.Image.Resampling.BOX, PIL.Image.Resampling.BILINEAR,
           PIL.Image.Resampling.HAMMING, PIL.Image.Resampling.BICUBIC, PIL.Image.Resampling.LANCZOS]
LIMITS = {"max_side": 1 << 15, "max_pixels": 1 << 28}

needs_regions = pytest.mark.skipif(
    not native.jpeg_region_available() or not hasattr(PIL.Image, "fromarrow"),
    reason="lazy images need the JPEG region decoder and Pillow 11.2 or later")


def pillow_jpeg(pixels, **options):
    stream = io.BytesIO()
    PIL.Image.fromarray(pixels).save(stream, "JPEG", **options)
    return stream.getvalue()


def pillows(data):
    """webdataset's decode("pil"): Pillow's open, load, convert."""
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        image.load()
        return image.convert("RGB")


def lazy(data):
    image = autodecode.imagehandler("pil")(".jpg", data)
    assert isinstance(image, LazyJpegImage)
    return image


def synthetic_jpegs():
    """Each sampling layout, restart markers, odd and tiny sizes."""
    files = {}
    for height, width in ((61, 83), (40, 33), (17, 9), (3, 50), (50, 2), (1, 1), (2, 3), (35, 1)):
        pixels = photo(height, width, seed=height * width)
        for sampling in ("444", "422", "420", "440", "411"):
            files[f"{height}x{width} {sampling}"] = simplejpeg.encode_jpeg(pixels, 85, colorsubsampling=sampling)
        files[f"{height}x{width} restart markers"] = pillow_jpeg(pixels, quality=80, restart_marker_blocks=2)
    return files


def boxes(width, height, rng, count):
    """Random boxes, boxes on every edge, 1 and 2 pixel wide or high ones, fractional ones."""
    yield from ((0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, width, height),
                (0, 0, width, min(2, height)), (max(width - 2, 0), 0, width, height))
    for _ in range(count):
        x0, y0 = rng.uniform(0, width - 0.5), rng.uniform(0, height - 0.5)
        x1, y1 = rng.uniform(x0 + 0.25, width), rng.uniform(y0 + 0.25, height)
        if rng.random() < 0.3:
            x0, y0, x1, y1 = int(x0), int(y0), max(int(x1), int(x0) + 1), max(int(y1), int(y0) + 1)
        if rng.random() < 0.2:
            x1 = min(x0 + rng.choice((1, 2)), width)
        yield x0, y0, x1, y1


def sizes(rng):
    """Output sizes: shrinking, enlarging, one pixel, stretching."""
    return [(1, 1), (rng.randint(2, 9), rng.randint(2, 9)), (rng.randint(30, 120), rng.randint(30, 120))]


@needs_regions
def test_region_crops_and_resizes_equal_pillows_on_whole_images():
    rng = random.Random(3)
    regions = 0
    for name, data in synthetic_jpegs().items():
        whole = pillows(data)
        for box in boxes(*whole.size, rng, 6):
            for size in sizes(rng):
                for resample in FILTERS:
                    image = lazy(data)
                    ours = image.resize(size, resample, box=box)
                    regions += type(image) is LazyJpegImage
                    assert np.array_equal(np.asarray(ours), np.asarray(whole.resize(size, resample, box=box))), \
                        (name, box, size, resample)
            crop = tuple(round(v) for v in box)
            image = lazy(data)
            assert np.array_equal(np.asarray(image.crop(crop)), np.asarray(whole.crop(crop))), (name, crop)
    assert regions > 500, "most calls decoded a region only"


@needs_regions
def test_photographs_through_the_benchmark_transforms_equal_webdatasets():
    """RandomResizedCrop as the benchmark writes it (resize with a box) and as torchvision does it
    (crop, then resize), on wdsmp's decode("pil") and webdataset's, with the same random draws."""
    webdataset = pytest.importorskip("webdataset")
    from wdsmp.bench.loader import CropFlipToTensor, RandomResizedCropFlip

    def torchvision_style(image, box):
        return np.asarray(image.crop(box).resize((64, 64), PIL.Image.Resampling.BILINEAR))

    theirs_decode = webdataset.autodecode.imagehandler("pil")
    for seed in range(8):
        data = pillow_jpeg(photo(150 + 7 * seed, 230 - 9 * seed, seed=seed), quality=90,
                           subsampling=["4:4:4", "4:2:0", "4:2:2"][seed % 3])
        for transform in (RandomResizedCropFlip(64), CropFlipToTensor(64)):
            random.seed(seed)
            ours = transform(lazy(data))
            random.seed(seed)
            theirs = transform(theirs_decode(".jpg", data))
            assert np.array_equal(np.asarray(ours), np.asarray(theirs))
        box = RandomResizedCropFlip(64).box(150 + 7 * seed, 230 - 9 * seed)
        assert np.array_equal(torchvision_style(lazy(data), box), torchvision_style(theirs_decode(".jpg", data), box))


def test_resize_region_holds_every_pixel_pillow_reads():
    """Pillow's resize of an image whose pixels outside ``resize_region`` are garbage equals its
    resize of the image itself: the region is all its filters read (Pillow alone, no JPEG)."""
    rng = random.Random(7)
    pixels = photo(47, 71, seed=1)
    whole = PIL.Image.fromarray(pixels)
    garbage = np.random.default_rng(0).integers(0, 256, pixels.shape, np.uint8)
    for box in boxes(71, 47, rng, 40):
        for size in sizes(rng):
            for resample in FILTERS:
                top, left, bottom, right = resize_region((71, 47), size, resample, box)
                poisoned = garbage.copy()
                poisoned[top:bottom, left:right] = pixels[top:bottom, left:right]
                ours = PIL.Image.fromarray(poisoned).resize(size, resample, box=box)
                assert ours == whole.resize(size, resample, box=box), (box, size, resample)
        x0, y0, x1, y1 = (round(v) for v in box)
        crop = (x0 - 3, y0 - 3, max(x1, x0 + 1) + 2, max(y1, y0 + 1) + 2)  # partly outside the image too
        top, left, bottom, right = crop_region((71, 47), crop)
        poisoned = garbage.copy()
        poisoned[top:bottom, left:right] = pixels[top:bottom, left:right]
        assert PIL.Image.fromarray(poisoned).crop(crop) == whole.crop(crop)


def test_regions_not_bounded_decode_whole():
    assert resize_region((10, 10), (5, 5), PIL.Image.Resampling.BILINEAR, None) is None
    assert resize_region((10, 10), (5, 5), 99, (0, 0, 5, 5)) is None
    assert resize_region((10, 10), (5, 5), [1], (0, 0, 5, 5)) is None
    assert resize_region((10, 10), (5, 5), None, (0, 0, 11, 5)) is None
    assert resize_region((10, 10), (0, 5), None, (0, 0, 5, 5)) is None
    assert crop_region((10, 10), (20, 20, 30, 30)) is None
    assert crop_region((10, 10), (5, 5, 4, 6)) is None
    assert crop_region((10, 10), "abcd") is None


@needs_regions
def test_decode_region_into_writes_only_the_region():
    from wdsmp.native import _jpegregion

    pixels = photo(64, 96, seed=2)
    data = simplejpeg.encode_jpeg(pixels, 90, colorsubsampling="420")
    out = np.zeros((64, 96, 4), np.uint8)
    left, width = _jpegregion.decode_region_into(data, out, 20, 40, 10, 8, **LIMITS)
    assert left <= 40 - 16 and left + width >= 48 + 16 and left % 16 == 0
    assert not out[:20].any() and not out[30:].any() and not out[:, :left].any()
    assert np.array_equal(out[20:30, 40:48, :3], np.asarray(pillows(data))[20:30, 40:48])
    assert (out[20:30, left:left + width, 3] == 255).all()
    with pytest.raises(ValueError, match="out is 95x64"):
        _jpegregion.decode_region_into(data, np.zeros((64, 95, 4), np.uint8), 0, 0, 1, 1, **LIMITS)
    with pytest.raises(ValueError, match="not inside"):
        _jpegregion.decode_region_into(data, out, 60, 0, 5, 1, **LIMITS)


@needs_regions
def test_lazy_images_behave_as_plain_ones():
    data = pillow_jpeg(photo(40, 60, seed=4), quality=90, dpi=(72, 72))
    reference = pillows(data)
    image = lazy(data)
    assert isinstance(image, PIL.Image.Image) and image.format is None and image.readonly
    assert (image.size, image.mode, image.info) == (reference.size, reference.mode, reference.info)
    assert image == reference and reference == lazy(data) and lazy(data) == lazy(data)
    assert type(image) is PIL.Image.Image, "reading the pixels made it a plain image"
    assert lazy(data) != None and type(lazy(data).crop((0, 0, 5, 5))) is PIL.Image.Image  # noqa: E711

    for use in (np.asarray, lambda im: im.convert("L"), lambda im: im.load()[3, 4], copy.copy, copy.deepcopy,
                lambda im: pickle.loads(pickle.dumps(im)), lambda im: im.transpose(PIL.Image.FLIP_LEFT_RIGHT)):
        image = lazy(data)
        result = use(image)
        assert type(image) is PIL.Image.Image
        assert np.array_equal(np.asarray(result), np.asarray(use(reference)))
    assert type(pickle.loads(pickle.dumps(lazy(data)))) is PIL.Image.Image

    image = lazy(data)
    part = image.crop((5, 6, 20, 30))
    assert type(image) is LazyJpegImage and part == reference.crop((5, 6, 20, 30))
    assert np.array_equal(np.asarray(image), np.asarray(reference)), "the whole image after a crop"

    image, expected = lazy(data), reference.copy()
    image.paste((1, 2, 3), (4, 4, 9, 9))
    expected.paste((1, 2, 3), (4, 4, 9, 9))
    assert image == expected and lazy(data) == reference, "an in-place change changes that image alone"

    image = lazy(data)
    image.info["mine"] = 1
    assert image.resize((8, 8), box=(1, 1, 30, 30)).info["mine"] == 1

    for call, message in ((lambda im: im.resize((5, 5), 99, box=(0, 0, 9, 9)), "Unknown resampling filter"),
                          (lambda im: im.resize((5, 5), box=(0, 0, 99, 9)), "box can't exceed"),
                          (lambda im: im.crop((9, 0, 5, 5)), "right")):
        with pytest.raises(ValueError, match=message):
            call(reference)
        with pytest.raises(ValueError, match=message):
            call(lazy(data))

    image = lazy(data)
    image.close()
    with pytest.raises(ValueError, match="closed"):
        image.tobytes()


@needs_regions
def test_crops_of_one_image_stop_decoding_regions_past_its_size():
    image = lazy(pillow_jpeg(photo(64, 64, seed=5), quality=90))
    image.crop((0, 0, 32, 32))
    assert type(image) is LazyJpegImage
    image.crop((0, 32, 64, 64))  # with the first, more than the image's share for regions
    assert type(image) is PIL.Image.Image


def damaged(data, rng):
    """``data`` with bytes of its image data changed, the end marker kept: a few, many, or a
    marker made where image data should be (a corrupt 0xFF), in the upper or the lower half."""
    scan = data.index(b"\xff\xda")
    for where in (0.3, 0.8):
        at = scan + int((len(data) - scan) * where)
        yield data[:at] + bytes(rng.randrange(0, 255) for _ in range(4)) + data[at + 4:]
        yield data[:at] + bytes(rng.randrange(0, 255) for _ in range(200)) + data[at + 200:]
        for marker in (b"\xff\xc4", b"\xff\xd8", b"\xff\xda", b"\xff\x55"):
            yield data[:at] + marker + data[at + 2:]


@needs_regions
def test_damaged_jpegs_give_what_pillow_gives_or_fail_in_decode_as_it_fails():
    """NOTE [damage past the region]: a region of a damaged JPEG is Pillow's region where Pillow
    decodes the file, and where Pillow fails, ``decode`` fails, whatever the region."""
    rng = random.Random(9)
    decoder = autodecode.Decoder(["pil"])
    outcomes = set()
    for seed, sampling in enumerate(("4:4:4", "4:2:0")):
        data = pillow_jpeg(photo(96, 80, seed=seed), quality=90, subsampling=sampling)
        for bad in damaged(data, rng):
            try:
                whole = pillows(bad)
            except OSError as exn:
                with pytest.raises(autodecode.DecodingError) as ours:
                    decoder.decode({"__key__": "k", "jpg": bad})
                assert type(ours.value.__cause__) is type(exn)
                outcomes.add("Pillow fails")
                continue
            outcomes.add("Pillow decodes")
            for box in ((0, 0, 40, 30), (10, 60, 70, 96)):
                image = decoder.decode({"__key__": "k", "jpg": bad})["jpg"]
                assert image.resize((16, 16), box=box) == whole.resize((16, 16), box=box)
    assert outcomes == {"Pillow fails", "Pillow decodes"}


@needs_regions
def test_one_clean_scan_finds_markers_in_image_data():
    data = pillow_jpeg(photo(40, 40, seed=8), quality=90, restart_marker_blocks=1,
                       exif=PIL.Image.Exif().tobytes(), icc_profile=b"\xff\xda" * 100)
    assert one_clean_scan(data) and one_clean_scan(memoryview(data))
    scan = data.index(b"\xff\xda", data.index(b"\xff\xdb"))
    assert not one_clean_scan(data[:-2]) and not one_clean_scan(data + b"\0")
    assert not one_clean_scan(data[:-20] + b"\xff\xc4" + data[-18:])
    assert one_clean_scan(data[:scan + 40] + b"\xff\x00" + data[scan + 42:])
    assert not one_clean_scan(pillow_jpeg(photo(40, 40, seed=8), progressive=True))


@needs_regions
@hypothesis.settings(max_examples=500, deadline=None)
@hypothesis.given(data=st.binary(max_size=24).map(lambda b: bytes(b"\x00\xff\xd0\xd7\xd8\xc4"[v % 6] for v in b)),
                  start=st.integers(-3, 27), end=st.integers(-3, 27))
def test_find_marker_finds_the_first_marker_within_the_range(data, start, end):
    """The native scan against its definition: the first 0xFF, both bytes in ``data[start:end]``,
    followed by other than 0x00 or 0xD0-0xD7."""
    want = next((i for i in range(max(start, 0), min(end, len(data)) - 1)
                 if data[i] == 0xFF and not (data[i + 1] == 0 or 0xD0 <= data[i + 1] <= 0xD7)), -1)
    assert native.jpeg_region_module().find_marker(data, start, end) == want


def test_the_twins_and_cut_jpegs_decode_eagerly(monkeypatch):
    data = pillow_jpeg(photo(20, 30, seed=7), quality=90)
    assert type(autodecode.imagehandler("pil")(".jpg", data[:-2] + b"\0\0")) is PIL.Image.Image
    progressive = pillow_jpeg(photo(20, 30, seed=7), quality=90, progressive=True)
    assert type(autodecode.imagehandler("pil")(".jpg", progressive)) is PIL.Image.Image
    monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    image = autodecode.imagehandler("pil")(".jpg", data)
    assert type(image) is PIL.Image.Image and image == pillows(data)


@needs_regions
def test_threads_using_one_lazy_image_at_once_get_pillows_results():
    """NOTE [threads]: crops, resizes and whole reads of one image from several threads at once
    all give webdataset's results, whichever thread makes it a plain image."""
    import threading

    data = pillow_jpeg(photo(300, 400, seed=6), quality=90)
    reference = pillows(data)
    uses = {
        "crop": lambda im: im.crop((50, 40, 350, 260)),
        "resize": lambda im: im.resize((32, 32), box=(0, 0, 300, 250)),
        "asarray": np.asarray,
        "getpixel": lambda im: im.getpixel((5, 7)),
    }
    expected = {name: np.asarray(use(reference)) for name, use in uses.items()}
    failures = []

    def run(image, name, start):
        start.wait(timeout=60)
        try:
            if not np.array_equal(np.asarray(uses[name](image)), expected[name]):
                failures.append(name)
        except Exception as exn:  # noqa: BLE001 (every failure is reported below)
            failures.append(f"{name}: {exn!r}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        together = [("crop", "asarray"), ("resize", "crop", "getpixel"), ("asarray", "asarray")] * 10
        for names in together + [("crop", "crop")] * 10:
            image = lazy(data)
            start = threading.Barrier(len(names))
            threads = [threading.Thread(target=run, args=(image, name, start)) for name in names]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert not failures, (names, failures)
            assert type(image) is PIL.Image.Image and image == reference, "the regions kept to their share"
    finally:
        sys.setswitchinterval(interval)


def overflowing_huffman_table(data):
    """``data`` with its first Huffman table made impossible (three codes of one bit) and no byte
    moved: ``PIL.Image.open`` reads the file, libjpeg-turbo refuses the table when it starts decoding."""
    at = data.index(b"\xff\xc4") + 5  # past the marker, the length and the table's class and id
    counts = bytearray(data[at:at + 16])  # how many codes have 1, 2, ... 16 bits
    assert counts[2] >= 3
    counts[0] += 3
    counts[2] -= 3
    return data[:at] + bytes(counts) + data[at + 16:]


@needs_regions
def test_damaged_tables_fail_in_decode_as_pillows_load_fails():
    """Damage before the image data that only libjpeg-turbo sees fails in ``decode``, as webdataset's
    ``load`` does, not at the first use of a lazy image."""
    from wdsmp.native import _jpegregion

    data = pillow_jpeg(photo(40, 60, seed=3), quality=90)
    bad = overflowing_huffman_table(data)
    _jpegregion.check_start(data, **LIMITS)
    with pytest.raises(ValueError, match="Huffman"):
        _jpegregion.check_start(bad, **LIMITS)
    with PIL.Image.open(io.BytesIO(bad)) as header:
        assert header.size == (60, 40)
    with pytest.raises(OSError) as theirs:
        pillows(bad)
    with pytest.raises(type(theirs.value)):
        autodecode.imagehandler("pil")(".jpg", bad)
    with pytest.raises(autodecode.DecodingError) as ours:
        autodecode.Decoder(["pil"]).decode({"__key__": "k", "jpg": bad})
    assert type(ours.value.__cause__) is type(theirs.value)


@needs_regions
def test_a_lazy_image_keeps_its_own_copy_of_a_buffer_it_was_given():
    """The handler given a bytearray or a memoryview returns an image of those bytes as they were,
    whatever the caller does with its buffer afterwards (changes it, or releases an mmap's)."""
    import mmap
    import tempfile

    data = pillow_jpeg(photo(40, 60, seed=1), quality=90)
    reference = pillows(data)
    handler = autodecode.imagehandler("pil")
    buffer = bytearray(data)
    image = handler(".jpg", buffer)
    buffer[:] = pillow_jpeg(photo(40, 60, seed=2), quality=90)
    assert image.crop((1, 2, 20, 30)) == reference.crop((1, 2, 20, 30)) and image == reference
    with tempfile.TemporaryFile() as stream:
        stream.write(data)
        stream.flush()
        with mmap.mmap(stream.fileno(), 0) as mapped:
            image = handler(".jpg", memoryview(mapped))
        assert image == reference
