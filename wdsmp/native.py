"""Chooses between the compiled core and its pure-Python twins.

The choice is made per call, so ``WDSMP_PUREPYTHON`` can be flipped at run
time and tests can run both. Falling back because an extension is not built
is never silent: it warns once per process and extension.
"""

import importlib
import warnings

from . import _env, _tarsplit_py

__all__ = ["imgops_module", "native_available", "tar_splitter_class"]

# The compiled modules of the native core; each has a pure-Python twin.
_EXTENSIONS = ("_tarsplit", "_imgops")

_loaded = {}  # name -> the module, or None when it is not built (a build does not appear mid-run)


def _compiled(name):
    """The compiled module ``wdsmp.<name>``, or None (with a one-time warning) when it is not built."""
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(f"{__package__}.{name}")
        except ImportError as exn:
            _loaded[name] = None
            warnings.warn(
                f"wdsmp's native core is not built ({exn}); using the slower pure-Python "
                "twin. Reinstall wdsmp with a C compiler to get it.",
                RuntimeWarning,
                stacklevel=3,
            )
    return _loaded[name]


def native_available():
    """True when the native core is what wdsmp uses now (every extension built,
    and not disabled with ``WDSMP_PUREPYTHON=1``)."""
    return not _env.pure_python() and all(_compiled(name) is not None for name in _EXTENSIONS)


def tar_splitter_class():
    """The ``TarSplitter`` class in use now: native, or the twin."""
    if not _env.pure_python():
        compiled = _compiled("_tarsplit")
        if compiled is not None:
            return compiled.TarSplitter
    return _tarsplit_py.TarSplitter


def imgops_module():
    """The image kernel module in use now (``crop_resize_flip``): native, or the twin."""
    if not _env.pure_python():
        compiled = _compiled("_imgops")
        if compiled is not None:
            return compiled
    from .fast import _imgops_py

    return _imgops_py
