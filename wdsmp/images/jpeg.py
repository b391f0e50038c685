"""The one JPEG decode: libjpeg-turbo, held to the pixel budget.

Both image paths decode JPEGs here: ``autodecode``'s specs (the whole image, in the
spec's colour space) and FastLoader's workers (at the DCT scale that covers the crop).
The rule they share is the order of the checks. The header is read first and a
progressive file held to its coefficients' cost (``check_jpeg``); then the size the
decode will make, scaled or not, is held to the budget; only then is a pixel
decoded. What libjpeg-turbo refuses after the header gives None, so that the caller
can hand the file to Pillow, which reads some damaged files that strict
libjpeg-turbo does not.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from .size import check_budget, check_jpeg, jpeg_size

__all__ = ["decode_jpeg", "jpeg_header", "scaled_size"]

_Buffer = Union[bytes, bytearray, memoryview]


def jpeg_header(data: _Buffer, budget: int) -> Optional[Tuple[int, int]]:
    """A JPEG's ``(height, width)`` from its header, None when there is none to read;
    ImageTooLarge for a progressive file that costs more than ``budget`` pixels allow."""
    size = jpeg_size(data)
    if size is not None:
        check_jpeg(data, budget)
    return size


def scaled_size(height: int, width: int, eighths: int) -> Tuple[int, int]:
    """The size libjpeg-turbo decodes a ``height`` x ``width`` JPEG to at ``eighths``/8 scale:
    each side rounded up."""
    return -(-height * eighths // 8), -(-width * eighths // 8)


def decode_jpeg(data: _Buffer, size: Tuple[int, int], budget: int, colorspace: str = "RGB",
                eighths: int = 8) -> Optional[np.ndarray]:
    """HxWxC uint8 pixels of a JPEG whose header gave ``size`` (:func:`jpeg_header`), decoded
    at ``eighths``/8 scale in ``colorspace``; ImageTooLarge, before decoding, when the
    decoded size is over ``budget`` pixels; None when libjpeg-turbo refuses the file."""
    import simplejpeg

    height, width = scaled_size(*size, eighths)
    check_budget(height, width, budget, "the JPEG image")
    scaled = {} if eighths == 8 else {"min_height": height, "min_width": width}
    try:
        pixels: np.ndarray = simplejpeg.decode_jpeg(data, colorspace, **scaled)
    except ValueError:
        return None
    return pixels
