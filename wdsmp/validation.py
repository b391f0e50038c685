"""What counts as a count: the one check of "an int, and large enough" that wdsmp's arguments use.

A bool is an int to Python, but ``batch_size=True`` is a mistake, not a batch
of one: here it is not an int. numpy integers are not ints either (arguments
are stored and pickled as given). Sites that word their own message use
:func:`is_int`; the others raise through :func:`positive_int` or
:func:`non_negative_int`.
"""

__all__ = ["is_int", "non_negative_int", "positive_int"]


def is_int(value, low=None):
    """Whether ``value`` is an int, not a bool, and at least ``low`` (when given)."""
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def positive_int(value, name):
    """``value`` when it is an int >= 1; else ValueError naming ``name``."""
    if not is_int(value, 1):
        raise ValueError(f"{name} must be a positive int, not {value!r}")
    return value


def non_negative_int(value, name):
    """``value`` when it is an int >= 0; else ValueError naming ``name``."""
    if not is_int(value, 0):
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return value
