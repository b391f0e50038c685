"""Names to objects: symbols looked up in modules, and expression templates filled from data."""

import importlib
import re
from typing import Any, Iterable

__all__ = ["lookup_sym", "safe_eval"]


def lookup_sym(sym: str, modules: Iterable[str]) -> Any:
    """Attribute ``sym`` of the first module in ``modules`` that has it (not None), else None.

    Relative module names (``".filters"``) are taken inside wdsmp, as
    webdataset takes them inside webdataset.
    """
    for name in modules:
        result = getattr(importlib.import_module(name, package="wdsmp"), sym, None)
        if result is not None:
            return result
    return None


_SAFE_WORD = re.compile(r"[A-Za-z0-9_]*")
# Pure constructors and arithmetic: all an expression template may call.
_SAFE_BUILTINS = {f.__name__: f for f in (abs, bool, complex, dict, float, frozenset, int, len, list,
                                           max, min, round, set, str, tuple)}


def safe_eval(s: str, expr: str = "{}") -> Any:
    """Evaluate ``expr`` with ``s`` put in its ``{}``, where ``s`` may come from data.

    ``s`` must be letters, digits and underscores (else ValueError), so it can
    only add a number or a name to the template. The expression sees no module
    globals and only a few pure builtins (``int``, ``float``, ``str``,
    ``tuple``, ...): a name in ``s`` cannot reach ``os``, ``open`` or
    ``__import__``. webdataset evaluates in its module's globals instead.
    """
    if not isinstance(s, str) or not _SAFE_WORD.fullmatch(s):
        raise ValueError(f"safe_eval: {s!r} may only hold letters, digits and underscores")
    if "__" in s:
        raise ValueError(f"safe_eval: {s!r} may not hold a double underscore")
    return eval(expr.format(s), {"__builtins__": _SAFE_BUILTINS}, {})  # noqa: S307 (restricted above)
