"""What an image's header says about its size, read before any pixel is decoded.

Both decode paths (``autodecode`` and FastLoader's ``fast.imagedecode``) sniff JPEGs
and refuse oversized headers the same way, so the facts live here, below both.
A few bytes of header can claim gigabytes of pixels (a decompression bomb): a
claim beyond ``MAX_SIDE`` per side (65,500, the most libjpeg-turbo decodes: a
40000x600 panorama is an image) or ``MAX_PIXELS`` in all (256 Mi) is refused
before anything is allocated. Below those limits an image still costs memory in
proportion to its pixels (a 28-byte WebP or a 20 kB PNG can claim 13000 x 13000,
2 GB as float RGB), so each decode path also holds an image to a per-image pixel
budget before decoding it (:func:`check_budget`): ``max_image_pixels`` where the
caller gives one, else ``WDSMP_MAX_IMAGE_PIXELS``, else
:data:`DEFAULT_MAX_IMAGE_PIXELS` (64 Mi pixels, 8192 x 8192; below Pillow's own
bomb warning at 89 Mi), which FastLoader raises for large outputs, since it
decodes JPEGs at reduced size (:func:`loader_pixel_budget`).
"""

from . import _env
from .validation import positive_int

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "MAX_PIXELS", "MAX_SIDE", "ImageTooLarge", "check_before_opening",
           "check_budget", "check_size", "image_pixel_budget", "is_jpeg", "jpeg_size", "loader_pixel_budget",
           "webp_size"]

MAX_SIDE = 65500  # the longest side libjpeg-turbo decodes (JPEG_MAX_DIMENSION); the area is held below
MAX_PIXELS = 1 << 28
DEFAULT_MAX_IMAGE_PIXELS = 1 << 26
# FastLoader's default budget is at least this many times the output's pixels.
OUTPUT_BUDGET_FACTOR = 256

_JPEG_MAGIC = b"\xff\xd8\xff"


class ImageTooLarge(ValueError):
    """An image header claims more pixels than the limits allow."""


def check_size(height, width, what):
    """Raise ImageTooLarge when ``height`` x ``width`` is outside the limits; ``what`` names the image."""
    if height < 1 or width < 1 or height > MAX_SIDE or width > MAX_SIDE or height * width > MAX_PIXELS:
        raise ImageTooLarge(f"{what} is {width}x{height} pixels, outside the limits (sides 1 to "
                            f"{MAX_SIDE}, at most {MAX_PIXELS} pixels); refusing to decode it")


def image_pixel_budget(value=None):
    """The pixels one image may decode to: ``value``, else ``WDSMP_MAX_IMAGE_PIXELS``, else
    :data:`DEFAULT_MAX_IMAGE_PIXELS`."""
    if value is None:
        value = _env.max_image_pixels() or DEFAULT_MAX_IMAGE_PIXELS
    return positive_int(value, "max_image_pixels")


def loader_pixel_budget(value, out_height, out_width):
    """FastLoader's budget for an output of ``out_height x out_width``: ``value`` or
    ``WDSMP_MAX_IMAGE_PIXELS`` when given, else the larger of the default and
    ``OUTPUT_BUDGET_FACTOR`` times the output's pixels (a JPEG is decoded at reduced size,
    so only formats decoded whole come near it)."""
    if value is None and _env.max_image_pixels() is None:
        return max(DEFAULT_MAX_IMAGE_PIXELS, OUTPUT_BUDGET_FACTOR * out_height * out_width)
    return image_pixel_budget(value)


def check_budget(height, width, budget, what):
    """Raise ImageTooLarge when decoding ``height x width`` pixels would pass ``budget``."""
    if height * width > budget:
        raise ImageTooLarge(f"{what} decodes to {width}x{height} = {height * width} pixels, more than the "
                            f"budget of {budget} pixels per image (max_image_pixels, or "
                            f"WDSMP_MAX_IMAGE_PIXELS); refusing to decode it")


def webp_size(data):
    """``(height, width)`` from a WebP file's first chunk (lossy, lossless or extended), or
    None when ``data`` is no WebP or too short to say."""
    head = bytes(data[:30])
    if len(head) < 25 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    kind = head[12:16]
    if len(head) < 30 and kind != b"VP8L":
        return None
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(head[28:30], "little") & 0x3FFF, int.from_bytes(head[26:28], "little") & 0x3FFF
    if kind == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if kind == b"VP8X":
        return int.from_bytes(head[27:30], "little") + 1, int.from_bytes(head[24:27], "little") + 1
    return None


def check_before_opening(data, budget):
    """Refuse what Pillow would allocate for when merely opening it: a WebP (its decoder
    makes the whole canvas at open) beyond the limits or ``budget``. Other formats are
    checked once open, before their pixels are loaded."""
    size = webp_size(data)
    if size is not None:
        check_size(*size, "the WEBP image")
        check_budget(*size, budget, "the WEBP image")


def is_jpeg(data):
    """Whether ``data`` starts as a JPEG file does: start-of-image, then a marker."""
    return bytes(data[:3]) == _JPEG_MAGIC


def jpeg_size(data):
    """``(height, width)`` of a JPEG for libjpeg-turbo to decode; None to leave ``data`` to
    Pillow: not a JPEG, a header simplejpeg cannot read, or CMYK/YCCK, which libjpeg-turbo
    converts to RGB by another formula than Pillow's. ImageTooLarge for a size beyond
    ``MAX_SIDE`` and ``MAX_PIXELS``, before anything is allocated."""
    if not is_jpeg(data):
        return None
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ValueError, KeyError):  # KeyError: a sampling layout simplejpeg has no name for
        return None
    check_size(height, width, "the JPEG image")
    return None if colorspace in ("CMYK", "YCCK") else (height, width)
