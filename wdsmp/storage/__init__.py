"""Where shard bytes come from and go to, below :mod:`wdsmp.gopen`.

``remote`` reads ``http(s)://`` objects as resumable streams and holds the upload protocol;
``s3`` does the same for ``s3://`` through boto3; ``cacheentry`` keeps the shard cache's files
on disk (locks, claims, eviction) under :class:`wdsmp.cache.FileCache`. gopen dispatches to them,
so every opener a user patches in ``gopen.gopen_schemes`` still sits in front.
"""
