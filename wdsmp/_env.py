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


def _int_var(name):
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _index_pair(index_name, count_name):
    """Two variables naming an index and a count, both set or neither; validated."""
    index, count = _int_var(index_name), _int_var(count_name)
    if index is None or count is None:
        return None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"environment variables {index_name}={index} and {count_name}={count} "
                         f"do not satisfy 0 <= {index_name} < {count_name}")
    return index, count


def rank_world_size():
    """``RANK`` and ``WORLD_SIZE`` (as torchrun sets them); None unless both are set."""
    return _index_pair("RANK", "WORLD_SIZE")


def local_rank():
    """``LOCAL_RANK`` (torchrun's rank within a node); None when unset."""
    return _int_var("LOCAL_RANK")


def worker_num_workers():
    """``WORKER`` and ``NUM_WORKERS`` (webdataset's override of the DataLoader
    worker); None unless both are set."""
    return _index_pair("WORKER", "NUM_WORKERS")


def wds_variable(name):
    """``WDS_<name>``, the value of ``${name}`` in a shard spec; None when unset."""
    return os.environ.get("WDS_" + name)
