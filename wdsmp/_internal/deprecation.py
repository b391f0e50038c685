"""Decorators that mark functions ``@deprecated`` (a warning) or ``@obsolete`` (an error)."""

import functools
import warnings
from typing import Any, Callable, Optional

from . import env as _env
from ..errors import WdsmpError

__all__ = ["ObsoleteException", "deprecated", "obsolete"]


def deprecated(arg: Any = None) -> Callable[..., Any]:
    """Decorator: calls warn with a DeprecationWarning; ``@deprecated`` or ``@deprecated("reason")``."""
    reason = None if callable(arg) else arg

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            message = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                message += f" Reason: {reason}"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return func(*args, **kw)

        return wrapper

    return decorator(arg) if callable(arg) else decorator


class ObsoleteException(WdsmpError):
    """A function marked ``@obsolete`` was called without ``ALLOW_OBSOLETE=1``."""


def obsolete(func: Optional[Callable[..., Any]] = None, *, reason: Optional[str] = None) -> Callable[..., Any]:
    """Decorator: calls raise ObsoleteException unless the environment has ``ALLOW_OBSOLETE=1``."""
    if func is None:
        return functools.partial(obsolete, reason=reason)

    @functools.wraps(func)
    def wrapper(*args: Any, **kw: Any) -> Any:
        if not _env.allow_obsolete():
            message = f"Call to obsolete function {func.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                message += f" Reason: {reason}"
            raise ObsoleteException(message)
        return func(*args, **kw)

    return wrapper
