"""Error-handling policies for pipeline stages (webdataset's ``handler=``).

A handler receives the exception raised while processing one item. It either
raises (stop everything), returns True (skip the item and continue) or returns
False (end the stream quietly). Unlike webdataset, the warning handlers never
sleep: a loader must not stall because data is bad.
"""

import warnings
from typing import Any, Callable, NoReturn

__all__ = [
    "reraise_exception",
    "ignore_and_continue",
    "warn_and_continue",
    "ignore_and_stop",
    "warn_and_stop",
]

# What a stage's ``handler=`` is: called with the exception; a true result skips the item, a
# false one ends the stream, raising stops everything.
_Handler = Callable[[Exception], Any]


def reraise_exception(exn: BaseException) -> NoReturn:
    """Re-raise the exception: the default, nothing bad passes silently."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip the failing item and go on."""
    return True


def warn_and_continue(exn: BaseException) -> bool:
    """Warn about the failing item, skip it and go on."""
    warnings.warn(repr(exn), stacklevel=2)
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """End the stream at the failing item."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn about the failing item and end the stream there."""
    warnings.warn(repr(exn), stacklevel=2)
    return False
