"""The building blocks of pipeline stages, which :mod:`wdsmp.filters` re-exports under webdataset's names.

``base`` is what every stage is made of: currying (``pipelinefilter``) and the error protocol a
stage follows when a sample is refused (NOTE [stage errors]); ``batching`` holds collation and
its inverse; ``fields`` the stages that address fields by name (``to_tuple``, ``rename``,
``xdecode``). The tar readers, the shard stages and both loaders build on ``base``.
"""
