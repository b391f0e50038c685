"""The one place where wdsmp reads environment variables.

Each variable is read when the function is called, never at import, so a
program (or a test) can change it at run time and a spawned worker sees the
value its parent had when it started the worker.
"""

import os


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def pure_python():
    """``WDSMP_PUREPYTHON=1``: use the pure-Python twins of the native code."""
    return _flag("WDSMP_PUREPYTHON")
