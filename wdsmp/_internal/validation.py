"""What counts as a count: the one rule of "an integer, and large enough" that every path uses.

A count is an ``int`` or any integer type that says so through ``__index__``
(numpy's, for counts computed with numpy), and never a bool: ``batch_size=True``
is a mistake, not a batch of one. :func:`count` returns it as a plain ``int``,
so what is stored, pickled or written to a state is always an ``int``. The
epoch plan, the shard index, the command line and every argument check go
through :func:`count`; sites that word their own message ask :func:`is_int`.
"""

import operator
from typing import Optional

__all__ = ["count", "is_int", "non_negative_int", "positive_int"]


def _integer(value: object) -> Optional[int]:
    """The plain int ``value`` stands for, or None when it is no integer (a bool is none)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def count(value: object, what: str, low: int = 0, high: Optional[int] = None) -> int:
    """``value`` as a plain int >= ``low`` (and <= ``high``, when given: what a loop or an
    allocation sized by it can afford); else ValueError naming ``what``."""
    number = _integer(value)
    if number is None or number < low or (high is not None and number > high):
        within = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{what} must be an int {within}, not {value!r}")
    return number


def is_int(value: object, low: Optional[int] = None) -> bool:
    """Whether ``value`` is a count (an integer, not a bool) of at least ``low`` (when given)."""
    number = _integer(value)
    return number is not None and (low is None or number >= low)


def positive_int(value: object, name: str) -> int:
    """``value`` as a plain int when it is a count >= 1; else ValueError naming ``name``."""
    if not is_int(value, 1):
        raise ValueError(f"{name} must be a positive int, not {value!r}")
    return count(value, name, 1)


def non_negative_int(value: object, name: str) -> int:
    """``value`` as a plain int when it is a count >= 0; else ValueError naming ``name``."""
    if not is_int(value, 0):
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return count(value, name, 0)
