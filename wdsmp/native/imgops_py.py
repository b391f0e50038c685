"""Pure-Python (numpy) twin of the native image kernel (``src/ext/_imgops.pyx``).

Same signature, same errors, same pixels: the taps are computed with the same
double operations in the same order as the native code, and the two passes
use the same integer arithmetic (NOTE [resize arithmetic] in ``_imgops.pyx``),
here in int64 arrays. Selected with ``WDSMP_PUREPYTHON=1`` or when the
extension is not built.
"""

from typing import TYPE_CHECKING, Tuple

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["crop_resize_flip"]

_WBITS = 14


def _taps(in_size: int, in0: float, length: float, out_size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(first, count, weights)`` of one axis: int64 arrays, weights ``out_size x stride``."""
    scale = length / out_size
    support = scale if scale > 1.0 else 1.0
    ss = 1.0 / support
    center = in0 + (np.arange(out_size) + 0.5) * scale
    first = np.maximum(np.floor(center - support + 0.5), 0).astype(np.int64)
    count = np.minimum(np.floor(center + support + 0.5), in_size).astype(np.int64) - first
    stride = int(count.max())
    stride += stride & 1
    j = np.arange(stride)
    used = j < count[:, None]
    d = np.abs((first[:, None] + j - center[:, None] + 0.5) * ss)
    k = np.where(used & (d < 1.0), 1.0 - d, 0.0)
    cum = np.add.accumulate(k, axis=1)  # tap by tap, as the native loop adds them
    total = cum[:, -1:]  # adding the padding's zeros changes nothing
    steps = np.floor(cum / total * (1 << _WBITS) + 0.5).astype(np.int64)
    weights = np.where(used, np.diff(steps, axis=1, prepend=0), 0)
    return first, count, weights


def _array(a: "npt.ArrayLike", name: str) -> np.ndarray:
    """``a`` as a numpy view, checked as the native kernel's typed memoryviews check it."""
    a = np.asarray(a)
    if a.dtype != np.uint8 or a.ndim != 3:
        raise ValueError(f"{name} must be an HxWxC uint8 array, not {a.dtype} with {a.ndim} dimensions")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous")
    return a


def crop_resize_flip(src: "npt.ArrayLike", y0: float, x0: float, h: float, w: float, out: "npt.ArrayLike",
                     flip: bool = False) -> None:
    """Resize the box ``(y0, x0, h, w)`` of ``src`` (source pixels, sub-pixel) to fill ``out``.

    The twin of the native ``crop_resize_flip``: antialiased when shrinking,
    bilinear when enlarging; ``flip`` mirrors the result left to right.
    """
    src = _array(src, "src")
    out = _array(out, "out")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    y0, x0, h, w = float(y0), float(x0), float(h), float(w)
    in_h, in_w, channels = src.shape
    out_h, out_w = out.shape[:2]
    if channels not in (1, 3):
        raise ValueError(f"src has {channels} channels; 1 or 3 are supported")
    if out.shape[2] != channels:
        raise ValueError(f"out has {out.shape[2]} channels, src has {channels}")
    if in_h == 0 or in_w == 0 or out_h == 0 or out_w == 0:
        raise ValueError(f"empty image: src is {in_h}x{in_w}, out is {out_h}x{out_w}")
    if not (h > 0 and w > 0):
        raise ValueError(f"crop box size {h}x{w} is not positive")
    if not (y0 >= 0 and x0 >= 0 and y0 + h <= in_h and x0 + w <= in_w):
        raise ValueError(f"crop box (y0={y0}, x0={x0}, h={h}, w={w}) is not inside the {in_h}x{in_w} image")
    fy, cy, wy = _taps(in_h, y0, h, out_h)
    fx, cx, wx = _taps(in_w, x0, w, out_w)
    xlo, xhi = int(fx[0]), int(fx[-1] + cx[-1])
    region = src[:, xlo:xhi].astype(np.int64)
    # Vertical pass: taps past an output's count have weight 0; clamp their rows.
    acc = np.full((out_h, xhi - xlo, channels), 64, np.int64)
    for j in range(wy.shape[1]):
        acc += wy[:, j, None, None] * region[np.minimum(fy + j, in_h - 1)]
    rows = acc >> 7
    # Horizontal pass, over the vertical pass's columns.
    acc = np.full((out_h, out_w, channels), 1 << 20, np.int64)
    for j in range(wx.shape[1]):
        acc += wx[None, :, j, None] * rows[:, np.minimum(fx - xlo + j, xhi - xlo - 1)]
    result = np.clip(acc >> 21, 0, 255).astype(np.uint8)
    out[...] = result[:, ::-1] if flip else result
