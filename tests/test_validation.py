"""The one check of "an int, and large enough" (wdsmp/validation.py)."""

import numpy as np
import pytest

from wdsmp.validation import is_int, non_negative_int, positive_int


def test_is_int_refuses_bools_floats_and_numpy_ints():
    assert is_int(0) and is_int(-3) and is_int(5, 5)
    assert not is_int(4, 5)
    for value in (True, False, 1.0, "1", None, np.int64(1)):
        assert not is_int(value)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_positive_int_names_the_argument(value):
    with pytest.raises(ValueError, match=f"batch_size must be a positive int, not {value!r}"):
        positive_int(value, "batch_size")


def test_non_negative_int():
    assert non_negative_int(0, "n") == 0 and positive_int(3, "n") == 3
    with pytest.raises(ValueError, match="n must be a non-negative int, not -1"):
        non_negative_int(-1, "n")
    with pytest.raises(ValueError, match="non-negative int"):
        non_negative_int(False, "n")
