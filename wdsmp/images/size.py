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

import re
import struct
from typing import Optional, Tuple, Union

from .._internal import env
from .._internal.validation import positive_int

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "MAX_PIXELS", "MAX_SCANS", "MAX_SIDE", "ImageTooLarge", "check_before_opening",
           "check_budget", "check_jpeg", "check_size", "image_pixel_budget", "is_jpeg", "jpeg_size",
           "loader_pixel_budget", "webp_size"]

MAX_SIDE = 65500  # the longest side libjpeg-turbo decodes (JPEG_MAX_DIMENSION); the area is held below
MAX_PIXELS = 1 << 28
# Scans a progressive JPEG may have: encoders write about 10; repeating one burns CPU at each.
MAX_SCANS = 256
DEFAULT_MAX_IMAGE_PIXELS = 1 << 26
# FastLoader's default budget is at least this many times the output's pixels.
OUTPUT_BUDGET_FACTOR = 256

_JPEG_MAGIC = b"\xff\xd8\xff"

_Buffer = Union[bytes, bytearray, memoryview]


class ImageTooLarge(ValueError):
    """An image header claims more pixels than the limits allow."""


def check_size(height: int, width: int, what: str) -> None:
    """Raise ImageTooLarge when ``height`` x ``width`` is outside the limits; ``what`` names the image."""
    if height < 1 or width < 1 or height > MAX_SIDE or width > MAX_SIDE or height * width > MAX_PIXELS:
        raise ImageTooLarge(f"{what} is {width}x{height} pixels, outside the limits (sides 1 to "
                            f"{MAX_SIDE}, at most {MAX_PIXELS} pixels); refusing to decode it")


def image_pixel_budget(value: Optional[int] = None) -> int:
    """The pixels one image may decode to: ``value``, else ``WDSMP_MAX_IMAGE_PIXELS``, else
    :data:`DEFAULT_MAX_IMAGE_PIXELS`."""
    if value is None:
        value = env.max_image_pixels() or DEFAULT_MAX_IMAGE_PIXELS
    return positive_int(value, "max_image_pixels")


def loader_pixel_budget(value: Optional[int], out_height: int, out_width: int) -> int:
    """FastLoader's budget for an output of ``out_height x out_width``: ``value`` or
    ``WDSMP_MAX_IMAGE_PIXELS`` when given, else the larger of the default and
    ``OUTPUT_BUDGET_FACTOR`` times the output's pixels (a JPEG is decoded at reduced size,
    so only formats decoded whole come near it)."""
    if value is None and env.max_image_pixels() is None:
        return max(DEFAULT_MAX_IMAGE_PIXELS, OUTPUT_BUDGET_FACTOR * out_height * out_width)
    return image_pixel_budget(value)


def check_budget(height: int, width: int, budget: int, what: str) -> None:
    """Raise ImageTooLarge when decoding ``height x width`` pixels would pass ``budget``."""
    if height * width > budget:
        raise ImageTooLarge(f"{what} decodes to {width}x{height} = {height * width} pixels, more than the "
                            f"budget of {budget} pixels per image (max_image_pixels, or "
                            f"WDSMP_MAX_IMAGE_PIXELS); refusing to decode it")


def webp_size(data: _Buffer) -> Optional[Tuple[int, int]]:
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


def check_before_opening(data: _Buffer, budget: int) -> None:
    """Refuse what Pillow would allocate for when merely opening it: a WebP (its decoder
    makes the whole canvas at open) beyond the limits or ``budget``; and a progressive JPEG
    that costs more than it looks (``check_jpeg``). Other formats are checked once open,
    before their pixels are loaded."""
    size = webp_size(data)
    if size is not None:
        check_size(*size, "the WEBP image")
        check_budget(*size, budget, "the WEBP image")
    check_jpeg(data, budget)


_PROGRESSIVE_FRAMES = (0xC2, 0xC6, 0xCA, 0xCE)  # SOF2, SOF6, SOF10, SOF14
_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn; C4 is DHT, C8 reserved, CC DAC
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")  # in a scan's data only stuffed 0x00 and restarts follow 0xFF
_SEGMENT = struct.Struct(">BBH")  # 0xFF, the marker, the segment's length
_FRAME = struct.Struct(">BHHB")  # precision, height, width, components


def check_jpeg(data: _Buffer, budget: int, what: str = "the JPEG image") -> None:
    """Refuse, before any pixel is decoded, the progressive JPEGs that cost more than they look:
    libjpeg-turbo holds a progressive file's every coefficient (2 bytes each, for every pixel of
    every component, at full size whatever scale it decodes at), so their bytes are held to what
    ``budget`` pixels of RGB would take; and it decodes every scan, so a file that repeats a scan
    thousands of times burns seconds of CPU in a few kilobytes: more than :data:`MAX_SCANS` are
    refused. ImageTooLarge for either; a baseline JPEG, or what is no JPEG or cannot be parsed,
    passes (the decoders decide)."""
    if not is_jpeg(data):
        return
    frame = _frame(data)
    if frame is None or frame[0] not in _PROGRESSIVE_FRAMES:
        return
    _, components, height, width, first_scan = frame
    coefficients = 2 * components * height * width
    if coefficients > 3 * budget:
        raise ImageTooLarge(f"{what} is progressive, {width}x{height} pixels of {components} components: "
                            f"libjpeg-turbo holds all its {coefficients / 2**20:,.0f} MiB of coefficients whatever "
                            f"size it decodes to, more than the budget of {budget} pixels per image allows "
                            f"(max_image_pixels, or WDSMP_MAX_IMAGE_PIXELS); refusing to decode it")
    scans = _count_scans(data, first_scan)
    if scans > MAX_SCANS:
        raise ImageTooLarge(f"{what} is progressive with {scans} scans, more than the {MAX_SCANS} a JPEG may "
                            f"have here (encoders write about 10; each scan is decoded in full, so repeated "
                            f"ones burn CPU); refusing to decode it")


def _frame(data: _Buffer) -> Optional[Tuple[int, int, int, int, int]]:
    """``(SOF marker, components, height, width, offset of the first scan's header)`` of a JPEG,
    from its segments before the first scan; None where they cannot be read."""
    at, frame, size = 2, None, len(data)
    try:
        while at + 4 <= size:
            tag, marker, length = _SEGMENT.unpack_from(data, at)
            if tag != 0xFF:
                return None
            if marker == 0xFF:  # fill byte
                at += 1
            elif marker == 0xDA:  # the first scan
                return None if frame is None else (*frame, at)
            else:
                if marker in _FRAMES:
                    _, height, width, components = _FRAME.unpack_from(data, at + 4)
                    frame = (marker, components, height, width)
                at += 2 + length
    except struct.error:  # a segment past the end
        return None
    return None


def _count_scans(data: _Buffer, at: int) -> int:
    """The scans of a JPEG, from the header of its first scan at offset ``at``: each scan's
    entropy-coded data is skipped to the next marker (a regular expression, at C speed)."""
    data = bytes(data)
    scans = 0
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xD9:  # end of image
            break
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
        if marker == 0xDA:
            scans += 1
            if scans > MAX_SCANS:
                break
            found = _MARKER.search(data, at)
            if found is None:
                break
            at = found.start()
    return scans


def is_jpeg(data: _Buffer) -> bool:
    """Whether ``data`` starts as a JPEG file does: start-of-image, then a marker."""
    return bytes(data[:3]) == _JPEG_MAGIC


def jpeg_size(data: _Buffer) -> Optional[Tuple[int, int]]:
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
