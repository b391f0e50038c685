"""Sample values into slot dtypes: unchanged, or an error naming what does not fit (never a cast)."""

import numpy as np
import pytest

from wdsmp.fast.values import fitted, integer_from_text, numbers_from_text

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("value, dtype, message", [
    ([300, -1, 1.9e10, NAN], "uint8", r"element \[0\] = 300.0 is outside 0..255"),  # numpy: [44, 255, 0, 0]
    ([3, -1], "uint8", r"element \[1\] = -1 is outside 0..255"),
    ([1.9e10], "int32", r"element \[0\] = 19000000000.0 is outside -2147483648..2147483647"),
    ([2, NAN], "int64", r"element \[1\] = nan is not an integer"),
    ([INF], "uint8", r"inf is not an integer"),
    (3.7, "int64", r"^3.7 is not an integer: it does not fit int64 as it is$"),
    (np.float32(2.0**63), "int64", r"is outside -9223372036854775808..9223372036854775807"),
    (2**70, "int64", r"1180591620717411303424 is outside"),
    (np.array([1, 2**70], dtype=object), "int64", r"element \[1\] = 1180591620717411303424 is outside"),
    (np.array([-1]), "uint64", r"-1 is outside 0..18446744073709551615"),
    ([0, 1, 2], "bool", r"element \[2\] = 2 is outside 0..1"),
    (np.array([[1, 2], [3, 300]]), "uint8", r"element \[1, 1\] = 300 is outside"),
    (1 + 2j, "int64", r"has an imaginary part"),
    (1 + 2j, "float32", r"has an imaginary part"),
    ([1e39, INF, NAN], "float32", r"element \[0\] = 1e\+39 is too large"),
    (70000, "float16", r"70000 is too large"),
    ([1, 2**2000], "float64", r"element \[1\] = \d+ is too large"),
    (None, "int64", r"None \(object\) is not numbers"),
    ("7", "int64", r"'7' \(<U1\) is not numbers"),
    (["abc"], "S2", r"element \[0\] = b'abc' is longer than 2 bytes"),
    ("é", "S4", r"is not ASCII text"),
    (5, "S4", r"is not text or bytes"),
])
def test_what_a_cast_would_change_is_refused(value, dtype, message):
    with pytest.raises(ValueError, match=message):
        fitted(value, dtype)


@pytest.mark.parametrize("value, dtype", [
    (3, "int64"), (3.0, "int64"), (np.int64(5), "uint8"), (True, "int64"), ([3, 4], "uint8"),
    (np.arange(4, dtype=np.int64), "int16"), ([1.5, 2], "float32"), ([1.0, NAN, -INF], "float16"),
    (2.0**63 - 1024, "int64"), (-2.0**63, "int64"), (2**64 - 1, "uint64"), (1 + 0j, "float32"),
    (np.array([1.5, 2], dtype=object), "float64"), (["ab", "c"], "S2"), ([b"ab"], "S3"), (0.1, "float32"),
])
def test_what_fits_is_kept(value, dtype):
    kept = fitted(value, dtype)
    slot = np.zeros(np.shape(value), dtype)
    slot[...] = kept
    expected = np.asarray(value)
    if slot.dtype.kind == "S":
        expected = np.char.encode(expected, "ascii") if expected.dtype.kind == "U" else expected
        assert np.array_equal(slot, expected)
    else:
        assert np.allclose(slot.astype(np.complex128), expected.astype(np.complex128), equal_nan=True, rtol=1e-3)
        if slot.dtype.kind in "iub":
            assert slot.astype(object).tolist() == np.asarray(value, dtype=object).tolist()


@pytest.mark.parametrize("text, number", [(b"7", 7), (b" -12\n", -12), (b"+3", 3), (b"0042", 42)])
def test_integer_text(text, number):
    assert integer_from_text(text) == number


@pytest.mark.parametrize("text", [b"1_000", "\u0663".encode(), "\uff13".encode(), b"5.0", b"", b"0x10", b"1 2",
                                  b"\xff"])
def test_integer_text_is_ascii_digits_only(text):
    """Python's int() reads "1_000", an Arabic-Indic and a full-width three; a label must not."""
    with pytest.raises(ValueError, match="is not an integer .ASCII digits"):
        integer_from_text(text)


def test_numbers_text():
    assert numbers_from_text(b"1 -2 3").tolist() == [1, -2, 3]
    assert numbers_from_text(b"1 .5 2e3 nan -inf").tolist()[:3] == [1.0, 0.5, 2000.0]
    for text in (b"1_000 2", "\u0663".encode(), b"1,5", b"0x1"):
        with pytest.raises(ValueError, match="is not a number"):
            numbers_from_text(text)
