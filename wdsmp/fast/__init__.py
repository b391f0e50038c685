"""FastLoader: a multiprocess shared-memory loader built on wdsmp's stages.

``loader.py`` is the front end; ``delivery.py``, ``layout.py``, ``ring.py``, ``messages.py``,
``worker.py``, ``pool.py``, ``imagedecode.py`` and ``transfer.py`` are its parts, one idea
each. The epoch plan it follows (``wdsmp/epochs/plan.py``) and the range reader
(``wdsmp/epochs/ranges.py``) serve the reference path's ``ExactSamples`` too, so they live below both.

``Batch`` and ``FastLoader`` are imported on first use: the worker processes import
``wdsmp.fast.worker`` and not the front end (NOTE [worker processes] in ``pool.py``).
"""

__all__ = ["Batch", "FastLoader"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
