"""The facts and helpers at the bottom of wdsmp, used by every other package and by both loaders.

``env`` (the one place environment variables are read), ``validation`` (what a count is),
``atomic`` (files that appear whole or not at all), ``braces`` (brace patterns), ``redact``
(URLs in messages without their passwords), ``seeding`` (seeds every process computes alike),
``workerinfo`` (which node and DataLoader worker this is), ``liveness`` (whether a process is
alive), ``sharedint``, ``symbols``, ``deprecation`` and ``timing``. Nothing here imports another
wdsmp package except :mod:`wdsmp.errors`, and nothing imports torch.
"""
