"""Sample values into slot arrays: unchanged, or a ValueError that says what does not fit.

numpy's assignment casts without a word: 3.7 put in an int64 label is 3, and
``[300, -1, 1.9e10, nan]`` put in a uint8 field is ``[44, 255, 0, 0]``. The
loader's workers take a value only when the slot's dtype holds it as it is:

* integer and bool slots: integers (integral floats such as ``3.0`` too) within
  the dtype's range; NaN, infinities and fractions are refused;
* float and complex slots: any real number (rounded to the dtype's precision, as
  float32 rounds), but a finite value too large for the dtype (which would become
  infinite) and a non-zero imaginary part put in a real slot are refused;
* bytes slots (``"S<n>"``): text or bytes of at most n bytes, text in ASCII;
* text as numbers (``.cls`` labels, text fields): ASCII decimal numbers only, an
  integer as ``[+-]?[0-9]+``. Python's ``int()`` also reads ``"1_000"`` and
  ``"٣"`` (an Arabic-Indic three), and webdataset's ``.cls`` decoding is
  ``int(text)``; FastLoader does not: a label that reads differently to another
  tool is refused here.
"""

import functools
import numbers
import re
from typing import Any, Tuple, Union, cast

import numpy as np

__all__ = ["fitted", "integer_from_text", "numbers_from_text"]

_INTEGER = re.compile(rb"[+-]?[0-9]+")
_NUMBER = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)", re.I)
_SPACE = b" \t\n\r\f\v"


def integer_from_text(data: Any) -> int:
    """The integer that ``data`` (bytes, ASCII digits with an optional sign and surrounding white
    space) spells; ValueError otherwise."""
    text = bytes(data).strip(_SPACE)
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{bytes(data)[:40]!r} is not an integer (ASCII digits with an optional sign)")
    return int(text)


def numbers_from_text(data: Any) -> np.ndarray:
    """The numbers in ``data`` (bytes), separated by white space, as an array (int64 when all are
    integers that fit, else float64, or object for larger integers); ValueError for anything
    that is not an ASCII decimal number."""
    words = bytes(data).split()
    bad = next((w for w in words if not _NUMBER.fullmatch(w)), None)
    if bad is not None:
        raise ValueError(f"{bad[:40]!r} is not a number (ASCII decimal digits)")
    if all(_INTEGER.fullmatch(w) for w in words):
        return np.asarray([int(w) for w in words])
    return np.asarray([float(w) for w in words], dtype=np.float64)


def fitted(value: Any, dtype: Any) -> Union[int, np.ndarray]:
    """``value`` as an array of ``dtype`` (or an int that fits it) holding the same numbers (see
    the module docstring); ValueError naming the first element that does not fit."""
    dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    if type(value) in (int, float) and dtype.kind in "iu":  # a label, most often: no array needed
        low, high = _bounds(dtype)
        if low <= value <= high and (type(value) is int or value.is_integer()):
            return int(value)
    array = np.asarray(value)
    if array.dtype == dtype or np.can_cast(array.dtype, dtype, "safe"):
        return array
    if dtype.kind == "S":
        return _text(array, dtype)
    if array.dtype.kind not in "biufc":
        return _objects(array, dtype)
    with np.errstate(all="ignore"):  # what a cast does to NaN or a number out of range is judged below
        converted = array.real.astype(dtype) if array.dtype.kind == "c" != dtype.kind else array.astype(dtype)
        if dtype.kind in "iub":
            bad = converted != array
        else:
            bad = np.isfinite(array) & ~np.isfinite(converted)
            if array.dtype.kind == "c" != dtype.kind:
                bad |= array.imag != 0
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        _refuse(array[index], dtype, index)
    return converted


@functools.lru_cache(maxsize=None)
def _bounds(dtype: np.dtype) -> Union[Tuple[int, int], Tuple[float, float]]:
    if dtype.kind == "b":
        return 0, 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    largest = float(np.finfo(dtype).max)
    return -largest, largest


def _refuse(element: Any, dtype: np.dtype, index: Tuple[int, ...] = ()) -> None:
    """The ValueError for ``element`` (a number), element ``index`` of a value, in ``dtype``."""
    x = element.item() if isinstance(element, np.generic) else element
    low, high = _bounds(dtype)
    if isinstance(x, complex) and x.imag and dtype.kind != "c":
        problem = "has an imaginary part"
    elif dtype.kind in "iub" and not (isinstance(x, int) or (isinstance(x, float) and x.is_integer())):
        problem = "is not an integer"
    elif dtype.kind in "iub":
        problem = f"is outside {low}..{high}"
    else:
        problem = "is too large"
    where = f"element {list(index)} = " if index else ""
    raise ValueError(f"{where}{repr(x)[:40]} {problem}: it does not fit {_name(dtype)} as it is")


def _objects(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An array of Python numbers (integers beyond int64 and uint64, say) checked one by one."""
    items = list(array.flat) if array.dtype.kind == "O" else None
    if items is None or not all(isinstance(x, numbers.Number) for x in items):
        raise ValueError(f"{_show(array)} ({array.dtype}) is not numbers, for a {_name(dtype)} field")
    low, high = _bounds(dtype)
    for i, x in enumerate(items):
        if isinstance(x, numbers.Integral):
            fits = low <= int(x) <= high
        elif isinstance(x, numbers.Real):
            fits = dtype.kind not in "iub" or (float(x).is_integer() and low <= int(cast(Any, x)) <= high)
        else:
            fits = dtype.kind == "c"
        if not fits or (dtype.kind not in "iub" and isinstance(x, numbers.Real) and abs(cast(Any, x)) > high):
            _refuse(x, dtype, tuple(int(j) for j in np.unravel_index(i, array.shape)))
    return np.array([complex(x) if dtype.kind == "c" else x for x in items], dtype=dtype).reshape(array.shape)


def _text(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if array.dtype.kind not in "SU":
        raise ValueError(f"{_show(array)} ({array.dtype}) is not text or bytes, for a {_name(dtype)} field")
    try:
        encoded = np.char.encode(array, "ascii") if array.dtype.kind == "U" else array
    except UnicodeEncodeError as exn:
        raise ValueError(f"{_show(array)} is not ASCII text, for a {_name(dtype)} field") from exn
    long = np.char.str_len(encoded) > dtype.itemsize
    if long.any():
        index = tuple(int(i) for i in np.argwhere(long)[0]) if long.ndim else ()
        where = f"element {list(index)} = " if index else ""
        raise ValueError(f"{where}{repr(encoded[index].item())[:40]} is longer than {dtype.itemsize} bytes: "
                         f"it does not fit {_name(dtype)} as it is")
    return encoded


def _name(dtype: Any) -> str:
    return str(dtype).lstrip("|")


def _show(array: np.ndarray) -> str:
    text = np.array2string(array, threshold=6) if array.ndim else repr(array.item())
    return text[:80]
