"""Chooses between the compiled core and its pure-Python twins.

The choice is made per call, so ``WDSMP_PUREPYTHON`` can be flipped at run
time and tests can run both. Falling back because an extension is not built
is never silent: it warns once per process and extension.

The JPEG region decoder is an optional extra, not part of the core: it needs
libjpeg-turbo at build time, and without it FastLoader decodes whole JPEGs
(:func:`jpeg_region_available` tells which).
"""

import importlib
import warnings
from types import ModuleType
from typing import Any, List, NamedTuple, Optional, Type

from .._internal import env
from . import tarsplit_py

__all__ = [
    "NativePart",
    "imgops_module",
    "jpeg_region_available",
    "jpeg_region_module",
    "native_available",
    "pil_image_module",
    "tar_headers_class",
    "tar_splitter_class",
    "tar_stream_headers_class",
]

# The compiled modules of the native core; each has a pure-Python twin.
_EXTENSIONS = ("_tarsplit", "_imgops", "_pilimage")

_NOT_BUILT = {
    # name -> what a missing build means, for the warning
    "_jpegregion": "wdsmp's JPEG region decoder is not built ({exn}); FastLoader decodes whole JPEGs "
                   "with simplejpeg instead, which is slower. Reinstall wdsmp where libjpeg-turbo 2.1+ "
                   "and its headers are installed (e.g. libjpeg-turbo8-dev or libjpeg62-turbo-dev) to get it.",
}
_NOT_BUILT_CORE = ("wdsmp's native core is not built ({exn}); using the slower pure-Python twin. "
                   "Reinstall wdsmp with a C compiler to get it.")

_loaded: dict = {}  # name -> the module, or None when it is not built (a build does not appear mid-run)
_missing: dict = {}  # name -> why it is not built (the ImportError's message)


def _compiled(name: str) -> Any:
    """The compiled module ``wdsmp.<name>``, or None (with a one-time warning) when it is not built."""
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(f"{__package__}.{name}")
        except ImportError as exn:
            _loaded[name] = None
            _missing[name] = str(exn)
            warnings.warn(_NOT_BUILT.get(name, _NOT_BUILT_CORE).format(exn=exn), RuntimeWarning, stacklevel=3)
    return _loaded[name]


def native_available() -> bool:
    """True when the native core is what wdsmp uses now (every extension built,
    and not disabled with ``WDSMP_PUREPYTHON=1``)."""
    return not env.pure_python() and all(_compiled(name) is not None for name in _EXTENSIONS)


def tar_splitter_class() -> Type[tarsplit_py.TarSplitter]:
    """The ``TarSplitter`` class in use now: native, or the twin."""
    if not env.pure_python():
        compiled = _compiled("_tarsplit")
        if compiled is not None:
            return compiled.TarSplitter
    return tarsplit_py.TarSplitter


def tar_headers_class() -> Type[tarsplit_py.TarHeaders]:
    """The ``TarHeaders`` class in use now (a tar file's members from their headers alone,
    data skipped by offset): native, or the twin."""
    if not env.pure_python():
        compiled = _compiled("_tarsplit")
        if compiled is not None:
            return compiled.TarHeaders
    return tarsplit_py.TarHeaders


def tar_stream_headers_class() -> Type[tarsplit_py.TarStreamHeaders]:
    """The ``TarStreamHeaders`` class in use now (a tar stream's members from their headers, the
    data read and dropped: for a gzip-compressed shard, which has no offsets to jump to): native,
    or the twin."""
    if not env.pure_python():
        compiled = _compiled("_tarsplit")
        if compiled is not None:
            return compiled.TarStreamHeaders
    return tarsplit_py.TarStreamHeaders


def imgops_module() -> ModuleType:
    """The image kernel module in use now (``crop_resize_flip``): native, or the twin."""
    if not env.pure_python():
        compiled = _compiled("_imgops")
        if compiled is not None:
            return compiled
    from . import imgops_py

    return imgops_py


def pil_image_module() -> ModuleType:
    """The module in use now that makes Pillow images of decoded pixels (``pil_image``): native,
    over the pixels' own memory, or the twin, which copies them."""
    if not env.pure_python():
        compiled = _compiled("_pilimage")
        if compiled is not None:
            return compiled
    from . import pilimage_py

    return pilimage_py


def jpeg_region_module() -> Optional[ModuleType]:
    """The JPEG region decoder (``decode_region``, src/ext/_jpegregion.pyx), or None.

    None when ``WDSMP_PUREPYTHON=1`` or when it is not built (wdsmp was built
    without libjpeg-turbo's headers: a one-time warning says so); FastLoader
    then decodes whole JPEGs with simplejpeg. It has no pure-Python twin and is
    not part of :func:`native_available`'s native core. ``decode("pil")`` images of JPEGs
    then decode whole, never a crop's region alone (``wdsmp/images/lazyjpeg.py``).
    """
    if env.pure_python():
        return None
    return _compiled("_jpegregion")


def jpeg_region_available() -> bool:
    """True when FastLoader decodes only the region of a JPEG that its crop needs
    (:func:`jpeg_region_module` is not None)."""
    return jpeg_region_module() is not None


class NativePart(NamedTuple):
    """One compiled part, as :func:`parts` reports it."""

    name: str  # the module, e.g. "wdsmp.native._tarsplit"
    does: str  # what it is for
    state: str  # "in use", "off" (WDSMP_PUREPYTHON=1) or "not built"
    detail: str  # the file it was loaded from, or why it is not in use and what that costs


_PARTS = {
    "_tarsplit": ("the tar splitter", "the pure-Python twin splits tar files instead, several times slower"),
    "_imgops": ("FastLoader's crop, resize and flip kernel", "the pure-Python twin resizes instead, much slower"),
    "_pilimage": ("the Pillow image over decoded pixels, shared without a copy",
                  "the pure-Python twin copies the pixels into each image instead"),
    "_jpegregion": ("FastLoader's JPEG region decoder (libjpeg-turbo)",
                    "FastLoader decodes whole JPEGs with simplejpeg instead, slower "
                    "(docs/installing.md: Region decoding)"),
}


def parts() -> List[NativePart]:
    """Each compiled part and whether it is in use now, with the file or the reason (for
    ``wdsmp doctor``): not built (the import error), or turned off by ``WDSMP_PUREPYTHON=1``."""
    result: List[NativePart] = []
    for name, (does, cost) in _PARTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the reason is reported here instead
            module = _compiled(name)
        if module is None:
            result.append(NativePart(f"{__package__}.{name}", does, "not built", f"{_missing.get(name)}: {cost}"))
        elif env.pure_python():
            result.append(NativePart(f"{__package__}.{name}", does, "off", f"WDSMP_PUREPYTHON=1: {cost}"))
        else:
            result.append(NativePart(f"{__package__}.{name}", does, "in use", module.__file__))
    return result
