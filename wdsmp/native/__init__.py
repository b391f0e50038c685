"""The compiled core and its pure-Python twins.

``core`` chooses, per call, between the extensions built from ``src/ext`` (``_tarsplit``,
``_imgops``, ``_pilimage``, ``_jpegregion``) and the twins beside them (``tarsplit_py``,
``imgops_py``, ``pilimage_py``), which do the same work in Python and numpy. The tar readers of
both loaders and FastLoader's image kernels get their implementation here; ``WDSMP_PUREPYTHON=1``
selects the twins, and ``wdsmp doctor`` reports which is in use.
"""
