"""Image bytes decoded as an image spec of ``wdsmp.autodecode`` says: Pillow's images and pixels,
the JPEGs among them decoded by libjpeg-turbo where that gives the same, faster.

webdataset opens every image with Pillow, loads it and converts it to the
spec's mode, and returns that (a copy: an ``Image``, ``format`` None, the
file's ``info``) or its pixels as an array. wdsmp returns the same, value for
value; only the way there differs (NOTE [same pixels]).

NOTE [same pixels]: Pillow decodes a JPEG with libjpeg-turbo, accurate integer
IDCT and fancy upsampling, into four bytes a pixel (RGB and a pad byte of 255)
for an RGB image. simplejpeg runs the same library with the same settings, so
for the JPEGs Pillow opens as RGB or L its ``RGBX`` or ``GRAY`` output is
Pillow's image memory byte for byte (tests/test_specdecode.py checks 4:4:4,
4:2:2, 4:2:0, 4:4:0 and 4:1:1 sampling, grayscale, progressive and
restart-marker files, and photographs, against Pillow): decoded straight into
an array that becomes the image (``native.pil_image_module``), it skips
Pillow's feeding of the decoder, its row unpacking and webdataset's copy in
``convert``. Pillow keeps everything else: the header (size, mode, ``info``,
its size limits) is read by ``PIL.Image.open``, every conversion (an RGB
JPEG to ``L`` or ``RGBA``) is Pillow's, and CMYK/YCCK files, files libjpeg-turbo
warns about (damaged, cut short) and other formats are decoded by Pillow as
before. Images over shared memory are read-only in Pillow's sense (an
in-place change copies them first). An RGB image of a baseline JPEG for the
``"pil"`` specs is lazy (``wdsmp/images/lazyjpeg.py``): decoded by this same path when its
pixels are first read, or a region at a time for a crop or a resize that reads
only part of it, with the same result; until then its class is a subclass of
Pillow's.
"""

import functools
import io
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple, Union

import numpy as np

from ..native import core as native
from .jpeg import decode_jpeg, jpeg_header
from .size import MAX_PIXELS, MAX_SIDE, check_before_opening, check_budget, check_size

if TYPE_CHECKING:
    import PIL.Image
    import torch

_Buffer = Union[bytes, bytearray, memoryview]

__all__ = ["decode_image", "jpeg_image"]

_PIL_MODES = {"l": "L", "rgb": "RGB", "rgba": "RGBA"}
_JPEG_COLORSPACES = {"rgb": "RGB", "rgba": "RGBA"}


def jpeg_image(data: _Buffer, mode: str, budget: int, lazy: bool = False) -> Optional["PIL.Image.Image"]:
    """A Pillow image in ``mode`` (``"RGB"``, ``"L"`` or ``"RGBA"``) of JPEG bytes, the same as
    Pillow's open, load and convert give, decoded by libjpeg-turbo into the image's memory
    (NOTE [same pixels]); None to leave it to Pillow. ImageTooLarge, before anything is
    decoded, for more than ``budget`` pixels. ``lazy``: an RGB image of a baseline JPEG is a
    ``wdsmp.images.lazyjpeg.LazyJpegImage``, decoded when its pixels are first read, a crop's or a
    resize's region alone where that is all they read (NOTE [region geometry] there)."""
    size = jpeg_header(data, budget)
    if size is None:
        return None
    check_budget(*size, budget, "the JPEG image")  # decoded whole, by this module or by Pillow
    import PIL.Image

    try:
        with io.BytesIO(data) as stream:
            header = PIL.Image.open(stream)  # the header only: size, mode, info
            source, (width, height), info = header.mode, header.size, header.info
            if header.format != "JPEG":
                return None
    except Exception:  # noqa: BLE001 (Pillow's own path raises its own error for it)
        return None
    if source not in ("RGB", "L"):
        return None
    if lazy and mode == "RGB" and source == "RGB" and _regions_decodable(data, info):
        from .lazyjpeg import LazyJpegImage

        if not isinstance(data, bytes):  # a buffer the caller may change or release once this returns
            data = bytes(data)
        whole = functools.partial(_whole_rgb_image, data, (width, height), info, budget)
        return LazyJpegImage(data, (width, height), dict(info), whole)
    image = _decoded_jpeg(data, source, mode, (width, height), info)
    return image if image is None or image.mode == mode else image.convert(mode)


def _regions_decodable(data: _Buffer, info: Mapping[Any, Any]) -> bool:
    """Whether an RGB JPEG with header ``info`` may be decoded a region at a time: a baseline
    (sequential) one whose image data is one scan with no marker in it, up to the end-of-image
    marker that ends the file (a file cut short, or damaged into markers, is decoded whole at
    once, so that its error comes from ``decode``: NOTE [damage past the region]), where the
    region decoder is built and Pillow builds images over shared memory and decodes an image
    on ``im``; and where libjpeg-turbo reads its tables and starts decoding (damaged tables,
    which ``PIL.Image.open`` does not read, fail every region and Pillow's ``load``)."""
    import PIL.Image

    module = native.jpeg_region_module()
    if ("progressive" in info or module is None or not hasattr(PIL.Image, "fromarrow")
            or not isinstance(vars(PIL.Image.Image).get("im"), property)):
        return False
    from .lazyjpeg import one_clean_scan

    if not one_clean_scan(data):
        return False
    try:
        module.check_start(data, max_side=MAX_SIDE, max_pixels=MAX_PIXELS)
    except ValueError:
        return False
    return True


def _decoded_jpeg(data: _Buffer, source: str, mode: str, size: Tuple[int, int],
                  info: Mapping[Any, Any]) -> Optional["PIL.Image.Image"]:
    """The JPEG's pixels, decoded whole by libjpeg-turbo, as a Pillow image over them: ``L``
    for a grayscale JPEG wanted in ``mode`` ``"L"``, else ``RGB``; None to leave it to Pillow."""
    width, height = size
    gray = source == "L" and mode == "L"
    pixels = np.empty((height, width) if gray else (height, width, 4), np.uint8)
    import simplejpeg

    try:
        decoded = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGBX", buffer=pixels)
    except ValueError:  # damaged, or beyond what simplejpeg reads: Pillow decides
        return None
    if decoded.shape[:2] != (height, width):
        return None
    image = native.pil_image_module().pil_image(pixels, "L" if gray else "RGB")
    if image is not None:
        image.info = dict(info)
    return image


def _whole_rgb_image(data: _Buffer, size: Tuple[int, int], info: Mapping[Any, Any], budget: int) -> "PIL.Image.Image":
    """A lazy image's whole decode: the RGB image of an RGB JPEG that ``decode_image`` gives."""
    image = _decoded_jpeg(data, "RGB", "RGB", size, info)
    return _pil_image(data, "RGB", budget) if image is None else image


def _jpeg_pixels(data: _Buffer, mode: str, budget: int) -> Optional[np.ndarray]:
    """HxWxC uint8 pixels (RGB or RGBA) of a JPEG through libjpeg-turbo; None to leave it to
    Pillow (CMYK/YCCK files, which libjpeg-turbo converts by another formula than Pillow's,
    damaged ones, and what simplejpeg does not read)."""
    size = jpeg_header(data, budget)
    return None if size is None else decode_jpeg(data, size, budget, _JPEG_COLORSPACES[mode])


def _pil_image(data: _Buffer, mode: str, budget: int) -> "PIL.Image.Image":
    """Pillow's open, load and convert, as webdataset decodes every image; its size held to the
    limits and to ``budget`` once the header is read, before the pixels are."""
    import PIL.Image

    check_before_opening(data, budget)
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        what = f"the {image.format} image"
        check_size(image.height, image.width, what)
        check_budget(image.height, image.width, budget, what)
        image.load()
    if image.mode.startswith("I;16") and mode in ("L", "RGB", "RGBA"):
        warnings.warn(f"{what} is 16-bit grey ({image.mode}), and Pillow's convert to {mode}, which this "
                      f"decoder does as webdataset's does, turns every value above 255 into 255: decode it "
                      f"with 'pil' and scale it yourself (FastLoader scales it to 8 bits)")
    return image.convert(mode)


def decode_image(data: _Buffer, atype: str, etype: str, mode: str,
                 budget: int) -> Union["PIL.Image.Image", np.ndarray, "torch.Tensor"]:
    """Image bytes as the spec's array type (``"pil"``, ``"numpy"``, ``"torch"``), element type
    (``"uint8"``, ``"float"``) and mode (``"l"``, ``"rgb"``, ``"rgba"``) say; ImageTooLarge for
    an image of more than ``budget`` pixels, before it is decoded."""
    target = _PIL_MODES[mode]
    if atype == "pil":
        image = jpeg_image(data, target, budget, lazy=True)
        return _pil_image(data, target, budget) if image is None else image
    pixels: Optional[np.ndarray]
    if mode == "l":  # Pillow's RGB to L formula, not libjpeg-turbo's luma
        image = jpeg_image(data, target, budget)
        pixels = np.asarray(_pil_image(data, target, budget) if image is None else image)
    else:
        pixels = _jpeg_pixels(data, mode, budget)
        if pixels is None:
            pixels = np.asarray(_pil_image(data, target, budget))
    if etype == "float":
        pixels = pixels.astype(np.float32)
        np.divide(pixels, 255.0, out=pixels)
    if atype == "numpy":
        return pixels
    import torch

    if pixels.ndim == 3:
        pixels = np.ascontiguousarray(pixels.transpose(2, 0, 1))  # CHW, as webdataset
    elif not pixels.flags.writeable:
        pixels = pixels.copy()  # torch.from_numpy wants memory it may write
    return torch.from_numpy(pixels)
