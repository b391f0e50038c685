"""decode_into and its boxes: torchvision's geometry, DCT-scaled JPEGs, every input format, refusals."""

import io
import math
import random
import re
import struct
import sys
import time
import zlib

import numpy as np
import PIL.Image
import pytest
import simplejpeg

import wdsmp.native.core
from wdsmp import DecodeError
from wdsmp.fast.imagedecode import (
    MAX_PIXELS,
    MAX_SIDE,
    ImageInfo,
    center_crop_box,
    dct_scale,
    decode_into,
    decode_with_options,
    random_resized_crop_box,
)
from wdsmp.fast.options import DecodeOptions
from wdsmp.native.core import jpeg_region_available, jpeg_region_module

from benchmarks.photos import photo

from ..conftest import region_decoder_missing
from .test_imgops import kernel


def encode(pixels, format="JPEG", mode=None, **kw):
    image = PIL.Image.fromarray(pixels)
    if mode is not None:
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format, **kw)
    return buf.getvalue()


def jpeg(height, width, quality=95, seed=0, **kw):
    return encode(photo(height, width, seed), quality=quality, **kw)


def pil_eval_reference(image, size=224, resize_ratio=0.875):
    """torchvision's eval transform on a PIL image: Resize(S) then CenterCrop(size), as Pillow pixels."""
    width, height = image.size
    short = math.floor(size / resize_ratio)
    if width <= height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    resized = image.resize((new_w, new_h), PIL.Image.BILINEAR, reducing_gap=None)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return np.asarray(resized.crop((left, top, left + size, top + size)))


def decode(data, size=(224, 224), train=False, rng=None, **kw):
    out = np.zeros(size + (3,), np.uint8)
    info = decode_into(data, out, train, rng, **kw)
    return out, info


def diff(a, b):
    d = np.abs(a.astype(int) - b.astype(int))
    return d.mean(), d.max()


@pytest.fixture(params=["region", "whole"])
def region(request, impl):
    """Run a JPEG test with the region decoder and with whole-image decoding; the first
    only where the region decoder is in use (built, and the native core selected)."""
    if request.param == "region" and not jpeg_region_available():
        pytest.skip(region_decoder_missing())
    return request.param == "region"


def check_decoded(info, whole, region):
    """``info.decoded`` is the whole (scaled) image, or with the region decoder a smaller part of it."""
    if region:
        assert info.decoded[0] <= whole[0] and info.decoded[1] <= whole[1] and info.decoded != whole
    else:
        assert info.decoded == whole


# Boxes.


def fits_the_draw(box, height, width, scale, ratio):
    """Whether a box can come from one try: real sides within 0.5 of it with an area
    fraction in ``scale`` and an aspect ratio in ``ratio``."""
    y0, x0, h, w = box
    area = height * width
    return ((w + 0.5) * (h + 0.5) >= scale[0] * area and (w - 0.5) * (h - 0.5) <= scale[1] * area
            and (w + 0.5) / (h - 0.5) >= ratio[0] and (w - 0.5) / (h + 0.5) <= ratio[1])


def is_the_fallback(box, height, width, ratio):
    """Whether a box is torchvision's fallback, by what it is rather than how it is computed: the
    largest box (the image's full width or full height) centred in the image (rounded down) whose
    aspect ratio, within rounding, is the image's clamped into ``ratio``."""
    y0, x0, h, w = box
    aspect = min(max(width / height, ratio[0]), ratio[1])
    largest = (w == width and h <= height) or (h == height and w <= width)
    centred = (y0, x0) == ((height - h) // 2, (width - w) // 2)
    return largest and centred and (abs(w - h * aspect) <= 0.5 or abs(h - w / aspect) <= 0.5)


@pytest.mark.parametrize("make_rng", [random.Random, np.random.default_rng])
def test_random_resized_crop_box_bounds(make_rng):
    rng = make_rng(0)
    sizes = [(375, 500), (500, 375), (224, 224), (10, 1000), (1000, 10), (1, 1), (3, 7)]
    for scale, ratio in [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 1.0), (0.5, 2.0)), ((1.0, 1.0), (1.0, 1.0))]:
        for height, width in sizes:
            for _ in range(200):
                box = random_resized_crop_box(height, width, rng, scale, ratio)
                y0, x0, h, w = box
                assert all(isinstance(v, int) for v in box)
                assert 0 <= y0 and 0 <= x0 and 0 < h and 0 < w and y0 + h <= height and x0 + w <= width
                assert fits_the_draw(box, height, width, scale, ratio) or is_the_fallback(box, height, width, ratio)


def test_random_resized_crop_box_spread():
    """Area fractions cover the scale range; the fallback serves images no try fits."""
    rng = random.Random(1)
    fractions = [h * w / 250000 for _, _, h, w in (random_resized_crop_box(500, 500, rng) for _ in range(2000))]
    assert min(fractions) < 0.1 and max(fractions) > 0.95
    assert 0.45 < np.mean(fractions) < 0.62  # E = 0.54 (uniform in [0.08, 1])
    assert random_resized_crop_box(10, 1000, rng, scale=(0.9, 1.0)) == (0, 493, 10, 13)
    assert random_resized_crop_box(1000, 10, rng, scale=(0.9, 1.0)) == (493, 0, 13, 10)


def test_random_resized_crop_box_is_deterministic():
    first, second = random.Random(3), random.Random(3)
    assert [random_resized_crop_box(375, 500, first) for _ in range(50)] == [
        random_resized_crop_box(375, 500, second) for _ in range(50)]


@pytest.mark.parametrize("kw, match", [
    ({"scale": (0.5, 0.1)}, "scale"),
    ({"scale": (0, 1)}, "scale"),
    ({"ratio": (2, 1)}, "ratio"),
    ({"ratio": (-1, 1)}, "ratio"),
])
def test_random_resized_crop_box_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        random_resized_crop_box(100, 100, random.Random(0), **kw)
    with pytest.raises(ValueError, match="empty"):
        random_resized_crop_box(0, 100, random.Random(0))


def test_center_crop_box_convention():
    # 500x375 (w x h): Resize(256) gives 341x256, CenterCrop(224) starts at (16, round(58.5) = 58).
    assert center_crop_box(375, 500, 224) == (16 * 375 / 256, 58 * 500 / 341, 224 * 375 / 256, 224 * 500 / 341)
    assert center_crop_box(500, 375, 224) == (58 * 500 / 341, 16 * 375 / 256, 224 * 500 / 341, 224 * 375 / 256)
    y0, x0, h, w = center_crop_box(256, 256, 224)
    assert (y0, x0, h, w) == (16, 16, 224, 224)
    y0, x0, h, w = center_crop_box(100, 80, (32, 64), resize_ratio=1.0)  # rectangles: short side to 64
    assert y0 + h <= 100 and x0 + w <= 80 and abs(w / h - 2) < 1e-9
    with pytest.raises(ValueError, match="resize_ratio"):
        center_crop_box(100, 100, 224, resize_ratio=0)
    with pytest.raises(ValueError, match="crop size"):
        center_crop_box(100, 100, 0)


def test_center_crop_box_stays_inside():
    for height in range(1, 400, 7):
        for width in range(1, 400, 11):
            y0, x0, h, w = center_crop_box(height, width, 224)
            assert 0 <= y0 and 0 <= x0 and y0 + h <= height and x0 + w <= width


# Eval pixels against Pillow.


@pytest.mark.parametrize("height, width", [(375, 500), (500, 375), (180, 200)])
def test_eval_matches_torchvision_on_pillow(impl, region, height, width):
    data = jpeg(height, width)
    out, info = decode(data, dct_scaling=False, region=region)
    assert info.kind == "jpeg" and not info.flipped
    check_decoded(info, (height, width), region)
    ref = pil_eval_reference(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    mean, worst = diff(out, ref)
    assert mean < 0.3 and worst <= 1  # measured: mean 0.17, max 1


def test_eval_dct_scaled_against_pillow(impl, region):
    """A large JPEG decoded at 1/4 scale: close to Pillow's full-size reference, not equal."""
    data = jpeg(1300, 1100)
    out, info = decode(data, region=region)
    check_decoded(info, (325, 275), region)  # the box is 962 pixels wide: 1/4 leaves 240 >= 224
    mean, worst = diff(out, pil_eval_reference(PIL.Image.open(io.BytesIO(data)).convert("RGB")))
    assert mean < 1.0 and worst <= 24  # measured: mean 0.50, max 11 (at hard edges)


def test_dct_scaled_close_to_full_decode(impl):
    data = jpeg(1000, 1200, seed=4)
    scaled_decodes = 0
    for seed in range(5):
        full, a = decode(data, train=True, rng=random.Random(seed), dct_scaling=False, region=False)
        scaled, b = decode(data, train=True, rng=random.Random(seed), region=False)
        assert a.box == b.box and a.flipped == b.flipped
        assert b.decoded == tuple(-(-s * dct_scale(1000, 1200, *b.box[2:], 224, 224) // 8) for s in (1000, 1200))
        scaled_decodes += b.decoded != (1000, 1200)
        mean, worst = diff(full, scaled)
        assert mean < 1.0 and worst <= 32  # measured: mean 0.40 to 0.46, max 16
    assert scaled_decodes == 3


def test_dct_scale_choice():
    assert dct_scale(1000, 1000, 900, 900, 224, 224) == 2  # 900/4 = 225 >= 224
    assert dct_scale(1000, 1000, 895, 900, 224, 224) == 4
    assert dct_scale(1000, 1000, 448, 448, 224, 224) == 4
    assert dct_scale(1000, 1000, 447, 448, 224, 224) == 8  # 3/8 and 5/8 to 7/8 are never used
    assert dct_scale(4000, 3000, 3000, 2000, 224, 224) == 1
    assert dct_scale(7, 7, 7, 7, 1, 1) == 8  # tiny: no scale is exact


@pytest.mark.parametrize("height, width", [(375, 500), (333, 500), (17, 3), (3, 17), (9, 9), (8, 1), (1000, 1)])
def test_dct_scale_is_what_libjpeg_picks(height, width):
    data = encode(np.full((height, width, 3), 128, np.uint8))
    for n in (1, 2, 4):
        want = (-(-height * n // 8), -(-width * n // 8))
        got = simplejpeg.decode_jpeg_header(data, min_height=want[0], min_width=want[1])[:2]
        assert got == want  # sides >= 8 make n the only choice (see dct_scale)


# Train mode.


def test_train_is_the_kernel_on_the_box(impl):
    data = jpeg(300, 400)
    pixels = simplejpeg.decode_jpeg(data)
    for seed in range(6):
        out, info = decode(data, (96, 128), train=True, rng=np.random.default_rng(seed), dct_scaling=False)
        assert fits_the_draw(info.box, 300, 400, (0.08, 1.0), (3 / 4, 4 / 3))
        want = np.zeros_like(out)
        kernel()(pixels, *info.box, want, info.flipped)
        np.testing.assert_array_equal(out, want)


def test_train_flip_probability(impl):
    data = jpeg(120, 160)
    a, ia = decode(data, (32, 32), train=True, rng=random.Random(5), flip=1.0)
    b, ib = decode(data, (32, 32), train=True, rng=random.Random(5), flip=0.0)
    assert ia.flipped and not ib.flipped and ia.box == ib.box
    np.testing.assert_array_equal(a, b[:, ::-1])
    rng = random.Random(0)
    flips = sum(decode(data, (8, 8), train=True, rng=rng)[1].flipped for _ in range(300))
    assert 110 < flips < 190


# Other inputs.


def test_gray_jpeg(impl):
    data = jpeg(200, 240, mode="L")
    out, info = decode(data)
    assert info.kind == "jpeg"
    assert (out[:, :, 0] == out[:, :, 1]).all() and (out[:, :, 0] == out[:, :, 2]).all()
    ref = pil_eval_reference(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    assert diff(out, ref)[1] <= 1


def test_cmyk_jpeg_goes_through_pillow(impl):
    data = jpeg(150, 120, mode="CMYK")
    assert simplejpeg.decode_jpeg_header(data)[2] == "CMYK"
    out, info = decode(data, (64, 64))
    assert info.kind == "pil"
    pixels = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    want = np.zeros_like(out)
    kernel()(pixels, *center_crop_box(150, 120, (64, 64)), want, False)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L"])
def test_png(impl, mode):
    data = encode(photo(90, 110), "PNG", mode=mode)
    out, info = decode(data, (48, 48))
    assert info.kind == "pil" and (info.height, info.width) == (90, 110)
    pixels = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    want = np.zeros_like(out)
    kernel()(pixels, *center_crop_box(90, 110, (48, 48)), want, False)
    np.testing.assert_array_equal(out, want)


def test_a_16_bit_grey_png_is_scaled_to_8_bits_not_clipped(impl):
    """Pillow's convert("RGB") of an I;16 image makes every value above 255 into 255 (a photo all
    white); the loader keeps the top 8 bits of each value."""
    grey = (photo(90, 110)[:, :, 0].astype(np.uint16) * 257)  # 0..65535, the 8-bit photo's values x 257
    stream = io.BytesIO()
    PIL.Image.fromarray(grey).save(stream, "PNG")
    assert PIL.Image.open(io.BytesIO(stream.getvalue())).mode == "I;16"
    out, info = decode(stream.getvalue(), (48, 48))
    assert info.kind == "pil"
    np.testing.assert_array_equal(out, raw_reference(np.ascontiguousarray(photo(90, 110)[:, :, :1]), (48, 48)))
    assert out.max() - out.min() > 100  # not a flat 255


def raw_reference(pixels, size):
    want = np.zeros(size + (pixels.shape[2],), np.uint8)
    kernel()(pixels, *center_crop_box(*pixels.shape[:2], size), want, False)
    return np.broadcast_to(want, size + (3,))


def test_ppm(impl):
    pixels = photo(70, 50)
    out, info = decode(encode(pixels, "PPM"), (32, 32))
    assert info.kind == "ppm" and info.decoded == (70, 50)
    np.testing.assert_array_equal(out, raw_reference(pixels, (32, 32)))


def test_decoded_arrays_and_pil_images_are_only_resized(impl):
    pixels = photo(70, 50)
    reference = raw_reference(pixels, (32, 32))
    for value in (pixels, PIL.Image.fromarray(pixels)):
        out, info = decode(value, (32, 32))
        assert info.kind == "array" and info.decoded == (70, 50)
        np.testing.assert_array_equal(out, reference)
    out, info = decode(pixels[:, :, 0], (32, 32))
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])
    with pytest.raises(DecodeError, match="must be a uint8 HxWx3, HxWx1 or HxW array, not ndarray float32"):
        decode(pixels.astype(np.float32), (32, 32))


def test_ppm_with_comments_and_pgm(impl):
    pixels = photo(20, 30)
    data = b"P6 # a comment\n# another\n30\t20\n255\n" + pixels.tobytes()
    out, info = decode(data, (16, 16))
    assert info.kind == "ppm"
    np.testing.assert_array_equal(out, raw_reference(pixels, (16, 16)))
    gray = pixels[:, :, :1].copy()
    out, info = decode(encode(gray[:, :, 0], "PPM"), (16, 16))  # Pillow writes L as P5
    assert info.kind == "ppm"
    np.testing.assert_array_equal(out, raw_reference(gray, (16, 16)))


def test_16_bit_pgm_goes_through_pillow(impl):
    data = b"P5\n4 3\n65535\n" + np.arange(12, dtype=">u2").tobytes()
    assert decode(data, (2, 2))[1].kind == "pil"


@pytest.mark.parametrize("shape, order", [((60, 40, 3), "C"), ((60, 40, 3), "F"), ((60, 40), "C"), ((60, 40, 1), "C")])
def test_npy(impl, shape, order):
    pixels = photo(60, 40)[:, :, : (shape[2] if len(shape) == 3 else 1)].reshape(shape)
    buf = io.BytesIO()
    np.save(buf, np.asarray(pixels, order=order))
    out, info = decode(memoryview(buf.getvalue()), (24, 24))  # memoryviews are fine too
    assert info.kind == "npy" and info.decoded == (60, 40)
    np.testing.assert_array_equal(out, raw_reference(pixels.reshape(60, 40, -1).copy(), (24, 24)))


@pytest.mark.parametrize("array, match", [
    (np.zeros((8, 8, 3), np.float32), "must be a uint8"),
    (np.zeros((8, 8, 4), np.uint8), "must be a uint8 HxWx3"),
    (np.zeros(8, np.uint8), "must be a uint8"),
])
def test_npy_refused(array, match):
    buf = io.BytesIO()
    np.save(buf, array)
    with pytest.raises(DecodeError, match=match):
        decode(buf.getvalue())


def test_cut_short_inputs():
    buf = io.BytesIO()
    np.save(buf, np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(DecodeError, match="cut short"):
        decode(buf.getvalue()[:-5])
    with pytest.raises(DecodeError, match="cut short"):
        decode(b"P6\n8 8\n255\n" + bytes(100))
    with pytest.raises(DecodeError, match="cannot decode"):
        decode(jpeg(64, 64)[:-300])


# Refusals and errors.


def patched_sof(data, height, width):
    """A JPEG whose baseline frame header (SOF0) claims another size."""
    at = data.index(b"\xff\xc0")
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


def png_header(width, height):
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk
            + struct.pack(">I", zlib.crc32(chunk)) + b"\0\0\0\0IEND\xaeB`\x82")


@pytest.mark.parametrize("data, match", [
    (patched_sof(jpeg(16, 16), 60000, 60000), "JPEG image is 60000x60000 pixels, outside the limits"),
    (patched_sof(jpeg(16, 16), 8, 65535), "65535x8"),  # a side longer than libjpeg-turbo's 65,500
    (patched_sof(jpeg(16, 16), 20000, 20000), "20000x20000"),  # 4e8 pixels > 2**28
    (png_header(70000, 10), "PNG image is 70000x10 pixels, outside the limits"),
    (png_header(60000, 60000), "decompression bomb"),  # Pillow's own check comes first
    (b"P6\n60000 60000\n255\n" + bytes(64), "PNM image is 60000x60000"),
], ids=["jpeg-60000x60000", "jpeg-side", "jpeg-pixels", "png-side", "png-bomb", "ppm"])
def test_oversized_headers_are_refused_before_decoding(data, match):
    start = time.perf_counter()
    with pytest.raises(DecodeError, match=match):
        decode(data)
    assert time.perf_counter() - start < 1.0


def test_errors_name_the_shard_and_member():
    out = np.zeros((8, 8, 3), np.uint8)
    where = "shard 'a.tar', member 'k.jpg'"
    with pytest.raises(DecodeError, match=f"not an image format Pillow knows .it starts b'not an i'.*{where}") as info:
        decode_into(b"not an image", out, False, None, url="a.tar", member="k.jpg")
    assert isinstance(info.value, ValueError) and info.value.__cause__ is not None
    with pytest.raises(DecodeError, match="outside the limits.*member 'k.jpg'"):
        decode_into(patched_sof(jpeg(16, 16), 60000, 60000), out, False, None, member="k.jpg")


@pytest.mark.parametrize("data", [bytes(1000), b"\xff\xd8\xff" + bytes(997)], ids=["zeros", "jpeg-magic-then-zeros"])
def test_a_zeroed_jpeg_names_the_shard_and_member(impl, region, data):
    out = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(DecodeError, match=r"not an image format Pillow knows \(it starts b'(\\xff\\xd8\\xff)?\\x00"
                                          r".*\(shard 'a.tar', member 'k.jpg'\)$") as info:
        decode_into(data, out, False, None, url="a.tar", member="k.jpg", region=region)
    assert (info.value.url, info.value.member) == ("a.tar", "k.jpg")
    assert isinstance(info.value.__cause__, PIL.UnidentifiedImageError)
    assert not out.any()  # nothing half-decoded was written into the slot


@pytest.mark.parametrize("out, kw, match", [
    (np.zeros((8, 8, 1), np.uint8), {}, "HxWx3 uint8"),
    (np.zeros((8, 8, 3), np.float32), {}, "HxWx3 uint8"),
    (np.zeros((8, 16, 3), np.uint8)[:, ::2], {}, "C-contiguous"),
    (np.zeros((8, 8, 3), np.uint8), {"train": True}, "needs an rng"),
    (np.zeros((8, 8, 3), np.uint8), {"flip": 1.5}, "flip probability"),
    (np.zeros((8, 8, 3), np.uint8), {"scale": (1, 0.5)}, "scale"),
    (np.zeros((8, 8, 3), np.uint8), {"ratio": (0, 1)}, "ratio"),
    (np.zeros((8, 8, 3), np.uint8), {"resize_ratio": 1.5}, "resize_ratio"),
])
def test_bad_arguments(out, kw, match):
    train = kw.pop("train", False)
    with pytest.raises(ValueError, match=match) as info:
        decode_into(jpeg(16, 16), out, train, None, **kw)
    assert not isinstance(info.value, DecodeError)


def test_image_info():
    out, info = decode(jpeg(40, 50), (16, 16), region=False)
    assert isinstance(info, ImageInfo)
    assert info._replace(box=None) == ImageInfo(40, 50, None, False, (20, 25), "jpeg", 4, False)  # at 1/2 scale


class Clock:
    decode_ns = resize_ns = 0


def test_image_info_says_how_a_jpeg_was_decoded_and_the_clock_gets_the_time(region):
    clock = Clock()
    out = np.zeros((32, 32, 3), np.uint8)
    info = decode_with_options(jpeg(300, 200), out, DecodeOptions(train=False, region=region), None, clock=clock)
    assert (info.kind, info.scale, info.region) == ("jpeg", dct_scale(300, 200, *info.box[2:], 32, 32), region)
    assert info.scale == 2  # 1/4 still covers 32 x 32
    full = decode_with_options(jpeg(300, 200), out, DecodeOptions(train=False, dct_scaling=False, region=False), None)
    assert (full.scale, full.region) == (8, False)
    assert clock.decode_ns > 0 and clock.resize_ns > 0
    png = decode_with_options(encode(photo(30, 20, 0), "PNG"), out, DecodeOptions(train=False), None, clock=clock)
    assert (png.kind, png.scale, png.region) == ("pil", 8, False)


# The JPEG region decoder (NOTE [jpeg regions]).


LIMITS = {"max_side": MAX_SIDE, "max_pixels": MAX_PIXELS}


@pytest.fixture
def jpegregion():
    """The region decoder module; the test is skipped where it is not in use."""
    module = jpeg_region_module()
    if module is None:
        pytest.skip(region_decoder_missing())
    return module


class Scripted:
    """An rng whose ``random()`` returns the given values in turn: the box draw is
    (area fraction, log aspect, y0, x0), then the flip."""

    def __init__(self, *values):
        self.values = iter(values)

    def random(self):
        return next(self.values)


def whole_scaled(data, n):
    """simplejpeg's decode at scale n/8: the pixels the region decoder must agree with."""
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    scaled = {} if n == 8 else {"min_height": -(-height * n // 8), "min_width": -(-width * n // 8)}
    return simplejpeg.decode_jpeg(data, "RGB", **scaled)


def assert_region_matches(data, n, top, left, height, width, module):
    """decode_region's array is where it says it is in the scaled image, covers the request, and
    equals a whole decode, but for the first and last column of a cropped row (fancy upsampling
    of 4:2:x chroma; libjpeg-turbo drops it altogether for rows cropped to one or two columns,
    which decode_into never asks for)."""
    whole = whole_scaled(data, n)
    pixels, top2, left2 = module.decode_region(data, n, top, left, height, width, **LIMITS)
    assert pixels.dtype == np.uint8 and pixels.shape[2] == 3 and pixels.flags.c_contiguous
    assert top2 == top and pixels.shape[0] == height
    assert left2 <= left and left2 + pixels.shape[1] >= left + width and left2 + pixels.shape[1] <= whole.shape[1]
    assert left2 % n == 0  # an iMCU boundary: n or 2n pixels at scale n/8
    want = whole[top:top + height, left2:left2 + pixels.shape[1]]
    cropped_right = left2 + pixels.shape[1] < whole.shape[1]
    if pixels.shape[1] > 2 or not (left2 > 0 or cropped_right):
        inner = slice(1 if left2 > 0 else 0, -1 if cropped_right else None)
        np.testing.assert_array_equal(pixels[:, inner], want[:, inner])
    assert diff(pixels, want)[1] <= 40  # the edge columns: chroma averaged differently, not garbage
    return pixels, top2, left2


ENCODINGS = {"444": {"subsampling": 0}, "422": {"subsampling": 1}, "420": {"subsampling": 2},
             "gray": {"mode": "L"}, "progressive": {"progressive": True}}


@pytest.mark.parametrize("kind", list(ENCODINGS))
@pytest.mark.parametrize("height, width", [(120, 161), (97, 33), (16, 16), (1, 75), (75, 1), (9, 17)])
def test_region_decoder_against_whole_decode(jpegregion, kind, height, width):
    data = jpeg(height, width, quality=90, seed=height, **ENCODINGS[kind])
    rng = random.Random(height * width)
    for n in (1, 2, 4, 8):
        sh, sw = -(-height * n // 8), -(-width * n // 8)
        regions = [(0, 0, sh, sw), (0, 0, 1, 1), (sh - 1, sw - 1, 1, 1), (0, sw - 1, sh, 1), (sh - 1, 0, 1, sw)]
        for _ in range(8):
            top, left = rng.randrange(sh), rng.randrange(sw)
            regions.append((top, left, rng.randint(1, sh - top), rng.randint(1, sw - left)))
        for where in regions:
            assert_region_matches(data, n, *where, jpegregion)


def test_region_decoder_on_photograph_like_images(jpegregion):
    """Photograph-like images of odd widths, 4:4:4 and 4:2:0, q90 and q95, grayscale too."""
    rng = random.Random(7)
    for seed, (height, width) in enumerate([(300, 451), (400, 599)]):
        pixels = photo(height, width, seed)
        for colorspace, sub, source in [("RGB", "444", pixels), ("RGB", "420", pixels),
                                        ("GRAY", "Gray", pixels[:, :, 1:2].copy())]:
            for quality in (90, 95):
                data = simplejpeg.encode_jpeg(source, quality, colorspace, sub)
                for n in (2, 8):
                    sh, sw = -(-source.shape[0] * n // 8), -(-source.shape[1] * n // 8)
                    top, left = rng.randrange(sh // 2), rng.randrange(sw // 2)
                    assert_region_matches(data, n, top, left, sh // 2, sw // 2, jpegregion)


def decode_both(data, size, train, seed, **kw):
    a, ia = decode(data, size, train=train, rng=random.Random(seed), region=True, **kw)
    b, ib = decode(data, size, train=train, rng=random.Random(seed), region=False, **kw)
    assert (ia.height, ia.width, ia.box, ia.flipped, ia.kind) == (ib.height, ib.width, ib.box, ib.flipped, ib.kind)
    return a, ia, b, ib


@pytest.mark.parametrize("kind", list(ENCODINGS))
@pytest.mark.parametrize("height, width", [(375, 500), (333, 501), (1001, 777), (40, 50), (230, 9)])
def test_decode_into_region_matches_whole(jpegregion, kind, height, width):
    """decode_into with and without the region decoder, train and eval, DCT-scaled or not."""
    data = jpeg(height, width, seed=width, **ENCODINGS[kind])
    worst_mean = worst = 0
    for dct_scaling in (True, False):
        for seed in range(6):
            a, ia, b, ib = decode_both(data, (224, 224), seed > 0, seed, dct_scaling=dct_scaling)
            assert ia.kind == "jpeg"
            assert ia.decoded[0] <= ib.decoded[0] and ia.decoded[1] <= ib.decoded[1]
            mean, most = diff(a, b)
            worst_mean, worst = max(worst_mean, mean), max(worst, most)
    assert worst_mean < 0.01 and worst <= 2  # measured: identical


@pytest.mark.parametrize("draws", [
    (0.95, 0.99999, 0.0, 0.0),  # 294x392 box at the top left
    (0.1, 0.5, 0.0, 0.0),  # small square box in the top-left corner
    (0.1, 0.5, 0.99999, 0.99999),  # the same in the bottom-right corner
    (0.1, 0.0, 0.99999, 0.0),  # tall box on the left edge, at the bottom
    (0.1, 0.99999, 0.0, 0.99999),  # wide box on the right edge, at the top
    (0.99999, 0.5) * 10,  # no try fits: the fallback, 301x401, top to bottom
], ids=["top-left-large", "top-left", "bottom-right", "left", "right", "fallback"])
@pytest.mark.parametrize("kind", ["444", "420", "gray"])
def test_region_boxes_touching_the_edges(jpegregion, draws, kind):
    data = jpeg(301, 403, seed=3, **ENCODINGS[kind])
    for size in ((224, 224), (32, 48)):
        a, ia = decode(data, size, train=True, rng=Scripted(*draws, 0.9), region=True)
        b, ib = decode(data, size, train=True, rng=Scripted(*draws, 0.9), region=False)
        assert ia.box == ib.box and ia.decoded[0] <= ib.decoded[0] and ia.decoded[1] <= ib.decoded[1]
        y0, x0, h, w = ia.box
        assert y0 == 0 or x0 == 0 or y0 + h == 301 or x0 + w == 403
        mean, worst = diff(a, b)
        assert mean < 0.01 and worst <= 2  # measured: identical


def test_region_decoded_size(jpegregion):
    """``decoded`` is the region: the box at the DCT scale, widened by the filter's support and
    a pixel on each side, and on the left to an iMCU boundary (2n pixels for 4:2:0 at n/8)."""
    data = jpeg(600, 800)
    for draws, n in [((0.2, 0.5, 0.5, 0.5), 4), ((0.8, 0.99999, 0.1, 0.9), 2), ((0.0, 0.5, 0.3, 0.2), 8)]:
        out, info = decode(data, (100, 100), train=True, rng=Scripted(*draws, 0.9))
        y0, x0, h, w = info.box
        assert dct_scale(600, 800, h, w, 100, 100) == n
        h, w = h * n / 8, w * n / 8
        assert h + 2 < info.decoded[0] <= h + 2 * (max(h / 100, 1) + 2) + 1
        assert w + 2 < info.decoded[1] <= w + 2 * (max(w / 100, 1) + 2) + 1 + 2 * n


def test_region_progressive_and_gray_photos(jpegregion):
    """Progressive JPEGs (the whole scan is entropy-decoded first) and grayscale ones come out
    of the region decoder as RGB, equal to the whole decode."""
    for kw in ({"progressive": True}, {"progressive": True, "mode": "L"}, {"mode": "L"}):
        data = jpeg(257, 311, **kw)
        a, ia, b, ib = decode_both(data, (64, 64), True, 1)
        np.testing.assert_array_equal(a, b)
        if "mode" in kw:
            assert (a[:, :, 0] == a[:, :, 1]).all() and (a[:, :, 0] == a[:, :, 2]).all()


def test_region_decoder_damaged_data(jpegregion):
    data = jpeg(200, 160)
    with pytest.raises(ValueError, match="Premature end of JPEG file|Corrupt JPEG data"):
        jpegregion.decode_region(data[:len(data) // 2], 8, 150, 0, 50, 160, **LIMITS)
    with pytest.raises(ValueError, match="Not a JPEG file|JPEG"):
        jpegregion.decode_region(b"\xff\xd8\xff" + bytes(100), 8, 0, 0, 1, 1, **LIMITS)
    with pytest.raises(ValueError, match="empty"):
        jpegregion.decode_region(b"", 8, 0, 0, 1, 1, **LIMITS)
    # The rows below the region are never read: a file cut short there still decodes them.
    pixels, _, _ = jpegregion.decode_region(data[:len(data) // 2], 8, 0, 0, 20, 160, **LIMITS)
    np.testing.assert_array_equal(pixels, simplejpeg.decode_jpeg(data)[:20])


@pytest.mark.parametrize("cut", [10, 400, 3000])
def test_cut_short_jpeg_is_a_decode_error(impl, region, cut):
    """Wherever a JPEG is cut, and whatever the crop: a file without its end-of-image marker
    takes the whole-image path (NOTE [jpeg regions]), which refuses it, as Pillow does."""
    data = jpeg(120, 100)
    for seed in range(3):
        with pytest.raises(DecodeError, match="cannot decode.*member 'k.jpg'"):
            decode_into(data[:-cut], np.zeros((32, 32, 3), np.uint8), seed > 0, random.Random(seed),
                        region=region, member="k.jpg")


def test_data_after_the_end_marker(impl, region):
    """Bytes after the end-of-image marker (some cameras append data): decoded whole, as before."""
    data = jpeg(120, 100)
    out, info = decode(data + b"\0" * 10 + b"trailer", (32, 32), region=region)
    assert info.kind == "jpeg" and info.decoded == (60, 50)
    np.testing.assert_array_equal(out, decode(data, (32, 32), region=False)[0])


def test_region_decoder_refusals(jpegregion):
    data = jpeg(40, 30)
    for n, top, left, height, width, match in [
        (8, 0, 0, 41, 30, "not inside the 40x30 image decoded at 8/8"),
        (4, 0, 0, 20, 16, "not inside the 20x15 image decoded at 4/8"),
        (8, 39, 29, 1, 2, "not inside"),
        (8, -1, 0, 1, 1, "empty or negative"),
        (8, 0, 0, 0, 1, "empty or negative"),
        (0, 0, 0, 1, 1, "scale_num 0"),
        (9, 0, 0, 1, 1, "scale_num 9"),
    ]:
        with pytest.raises(ValueError, match=match):
            jpegregion.decode_region(data, n, top, left, height, width, **LIMITS)
    with pytest.raises(ValueError, match="CMYK or YCCK"):
        jpegregion.decode_region(jpeg(40, 30, mode="CMYK"), 8, 0, 0, 1, 1, **LIMITS)


@pytest.mark.parametrize("height, width, limits, match", [
    (60000, 60000, LIMITS, "60000x60000 pixels, outside the limits"),
    (20000, 20000, LIMITS, "20000x20000 pixels, outside the limits"),  # 4e8 pixels > 2**28
    (16, 40, {"max_side": 32, "max_pixels": 10 ** 6}, "40x16 pixels, outside the limits .sides 1 to 32"),
    (16, 16, {"max_side": 32, "max_pixels": 255}, "at most 255 pixels"),
])
def test_region_decoder_refuses_large_headers(jpegregion, height, width, limits, match):
    data = patched_sof(jpeg(16, 16), height, width)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        jpegregion.decode_region(data, 8, 0, 0, 1, 1, **limits)
    assert time.perf_counter() - start < 1.0


def test_region_refusal_falls_back_to_whole_decode(jpegregion, monkeypatch):
    """Whatever the region decoder refuses goes the whole-image way, never wrong or lost."""
    data = jpeg(150, 130)
    want, _ = decode(data, (64, 64), region=False)

    class Refusing:
        @staticmethod
        def decode_region(*args, **kw):
            raise ValueError("refused")

    monkeypatch.setattr(wdsmp.native.core, "jpeg_region_module", lambda: Refusing)
    out, info = decode(data, (64, 64))
    assert info.kind == "jpeg" and info.decoded == (150, 130)
    np.testing.assert_array_equal(out, want)


def test_region_decoder_selection(monkeypatch):
    monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    assert jpeg_region_module() is None and not jpeg_region_available()
    monkeypatch.delenv("WDSMP_PUREPYTHON")
    monkeypatch.setitem(sys.modules, "wdsmp.native._jpegregion", None)  # import fails as if never built
    monkeypatch.setattr(wdsmp.native.core, "_loaded", {})
    with pytest.warns(RuntimeWarning, match="JPEG region decoder is not built.*decodes whole JPEGs"):
        assert jpeg_region_module() is None
    assert not jpeg_region_available()
    out, info = decode(jpeg(40, 50), (16, 16))  # whole images, as before
    assert info.decoded == (20, 25)


# Found by tests/fuzz/fuzz_jpegregion.py (tests/fuzz/crashes/jpegregion-progressive-missing-scans
# and jpegregion-progressive-missing-scans-cropped): a progressive JPEG that ends, with its
# end-of-image marker, before its refinement scans is valid, and libjpeg-turbo smooths the
# blocks whose coefficients it has not received. It smooths the blocks of a cropped row unlike
# a whole decode's (they read their neighbours), and the system's release that decode_region
# links smooths unlike the one simplejpeg bundles for the whole-image path: the region decoder
# refuses such a file, and the whole-image path decodes it.


def progressive_missing_scans(scans):
    """A progressive 4:2:0 JPEG cut after its first ``scans`` scans, then its end-of-image marker."""
    data = jpeg(48, 40, progressive=True)
    starts = [i for i in range(len(data) - 1) if data[i:i + 2] == b"\xff\xda"]
    return data[:starts[scans]] + b"\xff\xd9"


@pytest.mark.parametrize("scans", [1, 2, 6, 9])
def test_region_decoder_refuses_progressive_jpegs_missing_scans(jpegregion, scans):
    cut = progressive_missing_scans(scans)
    whole_scaled(cut, 8)  # valid: simplejpeg decodes it without a warning
    with pytest.raises(ValueError, match="progressive JPEG lacks some of its scans"):
        jpegregion.decode_region(cut, 8, 8, 8, 24, 24, **LIMITS)
    assert_region_matches(jpeg(48, 40, progressive=True), 8, 8, 8, 24, 24, jpegregion)  # all its scans


@pytest.mark.parametrize("scans", [1, 6])
def test_progressive_jpegs_missing_scans_decode_as_without_the_region_decoder(impl, region, scans):
    cut = progressive_missing_scans(scans)
    for seed in range(4):
        a, ia = decode(cut, (24, 24), train=seed > 0, rng=random.Random(seed), region=region)
        b, ib = decode(cut, (24, 24), train=seed > 0, rng=random.Random(seed), region=False)
        assert ia == ib  # the whole image decoded: the region decoder refused it
        np.testing.assert_array_equal(a, b)


# Found by tests/fuzz/fuzz_jpegregion.py (tests/fuzz/crashes/jpegregion-441-subsampling): for a
# JPEG whose luma is sampled 1x4 and chroma 1x1 (TurboJPEG's 4:4:1), simplejpeg.decode_jpeg_header
# raises KeyError (its subsampling table lacks the code), and decode_into lets it through: neither
# decoded (Pillow, simplejpeg.decode_jpeg and the region decoder all read a valid such file) nor a
# DecodeError naming the shard and member. Such files now go to Pillow, as in autodecode.


def test_a_jpeg_with_4_4_1_subsampling_decodes_or_is_a_decode_error(impl, region):
    data = bytearray(jpeg(32, 32, subsampling=0))
    components = data.index(b"\xff\xc0") + 10  # the frame header's first component: id, sampling, table
    assert data[components:components + 3] == b"\x01\x11\x00"
    data[components + 1] = 0x14  # luma sampled 1x4: the header claims 4:4:1 (the scan data no longer fits)
    try:
        decode_into(bytes(data), np.zeros((16, 16, 3), np.uint8), False, None, url="a.tar", member="k.jpg",
                    region=region)
    except DecodeError as exn:
        assert (exn.url, exn.member) == ("a.tar", "k.jpg")


# Found by tests/fuzz/fuzz_jpegregion.py (tests/fuzz/crashes/jpegregion-odd-sampling-crop): for a
# JPEG sampled luma 2x2, Cb 1x1, Cr 1x4, libjpeg-turbo 2.1.5's jpeg_crop_scanline crops wrongly at
# reduced scales (the file below, which decodes without a warning, came out up to 202 levels from
# the whole decode when cropped at 4/8; skipping rows was exact). simplejpeg cannot name such a
# layout, so decode_into never sent one to the region decoder; decode_region itself now refuses
# every layout but those TurboJPEG names.


def test_region_decoder_refuses_unusual_sampling_layouts(jpegregion):
    data = bytearray(jpeg(48, 40, subsampling=2))  # 4:2:0: luma 2x2, chroma 1x1
    components = data.index(b"\xff\xc0") + 10  # the frame header's components: id, sampling, table
    assert data[components:components + 9] == b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    data[components + 7] = 0x14  # Cr sampled 1x4, more than the luma vertically
    for n in (2, 4, 8):
        with pytest.raises(ValueError, match=r"sampling factors \(2x2, 1x1, 1x4\) are not a layout"):
            jpegregion.decode_region(bytes(data), n, 0, 0, 4, 4, **LIMITS)


# Decompression bombs under the size limits: the per-image budget.


def test_image_bombs_are_refused_by_the_budget_under_a_memory_limit(tmp_path):
    """A 28-byte WebP and a 168 kB PNG claiming 13000 x 13000: under the size limits, but 2-3
    GiB to decode whole; FastLoader's decoder refuses them (a 224 x 224 output's budget is
    64 Mi pixels), in a process that could not hold them."""
    from tests.bombs import png_of_zeros, run_limited, webp_of_zeros

    (tmp_path / "bomb.png").write_bytes(png_of_zeros(13000, 13000))
    (tmp_path / "bomb.webp").write_bytes(webp_of_zeros(13000, 13000))
    status, out = run_limited(f"""
        import numpy as np
        from wdsmp.fast.imagedecode import decode_into
        out = np.zeros((224, 224, 3), np.uint8)
        for ext in ["png", "webp"]:
            try:
                decode_into(open(f"{tmp_path}/bomb.{{ext}}", "rb").read(), out, False, None, url="s.tar",
                            member=f"k.{{ext}}")
            except Exception as exn:
                print(type(exn).__name__, exn)
        """)
    assert status == 0, out
    for fmt, ext in (("PNG", "png"), ("WEBP", "webp")):
        assert re.search(rf"DecodeError the {fmt} image decodes to 13000x13000 = 169000000 pixels, more than the "
                         rf"budget of 67108864 pixels per image.*shard 's.tar', member 'k.{ext}'", out), out


def test_the_budget_follows_the_output_size_and_can_be_set(monkeypatch):
    from tests.bombs import png_of_zeros
    from wdsmp.fast.options import DecodeOptions
    from wdsmp.fast.imagedecode import decode_with_options

    png = png_of_zeros(9000, 8000)  # 72 Mi pixels: past the default, within a 1024 x 1024 output's budget
    with pytest.raises(DecodeError, match="budget of 67108864"):
        decode_into(png, np.zeros((224, 224, 3), np.uint8), False, None)
    assert decode_into(png, np.zeros((1024, 1024, 3), np.uint8), False, None).kind == "pil"
    with pytest.raises(DecodeError, match="budget of 1000 pixels"):
        decode_with_options(png, np.zeros((8, 8, 3), np.uint8), DecodeOptions(False, max_pixels=1000), None)
    monkeypatch.setenv("WDSMP_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(DecodeError, match="budget of 1000 pixels"):
        decode_into(png, np.zeros((1024, 1024, 3), np.uint8), False, None)
    with pytest.raises(ValueError, match="max_image_pixels must be a positive"):
        DecodeOptions.of(max_pixels=0)


def test_a_large_jpeg_is_decoded_at_reduced_size_within_the_budget(monkeypatch):
    """JPEGs are decoded at a DCT scale first (also those Pillow decodes: CMYK), so a large one
    meets the budget only at full size."""
    big = PIL.Image.new("CMYK", (4000, 3000), (0, 0, 0, 0))
    stream = io.BytesIO()
    big.save(stream, "JPEG")
    cmyk = stream.getvalue()
    monkeypatch.setenv("WDSMP_MAX_IMAGE_PIXELS", str(1 << 20))  # 12 Mi pixels whole, 0.2 Mi at 1/8
    info = decode_into(cmyk, np.zeros((64, 64, 3), np.uint8), False, None)
    assert info.kind == "pil" and info.decoded == (375, 500) and info.height == 3000
    with pytest.raises(DecodeError, match="the JPEG image decodes to 4000x3000"):
        decode_into(cmyk, np.zeros((64, 64, 3), np.uint8), False, None, dct_scaling=False)


def test_a_panorama_wider_than_32768_pixels_decodes(impl):
    """40000x600 (24 megapixels, under every budget): Pillow and webdataset decode it, and so do
    the loader and decode("rgb8"), as Pillow does."""
    from wdsmp import autodecode

    row = np.linspace(0, 255, 40000).astype(np.uint8)
    pixels = np.ascontiguousarray(np.broadcast_to(row[None, :, None], (600, 40000, 3)))
    data = simplejpeg.encode_jpeg(pixels, 90)
    out, info = decode(data, (32, 64))
    assert (info.height, info.width) == (600, 40000)
    reference = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    want = np.zeros_like(out)
    kernel()(reference, *center_crop_box(600, 40000, (32, 64)), want, False)
    mean, worst = diff(out, want)
    assert mean < 1.0 and worst <= 4
    decoded = autodecode.imagehandler("rgb8")("jpg", data)
    assert decoded.shape == (600, 40000, 3) and diff(decoded, reference)[1] <= 1


def test_progressive_jpeg_bombs_are_refused_under_a_memory_and_a_time_limit(tmp_path):
    """A progressive JPEG claiming 16000 x 16000 (libjpeg-turbo holds all its coefficients, 1.5
    GB, whatever scale it decodes at), and one whose last scan is repeated 2,000 times (each
    decoded in full: minutes of CPU in a few hundred kilobytes): both refused before decoding,
    by the loader and by decode("rgb8") and decode("pil"), in a child that could not hold the
    first nor wait for the second."""
    from tests.bombs import progressive_jpeg_claiming, progressive_jpeg_with_repeated_scans, run_limited

    (tmp_path / "big.jpg").write_bytes(progressive_jpeg_claiming(16000, 16000))
    (tmp_path / "scans.jpg").write_bytes(progressive_jpeg_with_repeated_scans(2000))
    status, out = run_limited(f"""
        import numpy as np
        from wdsmp import autodecode
        from wdsmp.fast.imagedecode import decode_into
        out = np.zeros((224, 224, 3), np.uint8)
        for name in ["big", "scans"]:
            data = open(f"{tmp_path}/{{name}}.jpg", "rb").read()
            try:
                decode_into(data, out, False, None, url="s.tar", member=f"{{name}}.jpg")
            except Exception as exn:
                print(type(exn).__name__, exn)
            for spec in ["rgb8", "pil"]:
                try:
                    autodecode.imagehandler(spec)("jpg", data)
                except Exception as exn:
                    print(spec, type(exn).__name__, exn)
        """, timeout=60)
    assert status == 0, out
    assert re.search(r"DecodeError the JPEG image is progressive, 16000x16000 pixels of 3 components: "
                     r"libjpeg-turbo holds all its 1,465 MiB of coefficients .*shard 's.tar', member 'big.jpg'",
                     out), out
    assert re.search(r"DecodeError the JPEG image is progressive with 257 scans, more than the 256 .*"
                     r"member 'scans.jpg'", out), out
    assert len(re.findall(r"^(rgb8|pil) ImageTooLarge .*refusing to decode it$", out, re.M)) == 4, out
    assert len(re.findall(r"^(rgb8|pil) .*progressive with 257 scans", out, re.M)) == 2, out


def test_an_ordinary_progressive_jpeg_decodes():
    from tests.bombs import progressive_jpeg_with_repeated_scans

    data = progressive_jpeg_with_repeated_scans(0, 300, 200)
    out, info = decode(data, (64, 64))
    assert (info.height, info.width) == (200, 300)
