"""Exact epochs: who reads which sample, and the readers that follow that plan.

``plan`` computes an epoch's plan (shard order or global order, budgets, resume and elastic
positions) for every rank and stream; ``counts`` finds each shard's sample count and byte
spans (the count cache); ``spans`` reads one sample by its span; ``ranges`` reads a plan's
shard ranges and applies the buffer shuffle; ``exact`` is ``ExactSamples``, the reference
path's exact, resumable epochs. FastLoader's workers and ``ExactSamples`` both read through
these modules, so both keep the same promise: every sample once per epoch.
"""
