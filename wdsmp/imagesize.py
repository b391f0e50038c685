"""What an image's header says about its size, read before any pixel is decoded.

Both decode paths (``autodecode`` and FastLoader's ``fast.imagedecode``) sniff JPEGs
and refuse oversized headers the same way, so the facts live here, below both.
A few bytes of header can claim gigabytes of pixels (a decompression bomb): a
claim beyond ``MAX_SIDE`` per side or ``MAX_PIXELS`` in all is refused before
anything is allocated.
"""

__all__ = ["MAX_PIXELS", "MAX_SIDE", "ImageTooLarge", "check_size", "is_jpeg", "jpeg_size"]

MAX_SIDE = 32768
MAX_PIXELS = 1 << 28

_JPEG_MAGIC = b"\xff\xd8\xff"


class ImageTooLarge(ValueError):
    """An image header claims more pixels than the limits allow."""


def check_size(height, width, what):
    """Raise ImageTooLarge when ``height`` x ``width`` is outside the limits; ``what`` names the image."""
    if height < 1 or width < 1 or height > MAX_SIDE or width > MAX_SIDE or height * width > MAX_PIXELS:
        raise ImageTooLarge(f"{what} is {width}x{height} pixels, outside the limits (sides 1 to "
                            f"{MAX_SIDE}, at most {MAX_PIXELS} pixels); refusing to decode it")


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
