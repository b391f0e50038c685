"""Measurement, kept out of the modules a training run imports.

``loader`` is the loader benchmark (FastLoader against the DataLoader pipeline on a generated
corpus, with the decode-only ceiling); ``plot`` draws its rounds; ``coldstart`` times a fresh
process's first batches; ``shards`` is ``wdsmp bench SHARDS``, FastLoader on your own shards
at several worker counts. Used by ``benchmarks/`` and the ``wdsmp bench`` command.
"""
