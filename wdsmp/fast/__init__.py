"""FastLoader: a multiprocess shared-memory loader built on wdsmp's stages.

``loader.py`` is the front end; ``delivery.py``, ``layout.py``, ``ring.py``, ``messages.py``,
``plan.py``, ``worker.py``, ``pool.py``, ``imagedecode.py`` and
``transfer.py`` are its parts, one idea each.
"""
