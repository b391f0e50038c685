"""The one place where wdsmp reads environment variables.

Each variable is read when the function is called, never at import, so a
program (or a test) can change it at run time and a spawned worker sees the
value its parent had when it started the worker.
"""

import os
from typing import FrozenSet, List, Optional, Tuple


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def allow_obsolete() -> bool:
    """``ALLOW_OBSOLETE=1``: let functions marked ``@obsolete`` run (webdataset's name)."""
    return _flag("ALLOW_OBSOLETE")


def pure_python() -> bool:
    """``WDSMP_PUREPYTHON=1``: use the pure-Python twins of the native code."""
    return _flag("WDSMP_PUREPYTHON")


def _int_var(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _index_pair(index_name: str, count_name: str) -> Optional[Tuple[int, int]]:
    """Two variables naming an index and a count, both set or neither; validated."""
    index, count = _int_var(index_name), _int_var(count_name)
    if index is None or count is None:
        return None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"environment variables {index_name}={index} and {count_name}={count} "
                         f"do not satisfy 0 <= {index_name} < {count_name}")
    return index, count


def rank_world_size() -> Optional[Tuple[int, int]]:
    """``RANK`` and ``WORLD_SIZE`` (as torchrun sets them); None unless both are set."""
    return _index_pair("RANK", "WORLD_SIZE")


def worker_num_workers() -> Optional[Tuple[int, int]]:
    """``WORKER`` and ``NUM_WORKERS`` (webdataset's override of the DataLoader
    worker); None unless both are set."""
    return _index_pair("WORKER", "NUM_WORKERS")


def max_member_size() -> Optional[int]:
    """``WDSMP_MAX_MEMBER_SIZE``: the most bytes one tar member, or one decompressed ``.gz``
    field, may hold; None when unset."""
    return _positive_int_var("WDSMP_MAX_MEMBER_SIZE")


def max_image_pixels() -> Optional[int]:
    """``WDSMP_MAX_IMAGE_PIXELS``: the most pixels one image may decode to; None when unset."""
    return _positive_int_var("WDSMP_MAX_IMAGE_PIXELS")


def _positive_int_var(name: str) -> Optional[int]:
    value = _int_var(name)
    if value is not None and value < 1:
        raise ValueError(f"environment variable {name}={value} must be positive")
    return value


def wds_variable(name: str) -> Optional[str]:
    """``WDS_<name>``, the value of ``${name}`` in a shard spec; None when unset."""
    return os.environ.get("WDS_" + name)


def secure() -> bool:
    """``WDS_SECURE=1``: refuse ``pipe:`` URLs, local paths, ``file:`` URLs, ``-``, and unsafe decoders."""
    return _flag("WDS_SECURE")


def set_secure(flag: bool) -> None:
    """Set ``WDS_SECURE`` to 1 or 0 (``wdsmp.utils.enforce_security = flag``): for this process,
    and for the worker processes and commands it starts from now on, which inherit it."""
    os.environ["WDS_SECURE"] = "1" if flag else "0"


def rewrite_rules() -> List[Tuple[str, str, str]]:
    """URL rewrite rules ``[(variable, regex, replacement), ...]``, in the order they are tried.

    ``GOPEN_REWRITE`` (webdataset's name) comes first, then ``WDS_REWRITE`` (the
    name a webdataset fork uses); each holds ``regex=replacement`` rules separated
    by ``;``. An empty rule (a stray ``;``) is skipped; a rule without ``=`` is an error.
    """
    rules: List[Tuple[str, str, str]] = []
    for name in ("GOPEN_REWRITE", "WDS_REWRITE"):
        value = os.environ.get(name, "")
        for rule in value.split(";"):
            if not rule.strip():
                continue
            if "=" not in rule:
                raise ValueError(f"environment variable {name}={value!r}: rule {rule!r} is not regex=replacement")
            pattern, replacement = rule.split("=", 1)
            rules.append((name, pattern, replacement))
    return rules


def gopen_verbose() -> bool:
    """``GOPEN_VERBOSE=1``: report URL rewrites and AIS routing on stderr (webdataset's name)."""
    return _flag("GOPEN_VERBOSE")


def ais_schemes() -> FrozenSet[str]:
    """``USE_AIS_FOR``: URL schemes read through AIStore, e.g. ``gs`` or ``gs:s3`` (``:``, ``,`` or spaces)."""
    value = os.environ.get("USE_AIS_FOR", "")
    return frozenset(s.lower() for s in value.replace(",", " ").replace(":", " ").split())


def ais_endpoint() -> Optional[str]:
    """``AIS_ENDPOINT``: the AIStore gateway, ``http://host:port``; None when unset or empty."""
    value = os.environ.get("AIS_ENDPOINT", "").strip()
    return value.rstrip("/") or None


def http_proxy(scheme: str, host: str) -> Optional[str]:
    """The proxy for an ``http``/``https`` request to ``host``, from the variables curl reads
    (as webdataset reads http through curl): ``https_proxy`` or ``http_proxy`` (by the scheme),
    else ``all_proxy``, an ``http://`` proxy when it names no scheme; None when none is set or
    ``no_proxy`` lists the host. Upper-case names count too, as in Python's urllib."""
    import urllib.request  # here: not a cost of importing wdsmp

    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme.lower()) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]  # not in typeshed
        return None
    return proxy if "://" in proxy else "http://" + proxy  # curl's default scheme for a proxy


def aws_environment() -> Tuple[Tuple[str, str], ...]:
    """The ``AWS_*`` variables as sorted pairs: boto3 reads them itself, wdsmp keys its client cache on them."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))


def cache_dir() -> Optional[str]:
    """``WDS_CACHE``: the shard cache directory used when none is given; None when unset."""
    return os.environ.get("WDS_CACHE") or None


def cache_size() -> Optional[int]:
    """``WDS_CACHE_SIZE``: the shard cache's size cap in bytes (``inf``: no cap, as unset); None
    when unset. A negative or NaN value is an error: it would cache nothing, warning per shard."""
    value = os.environ.get("WDS_CACHE_SIZE")
    if value is None or not value.strip():
        return None
    try:
        size = float(value)
    except ValueError:
        raise ValueError(f"environment variable WDS_CACHE_SIZE={value!r} is not a number") from None
    if not size >= 0:
        raise ValueError(f"environment variable WDS_CACHE_SIZE={value!r} must be a number of bytes >= 0 "
                         f"(0 turns caching off; unset it for no cap)")
    return None if size == float("inf") else int(size)


def verbose_cache() -> bool:
    """``WDS_VERBOSE_CACHE=1``: say what the shard cache does, on stderr."""
    return _flag("WDS_VERBOSE_CACHE")


def user_cache_dir() -> str:
    """The user's cache directory for wdsmp: ``$XDG_CACHE_HOME/wdsmp``, else ``~/.cache/wdsmp``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wdsmp")
