"""Shards as lists of URLs: what a dataset is made of, before any sample is read.

``urls`` expands shard specs (``::`` lists, ``${name}`` variables, braces, globs); ``index``
reads and writes shard manifests with their sample counts (``index.json``) and checks a shard
table; ``stages`` splits the stream of shards by node and worker and resamples it;
``multishard`` mixes several datasets from a spec; ``directory`` claims shards from a directory
that producers fill. :mod:`wdsmp.shardlists` is their face for webdataset users; the epoch
plans in :mod:`wdsmp.epochs` start from here.
"""
