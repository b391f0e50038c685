"""Sample sources that are not plain tar shards, and caches of samples.

``specs`` builds datasets from YAML or JSON specifications that mix several shard collections;
``cbors`` reads files of concatenated CBOR or MsgPack items; ``dbcache`` keeps the first samples
of any iterable in SQLite (``DBCache``). Reached through :mod:`wdsmp` and :mod:`wdsmp.compat`.
"""
