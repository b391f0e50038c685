"""One image's bytes to a fixed-size RGB crop, written straight into a slot row.

FastLoader's decode step, in each worker. The crop box is chosen in
the source's full-resolution pixels from the header alone; a JPEG is then
decoded by libjpeg-turbo at the smallest DCT scale (1/8, 1/4 or 1/2) that
still leaves the box at least as large as the output (less IDCT, colour
conversion and memory; the entropy decoding stays), and only the region of
it that the crop reads (NOTE [jpeg regions]); the native kernel then resizes
(antialiased), crops and flips the box into ``out`` in one pass. Raw pixels
(binary ``.ppm``, ``.npy``) skip decoding altogether, FFCV's recipe for speed.
Everything else goes through Pillow: slower, not an error.

NOTE [jpeg regions]: with the region decoder built (``wdsmp.native._jpegregion``,
see :func:`wdsmp.native.core.jpeg_region_available`), a JPEG is decoded only over
the rows and columns that the resize kernel's taps read for the box (the box
widened by the filter's support, ``max(1, box / out)`` pixels, on each side),
plus one pixel on each side: libjpeg-turbo's fancy upsampling of 4:2:x chroma
treats a cropped row's first and last column as image edges, so those two
columns may differ from a whole decode and must stay out of the kernel's
reach. Inside that margin the pixels are a whole decode's; the kernel's taps
are the same up to rounding of the box's offset, so the output matches a
whole decode's to within a unit or so in rare pixels (measured: identical).
The region is never narrower than three columns unless it is the whole row,
so libjpeg-turbo keeps fancy upsampling (it drops it for rows cropped to one
chroma sample). Rows below the region are never read, so damage there would
go unnoticed: a file that does not end with the end-of-image marker (one cut
short, the common damage) is decoded whole, so that it is refused whatever
the crop; whatever the region decoder refuses (libjpeg-turbo's warnings
included) takes the whole-image path too (simplejpeg, then Pillow), so no
image decodes worse than without it.

The boxes follow torchvision: :func:`random_resized_crop_box` is
``RandomResizedCrop``'s parameter draw, :func:`center_crop_box` is
``Resize(floor(size / resize_ratio))`` then ``CenterCrop(size)``, so a model
trained with torchvision transforms sees the same geometry.
"""

import io
import math
import re
from time import perf_counter_ns
from typing import Any, Callable, NamedTuple, Optional, Protocol, Tuple, Union, cast

import numpy as np

from ..native import core as native
from ..errors import DecodeError
from ..images.jpeg import decode_jpeg, jpeg_header, scaled_size
from ..images.size import (MAX_PIXELS, MAX_SIDE, ImageTooLarge, check_before_opening, check_budget, check_size,
                           is_jpeg, jpeg_size, loader_pixel_budget)
from .options import DecodeOptions, positive_range, unit_fraction

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "ImageInfo",
    "center_crop_box",
    "decode_into",
    "decode_with_options",
    "dct_scale",
    "is_jpeg",
    "jpeg_size",
    "random_resized_crop_box",
]

Box = Tuple[float, float, float, float]  # (y0, x0, h, w) in source pixels
_Buffer = Union[bytes, bytearray, memoryview]
_BoxOf = Callable[[int, int], Box]
# (pixels, height, width, box, the box in the decoded pixels, kind, scale, region)
_Decoded = Tuple[np.ndarray, int, int, Box, Box, str, int, bool]


class _Random(Protocol):
    """What the crops draw from: ``random.Random`` or a numpy ``Generator``."""

    def random(self) -> float: ...


class _Clock(Protocol):
    """Where :func:`decode_with_options` adds its time (``stats.WorkerClock``)."""

    decode_ns: int
    resize_ns: int


_JPEG_END = b"\xff\xd9"  # the end-of-image marker
_NPY_MAGIC = b"\x93NUMPY"
_PNM_NUMBER = re.compile(rb"(?:\s|#[^\n]*\n)+(\d+)")


class ImageInfo(NamedTuple):
    """What :func:`decode_into` did to one image."""

    height: int  # the source's size, in pixels
    width: int
    box: Tuple[float, float, float, float]  # (y0, x0, h, w) in source pixels
    flipped: bool
    # The size of the pixel array decoded: the source's, the DCT-scaled image's, or for a JPEG
    # through the region decoder only the region of the DCT-scaled image the crop reads.
    decoded: Tuple[int, int]
    kind: str  # "jpeg", "ppm", "npy", "pil" or "array"
    scale: int = 8  # a JPEG was decoded at scale/8 (DCT scaling); 8 for full size and other formats
    region: bool = False  # a JPEG decoded only over the region the crop reads (NOTE [jpeg regions])


def _uniform(rng: _Random, low: float, high: float) -> float:
    return low + (high - low) * rng.random()


def _randint(rng: _Random, n: int) -> int:
    """A uniform integer in ``[0, n)``."""
    return min(int(rng.random() * n), n - 1)


def random_resized_crop_box(height: int, width: int, rng: _Random, scale: Tuple[float, float] = (0.08, 1.0),
                            ratio: Tuple[float, float] = (3 / 4, 4 / 3)) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``: ``(y0, x0, h, w)`` in source pixels.

    Ten tries at a box of a random area fraction in ``scale`` and a log-uniform
    aspect ratio (w / h) in ``ratio`` that fits the image; then the fallback: the
    largest centred box whose aspect ratio is clamped into ``ratio``. ``rng``
    is anything with a ``random()`` method (``random.Random``, a numpy
    ``Generator``); the draws are torchvision's, from that source.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size {height}x{width} is empty")
    return _random_box(height, width, rng, positive_range(scale, "scale"), positive_range(ratio, "ratio"))


def _random_box(height: int, width: int, rng: _Random, scale: Tuple[float, float], ratio: Tuple[float, float]) -> Box:
    """:func:`random_resized_crop_box` on arguments known to be valid."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * _uniform(rng, scale[0], scale[1])
        aspect = math.exp(_uniform(rng, log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return _randint(rng, height - h + 1), _randint(rng, width - w + 1), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(height: int, width: int, size: Union[int, Tuple[int, int]], resize_ratio: float = 0.875) -> Box:
    """The eval box: ``(y0, x0, h, w)`` in source pixels (floats).

    The convention is torchvision's ``Resize(S)`` then ``CenterCrop(size)``
    with ``S = floor(max(size) / resize_ratio)`` (256 for 224 at 0.875, as timm
    computes it): the short side is resized to ``S``, the long side to
    ``int(S * long / short)``, the crop's top-left corner is at
    ``round((resized - size) / 2)`` (Python's round) in the resized image. The
    box is that crop mapped back to source pixels, so resizing it to ``size``
    gives the same pixel grid as resizing the whole image and cropping.
    ``size`` is an int or ``(h, w)``.
    """
    out_h, out_w = cast(Tuple[int, int], (size, size) if np.ndim(size) == 0 else size)
    if height < 1 or width < 1:
        raise ValueError(f"image size {height}x{width} is empty")
    if out_h < 1 or out_w < 1:
        raise ValueError(f"crop size {size} is empty")
    return _center_box(height, width, out_h, out_w, unit_fraction(resize_ratio, "resize_ratio", zero=False))


def _center_box(height: int, width: int, out_h: int, out_w: int, resize_ratio: float) -> Box:
    """:func:`center_crop_box` on arguments known to be valid."""
    short = math.floor(max(out_h, out_w) / resize_ratio)
    if width <= height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    top, left = int(round((new_h - out_h) / 2.0)), int(round((new_w - out_w) / 2.0))
    sy, sx = height / new_h, width / new_w
    y0, x0 = top * sy, left * sx
    return y0, x0, min(out_h * sy, height - y0), min(out_w * sx, width - x0)


def dct_scale(height: int, width: int, box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The numerator ``n`` of the libjpeg-turbo scale ``n/8`` to decode at: the
    smallest of 1/8, 1/4 and 1/2 that leaves the box at least ``out_h x out_w``,
    else 8 (full size).

    Only those: libjpeg-turbo has SIMD code for the 1/2 and 1/4 reduced IDCTs
    (1/8 keeps only the DC term), while 3/8 and 5/8 to 7/8 run generic scalar
    IDCTs: 3/8 decodes slower than 1/2, 5/8 to 7/8 slower than full size
    (measured in benchmarks/RESULTS.md). simplejpeg, given ``min_height=ceil(height n / 8)``
    and ``min_width=ceil(width n / 8)``, picks the smallest scale whose output
    is at least that large; that is ``n`` itself when a side has 8 pixels or
    more (any smaller scale shortens that side), so tinier images are not scaled.
    """
    if max(height, width) < 8:
        return 8
    for n in (1, 2, 4):
        if box_h * n >= 8 * out_h and box_w * n >= 8 * out_w:
            return n
    return 8


class _Refused(ValueError):
    """An image this module will not decode; :func:`decode_into` reraises it as a DecodeError."""


def _pnm_pixels(data: _Buffer) -> Optional[np.ndarray]:
    """HxWxC pixels of a binary 8-bit PPM (P6) or PGM (P5), viewing ``data``; None for other PNMs."""
    channels = 3 if data[:2] == b"P6" else 1
    numbers, pos = [], 2
    for _ in range(3):
        match = _PNM_NUMBER.match(data, pos)
        if match is None:
            return None
        numbers.append(int(match.group(1)))
        pos = match.end()
    width, height, maxval = numbers
    if maxval != 255 or not bytes(data[pos:pos + 1]).isspace():
        return None
    pos += 1  # a single whitespace byte ends the header
    check_size(height, width, "the PNM image")
    size = height * width * channels
    if len(data) < pos + size:
        raise _Refused(f"the PNM image is cut short: {len(data) - pos} bytes of pixels, {size} expected")
    return np.frombuffer(data, np.uint8, size, pos).reshape(height, width, channels)


def _npy_pixels(data: _Buffer) -> np.ndarray:
    """HxWxC pixels of an ``.npy`` uint8 array (HxWx3, HxWx1 or HxW), viewing ``data`` when C-ordered."""
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise _Refused(f".npy format version {version} is not supported")
    shape, fortran, dtype = read_header(stream)
    if dtype != np.uint8 or len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3)):
        raise _Refused(f"a .npy image must be a uint8 HxWx3, HxWx1 or HxW array, not {dtype} {shape}")
    check_size(shape[0], shape[1], "the .npy image")
    size = math.prod(shape)
    if len(data) < stream.tell() + size:
        raise _Refused(f"the .npy array is cut short: {len(data) - stream.tell()} bytes, {size} expected")
    pixels = np.frombuffer(data, np.uint8, size, stream.tell()).reshape(shape, order="F" if fortran else "C")
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return np.ascontiguousarray(pixels)


def _pil_pixels(data: _Buffer, box_of: _BoxOf, out_size: Tuple[int, int], dct_scaling: bool, budget: int) -> _Decoded:
    """``(pixels, height, width, box, box in pixels, "pil", scale, False)`` through Pillow: the size is
    checked before the pixels are decoded, a JPEG is decoded at the DCT scale that covers the
    box (Pillow's ``draft``), and what is decoded is held to ``budget`` pixels (formats other
    than JPEG cannot be decoded smaller: they are refused above it)."""
    import PIL
    import PIL.Image

    check_before_opening(data, budget)
    try:
        image = PIL.Image.open(io.BytesIO(data))
    except PIL.Image.DecompressionBombError as exn:
        raise _Refused(str(exn)) from exn
    except PIL.UnidentifiedImageError as exn:
        raise _Refused(f"not an image format Pillow knows (it starts {bytes(data[:8])!r})") from exn
    with image:
        height, width = image.height, image.width
        what = f"the {image.format} image"
        check_size(height, width, what)
        box = box_of(height, width)
        n = dct_scale(height, width, box[2], box[3], *out_size) if dct_scaling and image.format == "JPEG" else 8
        if n < 8:
            image.draft(image.mode, (-(-width * n // 8), -(-height * n // 8)))
        check_budget(image.height, image.width, budget, what)
        image.load()
        if image.mode.startswith("I;16"):  # 16-bit grey: scaled to 8 bits, where Pillow's convert clips at 255
            grey = (np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8)
            pixels = np.repeat(grey[:, :, None], 3, axis=2)
        else:
            pixels = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
    y0, x0 = box[0] * sy, box[1] * sx
    scaled = (y0, x0, min(box[2] * sy, pixels.shape[0] - y0), min(box[3] * sx, pixels.shape[1] - x0))
    return pixels, height, width, box, scaled if (sy, sx) != (1, 1) else box, "pil", n, False


def _jpeg_pixels(data: _Buffer, box_of: _BoxOf, out_size: Tuple[int, int], dct_scaling: bool, region: bool,
                 budget: int) -> Optional[_Decoded]:
    """``(pixels, height, width, box, box in pixels, kind, scale, region)`` of a JPEG, decoded at a DCT
    scale that covers the box, only the region the crop needs when ``region`` and the
    region decoder is built (NOTE [jpeg regions]); None for what libjpeg-turbo cannot
    read or would convert differently (CMYK). What it refuses after the header goes to
    Pillow, as in autodecode: Pillow reads some damaged files (extraneous bytes, bad
    markers) that strict libjpeg-turbo does not, and the reference path decodes them."""
    size = jpeg_header(data, budget)
    if size is None:
        return None
    height, width = size
    box = box_of(height, width)
    n = dct_scale(height, width, box[2], box[3], *out_size) if dct_scaling else 8
    scaled_h, scaled_w = scaled_size(height, width, n)
    y0, x0, h, w = (v * n / 8 for v in box)  # the box in the scaled image's pixels
    inside = (y0, x0, min(h, scaled_h - y0), min(w, scaled_w - x0))
    # Without its end-of-image marker a file may be cut short: decoded whole, it is refused
    # whatever the crop, not only when the cut falls above the crop's last row.
    decoder = native.jpeg_region_module() if region and bytes(data[-2:]) == _JPEG_END else None
    if decoder is not None:
        top, bottom = _region_span(y0, inside[2], out_size[0], scaled_h)
        left, right = _region_span(x0, inside[3], out_size[1], scaled_w)
        check_budget(bottom - top, right - left, budget, "the JPEG image")
        try:
            pixels, top, left = decoder.decode_region(data, n, top, left, bottom - top, right - left,
                                                      max_side=MAX_SIDE, max_pixels=MAX_PIXELS)
        except ValueError:
            pass  # damaged or unusual: the whole-image path below decides
        else:
            y, x = y0 - top, x0 - left
            return pixels, height, width, box, (y, x, min(inside[2], pixels.shape[0] - y),
                                                min(inside[3], pixels.shape[1] - x)), "jpeg", n, True
    pixels = decode_jpeg(data, size, budget, "RGB", n)
    if pixels is None:
        return _pil_pixels(data, lambda h, w: box, out_size, dct_scaling, budget)
    return pixels, height, width, box, box if n == 8 else inside, "jpeg", n, False


def _region_span(start: float, length: float, out: int, size: int) -> Tuple[int, int]:
    """``[lo, hi)``: the rows (or columns) of a ``size``-pixel axis that the resize kernel
    reads to make ``out`` pixels of ``[start, start + length)``, plus one on each side
    (NOTE [jpeg regions])."""
    support = max(length / out, 1.0)  # the triangle filter's half-width (NOTE [resize arithmetic])
    return max(0, math.floor(start - support) - 1), min(size, math.ceil(start + length + support) + 1)


def decode_into(data: Any, out: np.ndarray, train: bool, rng: Optional[_Random], *,
                scale: Tuple[float, float] = (0.08, 1.0), ratio: Tuple[float, float] = (3 / 4, 4 / 3),
                flip: float = 0.5, resize_ratio: float = 0.875, dct_scaling: bool = True, region: bool = True,
                url: Optional[str] = None, member: Optional[str] = None) -> ImageInfo:
    """Decode one image's bytes into ``out`` (an HxWx3 uint8 C-contiguous array,
    e.g. a slot row) and return an :class:`ImageInfo`.

    ``train``: a :func:`random_resized_crop_box` box (``scale``, ``ratio``),
    mirrored with probability ``flip``, drawn from ``rng`` (``random.Random`` or
    a numpy ``Generator``). Otherwise the :func:`center_crop_box` box
    (``resize_ratio``), never mirrored; ``rng`` may be None. ``dct_scaling=False``
    decodes JPEGs at full size (slower, pixels closer to a Pillow reference).
    ``region=False`` decodes whole JPEGs even when the region decoder is built
    (slower, the same pixels within a unit or so: NOTE [jpeg regions]).

    The format is sniffed from the bytes: JPEG (libjpeg-turbo, grayscale
    expanded to RGB by it; CMYK/YCCK through Pillow, whose conversion the rest
    of wdsmp uses too), binary 8-bit PPM/PGM and ``.npy`` uint8 arrays (no
    decoding), anything else through Pillow. Headers that claim more than
    ``MAX_SIDE`` per side or ``MAX_PIXELS`` in all are refused before any pixel
    is allocated, and so is an image that would decode to more pixels than the
    budget (``DecodeOptions.max_pixels``, else ``imagesize.loader_pixel_budget``:
    at least 256 times the output's pixels): JPEGs are decoded at reduced size
    first, so it is formats decoded whole (PNG, WebP, ...) that meet it. ``data`` may
    also be pixels a stage decoded already (a uint8 HxWx3, HxWx1 or HxW array, or a
    PIL image): they are only cropped and resized. Failures raise :class:`wdsmp.DecodeError` naming ``url`` and
    ``member``, the cause chained.
    """
    options = DecodeOptions.of(train, scale, ratio, flip, resize_ratio, dct_scaling, region)
    if options.train and rng is None:
        raise ValueError("train=True needs an rng to draw crops from")
    return decode_with_options(data, out, options, rng, url=url, member=member)


def decode_with_options(data: Any, out: np.ndarray, options: DecodeOptions, rng: Optional[_Random], *,
                        url: Optional[str] = None, member: Optional[str] = None,
                        clock: Optional[_Clock] = None) -> ImageInfo:
    """:func:`decode_into` with its crop arguments in ``options`` (a ``DecodeOptions``, checked
    when it was made): the per-image path of the loader's workers, which checks them no more.
    ``clock``, if given, gets the nanoseconds spent decoding added to its ``decode_ns`` and
    those spent cropping, resizing and flipping to its ``resize_ns``."""
    if not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
            and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous HxWx3 uint8 array, not "
                         f"{getattr(out, 'dtype', type(out))} {getattr(out, 'shape', '')}")
    train, out_size = options.train, (out.shape[0], out.shape[1])

    def box_of(height: int, width: int) -> Box:
        if train:
            assert rng is not None, "train=True draws its crops from an rng"
            return _random_box(height, width, rng, options.scale, options.ratio)
        return _center_box(height, width, *out_size, options.resize_ratio)

    budget = options.max_pixels or loader_pixel_budget(None, *out_size)
    start = perf_counter_ns()
    try:
        encoded = isinstance(data, (bytes, bytearray, memoryview))
        decoded = None
        if encoded:
            decoded = _jpeg_pixels(data, box_of, out_size, options.dct_scaling, options.region, budget)
            if decoded is None:
                decoded = _raw_pixels(data, box_of, out_size, options.dct_scaling, budget)
        if decoded is None:
            pixels = _array_pixels(data)
            height, width = pixels.shape[:2]
            box = scaled = box_of(height, width)
            kind, scale, region = "array", 8, False
        else:
            pixels, height, width, box, scaled, kind, scale, region = decoded
    except (_Refused, ImageTooLarge) as exn:
        raise DecodeError(str(exn), url, member) from exn.__cause__
    except (ValueError, OSError, SyntaxError) as exn:  # how libjpeg-turbo, numpy and Pillow report damage
        raise DecodeError(f"cannot decode the image ({type(exn).__name__}: {exn})", url, member) from exn
    decoded_at = perf_counter_ns()
    flipped = bool(train and options.flip and rng is not None and rng.random() < options.flip)
    _resize(pixels, scaled, out, flipped)
    if clock is not None:
        end = perf_counter_ns()
        clock.decode_ns += decoded_at - start
        clock.resize_ns += end - decoded_at
    return ImageInfo(height, width, box, flipped, (pixels.shape[0], pixels.shape[1]), kind, scale, region)


def _raw_pixels(data: _Buffer, box_of: _BoxOf, out_size: Tuple[int, int], dct_scaling: bool,
                budget: int) -> _Decoded:
    """``(pixels, height, width, box, box in pixels, kind, scale, region)`` of anything but a JPEG
    libjpeg-turbo decodes: PNM and ``.npy`` pixels as they are, the rest through Pillow."""
    head = bytes(data[:6])
    pixels = None
    if head[:2] in (b"P5", b"P6"):
        pixels, kind = _pnm_pixels(data), "ppm"
    elif head == _NPY_MAGIC:
        pixels, kind = _npy_pixels(data), "npy"
    if pixels is None:
        return _pil_pixels(data, box_of, out_size, dct_scaling, budget)
    box = box_of(*pixels.shape[:2])
    return pixels, pixels.shape[0], pixels.shape[1], box, box, kind, 8, False


def _array_pixels(value: Any) -> np.ndarray:
    """HxWxC pixels of an already decoded image: a uint8 array (HxWx3, HxWx1 or HxW) or
    anything ``numpy.asarray`` makes one of (a PIL image)."""
    pixels = np.asarray(value)
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3)):
        raise _Refused(f"a decoded image must be a uint8 HxWx3, HxWx1 or HxW array, not "
                       f"{type(value).__name__} {pixels.dtype} {pixels.shape}")
    check_size(pixels.shape[0], pixels.shape[1], "the array image")
    return np.ascontiguousarray(pixels if pixels.ndim == 3 else pixels[:, :, None])


def _resize(pixels: np.ndarray, box: Box, out: np.ndarray, flipped: bool) -> None:
    """The kernel in use (native or twin) on one box; one-channel sources are expanded to RGB."""
    crop_resize_flip = native.imgops_module().crop_resize_flip
    if pixels.shape[2] == 3:
        crop_resize_flip(pixels, *box, out, flipped)
    else:
        gray = np.empty(out.shape[:2] + (1,), np.uint8)
        crop_resize_flip(pixels, *box, gray, flipped)
        out[...] = gray
