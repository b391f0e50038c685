"""Chooses between the compiled core and its pure-Python twins.

The choice is made per call, so ``WDSMP_PUREPYTHON`` can be flipped at run
time and tests can run both. Falling back because the extension is not built
is never silent: it warns once per process.
"""

import warnings

from . import _env, _tarsplit_py

__all__ = ["native_available", "tar_splitter_class"]

_warned = False


def _compiled():
    """The compiled module, or None (with a one-time warning) when it is not built."""
    global _warned
    try:
        from . import _tarsplit
    except ImportError as exn:
        if not _warned:
            _warned = True
            warnings.warn(
                f"wdsmp's native core is not built ({exn}); using the slower pure-Python "
                "twin. Reinstall wdsmp with a C compiler to get it.",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    return _tarsplit


def native_available():
    """True when the native core is what wdsmp uses now (built, and not disabled
    with ``WDSMP_PUREPYTHON=1``)."""
    return not _env.pure_python() and _compiled() is not None


def tar_splitter_class():
    """The ``TarSplitter`` class in use now: native, or the twin."""
    if not _env.pure_python():
        compiled = _compiled()
        if compiled is not None:
            return compiled.TarSplitter
    return _tarsplit_py.TarSplitter
