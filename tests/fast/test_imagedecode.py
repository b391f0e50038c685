"""decode_into and its boxes: torchvision's geometry, DCT-scaled JPEGs, every input format, refusals."""

import io
import math
import random
import struct
import time
import zlib

import numpy as np
import PIL.Image
import pytest
import simplejpeg

from wdsmp import DecodeError
from wdsmp.fast.imagedecode import (
    ImageInfo,
    center_crop_box,
    dct_scale,
    decode_into,
    random_resized_crop_box,
)

from .test_imgops import kernel, photo


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


# Boxes.


def fits_the_draw(box, height, width, scale, ratio):
    """Whether a box can come from one try: real sides within 0.5 of it with an area
    fraction in ``scale`` and an aspect ratio in ``ratio``."""
    y0, x0, h, w = box
    area = height * width
    return ((w + 0.5) * (h + 0.5) >= scale[0] * area and (w - 0.5) * (h - 0.5) <= scale[1] * area
            and (w + 0.5) / (h - 0.5) >= ratio[0] and (w - 0.5) / (h + 0.5) <= ratio[1])


def fallback_box(height, width, ratio):
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


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
                assert fits_the_draw(box, height, width, scale, ratio) or box == fallback_box(height, width, ratio)


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
def test_eval_matches_torchvision_on_pillow(impl, height, width):
    data = jpeg(height, width)
    out, info = decode(data, dct_scaling=False)
    assert info.kind == "jpeg" and not info.flipped and info.decoded == (height, width)
    ref = pil_eval_reference(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    mean, worst = diff(out, ref)
    assert mean < 0.3 and worst <= 1  # measured: mean 0.17, max 1


def test_eval_dct_scaled_against_pillow(impl):
    """A large JPEG decoded at 1/4 scale: close to Pillow's full-size reference, not equal."""
    data = jpeg(1300, 1100)
    out, info = decode(data)
    assert info.decoded == (325, 275)  # the box is 962 pixels wide: 1/4 leaves 240 >= 224
    mean, worst = diff(out, pil_eval_reference(PIL.Image.open(io.BytesIO(data)).convert("RGB")))
    assert mean < 1.0 and worst <= 24  # measured: mean 0.50, max 11 (at hard edges)


def test_dct_scaled_close_to_full_decode(impl):
    data = jpeg(1000, 1200, seed=4)
    scaled_decodes = 0
    for seed in range(5):
        full, a = decode(data, train=True, rng=random.Random(seed), dct_scaling=False)
        scaled, b = decode(data, train=True, rng=random.Random(seed))
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


def raw_reference(pixels, size):
    want = np.zeros(size + (pixels.shape[2],), np.uint8)
    kernel()(pixels, *center_crop_box(*pixels.shape[:2], size), want, False)
    return np.broadcast_to(want, size + (3,))


def test_ppm(impl):
    pixels = photo(70, 50)
    out, info = decode(encode(pixels, "PPM"), (32, 32))
    assert info.kind == "ppm" and info.decoded == (70, 50)
    np.testing.assert_array_equal(out, raw_reference(pixels, (32, 32)))


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
    (patched_sof(jpeg(16, 16), 8, 40000), "40000x8"),
    (patched_sof(jpeg(16, 16), 20000, 20000), "20000x20000"),  # 4e8 pixels > 2**28
    (png_header(40000, 10), "PNG image is 40000x10 pixels, outside the limits"),
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
    out, info = decode(jpeg(40, 50), (16, 16))
    assert isinstance(info, ImageInfo)
    assert info._replace(box=None) == ImageInfo(40, 50, None, False, (20, 25), "jpeg")  # at 1/2 scale
