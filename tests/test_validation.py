"""The one check of "an int, and large enough" (wdsmp/_internal/validation.py)."""

import numpy as np
import pytest

from wdsmp._internal.validation import count, is_int, non_negative_int, positive_int


def test_is_int_refuses_bools_floats_and_strings_and_takes_integer_types():
    assert is_int(0) and is_int(-3) and is_int(5, 5) and is_int(np.int64(1)) and is_int(np.uint8(3), 3)
    assert not is_int(4, 5)
    for value in (True, False, np.bool_(True), 1.0, np.float64(1.0), "1", None):
        assert not is_int(value)


def test_a_count_is_returned_as_a_plain_int():
    for value in (np.int64(7), np.uint16(7), 7):
        assert type(count(value, "n")) is int and count(value, "n") == 7
        assert type(positive_int(value, "n")) is int and type(non_negative_int(value, "n")) is int
    with pytest.raises(ValueError, match="samples must be an int >= 1, not 0"):
        count(0, "samples", 1)
    with pytest.raises(ValueError, match="samples must be an int >= 0, not True"):
        count(True, "samples")


def test_the_plan_the_index_and_the_command_line_share_the_rule():
    import argparse

    from wdsmp.cli.output import positive_int as positive_int_argument
    from wdsmp.shards.index import shard_table

    assert shard_table([("a.tar", np.int64(3))]) == (("a.tar", 3),)
    with pytest.raises(ValueError, match="sample count of 'a.tar' must be an int >= 0, not True"):
        shard_table([("a.tar", True)])
    assert positive_int_argument("4") == 4
    for text in ("0", "-2", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a positive integer"):
            positive_int_argument(text)


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
