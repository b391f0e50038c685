"""Image specs decode to what Pillow gives, value for value (NOTE [same pixels] in
``wdsmp/images/specdecode.py``): the reference below is webdataset's recipe (open, load, convert, then
``numpy.asarray`` for arrays), written here with Pillow alone, so the suite needs no webdataset."""

import io
import os
import sys

import numpy as np
import PIL.Image
import pytest
import simplejpeg
import torch

from wdsmp import autodecode
from wdsmp.native import pilimage_py as _pilimage_py
from wdsmp.native import core as native
from wdsmp.images.specdecode import jpeg_image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
from photos import photo  # noqa: E402

SPECS = ["pil", "pill", "pilrgba", "rgb8", "l8", "rgba8", "rgb", "torchrgb8", "torchl"]


def reference(data, spec):
    """What webdataset 1.0.2 returns for ``spec``, with Pillow alone."""
    atype, etype, mode = autodecode.imagespecs[spec]
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        image.load()
        image = image.convert(mode.upper())
    if atype == "pil":
        return image.convert(mode.upper())
    pixels = np.asarray(image)
    if etype == "float":
        pixels = pixels.astype(np.float32) / 255.0
    if atype == "numpy":
        return pixels
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy() if pixels.ndim == 3 else pixels.copy())


def assert_same(ours, theirs):
    if isinstance(theirs, PIL.Image.Image):  # a JPEG's RGB image may be lazy until its pixels are read
        assert isinstance(ours, PIL.Image.Image)
        assert (ours.mode, ours.size, ours.format, ours.info) == (theirs.mode, theirs.size, theirs.format, theirs.info)
        assert ours.tobytes() == theirs.tobytes()
        assert type(ours) is type(theirs)
    elif isinstance(theirs, torch.Tensor):
        assert type(ours) is type(theirs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and torch.equal(ours, theirs)
    else:
        assert type(ours) is type(theirs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and np.array_equal(ours, theirs)


def _pillow_jpeg(pixels, mode="RGB", **options):
    stream = io.BytesIO()
    PIL.Image.fromarray(pixels).convert(mode).save(stream, "JPEG", **options)
    return stream.getvalue()


_ICC = b"\x00" * 128 + b"not a real profile, carried as bytes"


def jpegs():
    """``{name: JPEG bytes}``: each sampling layout, grayscale, progressive, restart markers, an RGB
    (not YCbCr) JPEG, odd sizes, EXIF and ICC data; and a CMYK one, which Pillow decodes."""
    rng = np.random.default_rng(5)
    pixels = photo(61, 83, seed=3)
    files = {f"pillow {s}": _pillow_jpeg(pixels, quality=90, subsampling=s) for s in ("4:4:4", "4:2:2", "4:2:0")}
    files.update({f"libjpeg-turbo {s}": simplejpeg.encode_jpeg(pixels, 85, colorsubsampling=s)
                  for s in ("444", "422", "420", "440", "411")})
    files["grayscale"] = _pillow_jpeg(pixels, "L", quality=80)
    files["progressive 4:2:0"] = _pillow_jpeg(pixels, quality=95, progressive=True)
    files["progressive grayscale"] = _pillow_jpeg(pixels, "L", progressive=True, optimize=True)
    files["restart markers"] = _pillow_jpeg(pixels, quality=75, restart_marker_blocks=3)
    files["RGB, not YCbCr"] = _pillow_jpeg(pixels, keep_rgb=True, subsampling="4:4:4")
    exif = PIL.Image.Exif()
    exif[0x0112] = 6  # orientation: decoders leave it to the caller
    files["EXIF and ICC"] = _pillow_jpeg(pixels, quality=90, exif=exif.tobytes(), icc_profile=_ICC, dpi=(300, 300))
    for height, width in ((1, 1), (1, 37), (29, 1), (17, 9)):
        files[f"{height}x{width}"] = _pillow_jpeg(photo(height, width, seed=height), quality=int(rng.integers(50, 99)))
    files["CMYK"] = _pillow_jpeg(pixels, "CMYK", quality=90)
    return files


JPEGS = jpegs()


@pytest.mark.parametrize("name", sorted(JPEGS))
@pytest.mark.parametrize("spec", SPECS)
def test_jpegs_decode_as_pillow_decodes_them(impl, name, spec):
    data = JPEGS[name]
    assert (jpeg_image(data, "RGB", 1 << 26) is None) == (name == "CMYK"), "libjpeg-turbo decodes all but CMYK"
    assert_same(autodecode.imagehandler(spec)(".jpg", data), reference(data, spec))


def test_photographs_decode_as_pillow_decodes_them(impl):
    """Many photograph-like JPEGs of assorted sizes, qualities and sampling, as the loader
    benchmark's corpus mixes them."""
    rng = np.random.default_rng(11)
    for seed in range(24):
        pixels = photo(int(rng.integers(40, 160)), int(rng.integers(40, 160)), seed=seed)
        quality, sampling = int(rng.integers(60, 100)), ["4:4:4", "4:2:0", "4:2:2"][seed % 3]
        data = _pillow_jpeg(pixels, quality=quality, subsampling=sampling, progressive=seed % 4 == 0)
        for spec in ("pil", "pill", "rgb8"):
            assert_same(autodecode.imagehandler(spec)(".jpg", data), reference(data, spec))


def test_skimage_photographs_decode_as_pillow_decodes_them(impl):
    data_dir = os.path.dirname(pytest.importorskip("skimage.data").__file__)
    names = [name for name in os.listdir(data_dir) if name.endswith(".jpg")]
    assert names, "scikit-image ships JPEG photographs"
    for name in names:
        with open(os.path.join(data_dir, name), "rb") as stream:
            data = stream.read()
        for spec in ("pil", "pill"):
            assert_same(autodecode.imagehandler(spec)(".jpg", data), reference(data, spec))


def test_damaged_jpegs_fail_as_pillow_fails(impl):
    data = JPEGS["pillow 4:2:0"]
    cut = data[: len(data) // 2]
    with pytest.raises(OSError) as theirs:
        reference(cut, "pil")
    with pytest.raises(autodecode.DecodingError, match="truncated") as ours:
        autodecode.Decoder(["pil"]).decode({"__key__": "k", "jpg": cut})
    assert type(ours.value.__cause__) is type(theirs.value)


def test_pil_images_over_decoded_pixels_native_and_twin(impl):
    pixels = np.full((3, 5, 4), 255, np.uint8)
    pixels[..., 0] = np.arange(5)
    pixels[..., 1] = np.arange(3)[:, None]
    image = native.pil_image_module().pil_image(pixels, "RGB")
    assert (type(image), image.mode, image.size) == (PIL.Image.Image, "RGB", (5, 3))
    assert np.array_equal(np.asarray(image), pixels[..., :3])
    gray = native.pil_image_module().pil_image(np.ascontiguousarray(pixels[..., 0]), "L")
    assert gray.mode == "L" and np.array_equal(np.asarray(gray), pixels[..., 0])
    with pytest.raises(ValueError, match="HxWx4"):
        native.pil_image_module().pil_image(pixels[..., :3].copy(), "RGB")
    with pytest.raises(ValueError, match="mode must be"):
        native.pil_image_module().pil_image(pixels, "RGBA")


def test_the_native_image_shares_the_pixels_and_lets_them_go():
    compiled = pytest.importorskip("wdsmp.native._pilimage")
    if not hasattr(PIL.Image, "fromarrow"):
        pytest.skip("Pillow before 11.2 builds no images over shared memory")
    pixels = np.full((4, 6, 4), 255, np.uint8)
    before = sys.getrefcount(pixels)
    image = compiled.pil_image(pixels, "RGB")
    pixels[0, 0, :3] = (1, 2, 3)
    assert image.getpixel((0, 0)) == (1, 2, 3)  # no copy
    assert _pilimage_py.pil_image(pixels, "RGB").tobytes() == image.tobytes()
    image.resize((3, 2)).load()
    del image
    assert sys.getrefcount(pixels) == before  # the image gave its reference back


def test_a_16_bit_grey_png_decodes_as_webdataset_decodes_it_with_a_warning():
    """decode("rgb8") is Pillow's convert, as in webdataset: a 16-bit grey image comes out
    clipped at 255, and a warning says so and what to do (FastLoader scales it instead)."""
    grey = (np.arange(40 * 50, dtype=np.uint16).reshape(40, 50) * 30)
    stream = io.BytesIO()
    PIL.Image.fromarray(grey).save(stream, "PNG")
    with pytest.warns(UserWarning, match=r"16-bit grey \(I;16\).*every value above 255 into 255.*'pil'"):
        pixels = autodecode.imagehandler("rgb8")("png", stream.getvalue())
    assert pixels.dtype == np.uint8 and pixels.max() == 255
    np.testing.assert_array_equal(pixels[..., 0], np.asarray(PIL.Image.fromarray(grey).convert("RGB"))[..., 0])
