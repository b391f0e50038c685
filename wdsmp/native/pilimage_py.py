"""Pure-Python twin of ``wdsmp.native._pilimage`` (src/ext/_pilimage.pyx): the same Pillow image, with its
pixels copied in by ``PIL.Image.frombytes`` instead of shared."""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import PIL.Image

__all__ = ["pil_image"]


def pil_image(pixels: np.ndarray, mode: str) -> "PIL.Image.Image":
    """A Pillow image of ``mode`` ``"RGB"`` (``pixels`` HxWx4 uint8, the fourth byte 255) or
    ``"L"`` (HxW uint8), C-contiguous and not empty; a copy."""
    import PIL.Image

    _check(pixels, mode)
    size = (pixels.shape[1], pixels.shape[0])
    return PIL.Image.frombytes(mode, size, pixels, "raw", "RGBX" if mode == "RGB" else "L")


def _check(pixels: object, mode: str) -> None:
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' or 'L', not {mode!r}")
    ndim = 3 if mode == "RGB" else 2
    if (not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != ndim
            or (mode == "RGB" and pixels.shape[2] != 4) or not pixels.flags.c_contiguous or pixels.size == 0):
        raise ValueError(f"a {mode} image needs a C-contiguous, non-empty uint8 array of shape "
                         f"{'HxWx4' if mode == 'RGB' else 'HxW'}, not {getattr(pixels, 'dtype', type(pixels))} "
                         f"{getattr(pixels, 'shape', '')}")
