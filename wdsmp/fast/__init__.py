"""FastLoader: a multiprocess shared-memory loader built on wdsmp's stages.

``loader.py`` is the front end; ``delivery.py``, ``layout.py``, ``ring.py``, ``messages.py``,
``worker.py``, ``pool.py``, ``imagedecode.py`` and ``transfer.py`` are its parts, one idea
each. The epoch plan it follows (``wdsmp/epochplan.py``) and the range reader
(``wdsmp/ranges.py``) serve the reference path's ``ExactSamples`` too, so they live below both.
"""

from .loader import Batch, FastLoader

__all__ = ["Batch", "FastLoader"]
