"""Shard specs to URL lists: ``::`` lists, ``${name}`` variables, braces and local globs.

Every part of wdsmp that takes a shard spec (the shard sources, the fluid
API, the command line) expands it here, so a spec means the same everywhere.
"""

import glob
import os
import re
from itertools import islice
from typing import Any, List

from .._internal import env
from .._internal.braces import expand_braces
from ..gopen import local_path
from ..utils import is_iterable

__all__ = ["envlookup", "envsubst", "expand_source", "expand_urls"]

# "::" separates shard specs, except inside [...] (an IPv6 host such as [::1]).
_LIST_SEPARATOR = re.compile(r"::(?![^\[]*\])")
_VARIABLE = re.compile(r"\$\{(\w+)\}")


def envlookup(m: "re.Match[str]") -> str:  # webdataset's parameter name
    """The value of ``WDS_<name>`` for a ``${name}`` regex match ``m``; ValueError when it is unset."""
    value = env.wds_variable(m.group(1))
    if value is None:
        raise ValueError(f"shard spec uses ${{{m.group(1)}}} but WDS_{m.group(1)} is not set")
    return value


def envsubst(s: str) -> str:  # webdataset's parameter name
    """Replace ``${name}`` in the spec ``s`` with the environment variable ``WDS_name`` (webdataset's rule)."""
    for _ in range(10):  # values may name further variables; bounded, so no cycles
        expanded = _VARIABLE.sub(envlookup, s)
        if expanded == s:
            break
        s = expanded
    return s


def _globbed(url: str) -> List[str]:
    """A local glob pattern becomes the sorted files it matches; anything else stays. Not in
    secure mode, which refuses local files: this machine's files are not listed for a spec
    that may come from anywhere."""
    if "{" in url or local_path(url) != url or not glob.has_magic(url) or os.path.exists(url) or env.secure():
        return [url]  # a URL with a scheme, an escaped brace, or a literal file name
    matches = sorted(glob.glob(url))
    if not matches:
        raise ValueError(f"shard pattern {url!r} matches no files")
    return matches


def _untrusted(spec: str) -> str:
    """``spec`` unchanged, unless it names a variable: a spec from a remote document may not
    read this machine's environment (its value would go out in the URLs fetched)."""
    match = _VARIABLE.search(spec)
    if match is not None:
        raise ValueError(f"shard spec uses ${{{match.group(1)}}}, but a spec read from a remote document in "
                         f"secure mode may not take values from the environment")
    return spec


def expand_urls(urls: Any, trusted: bool = True) -> List[str]:
    """A shard spec to a list of URLs.

    A string is split at ``::``, gets ``${name}`` replaced by ``WDS_name`` and
    is brace-expanded (``"a-{000..009}.tar::b-{0..3}.tar"``); each element of a
    list is brace-expanded. Local paths with ``*``, ``?`` or ``[...]`` are then
    globbed, sorted, except in secure mode (``WDS_SECURE=1``), where gopen
    refuses local files anyway; a pattern matching nothing is a ValueError.

    ``trusted=False`` is for specs from a remote document in secure mode: a
    ``${name}`` is a ValueError, so the environment's values stay here.
    """
    substitute = envsubst if trusted else _untrusted
    if isinstance(urls, (str, os.PathLike)):
        specs = [substitute(s) for s in _LIST_SEPARATOR.split(os.fspath(urls))]
    else:
        specs = [os.fspath(u) if isinstance(u, os.PathLike) else u for u in urls]
    result = []
    for spec in specs:
        if not isinstance(spec, str):
            raise TypeError(f"shard URLs must be strings, not {type(spec).__name__}: {spec!r}")
        if not trusted:
            substitute(spec)
        for url in expand_braces(spec, "shard spec"):
            result.extend(_globbed(url))
    return result


def expand_source(source: Any, max_urls: int = int(1e9)) -> List[str]:
    """A spec (string or list, see ``expand_urls``) or any iterable of URLs to a list."""
    if isinstance(source, (str, os.PathLike, list, tuple)):
        return expand_urls(source)
    if is_iterable(source):
        return expand_urls(list(islice(source, max_urls)))
    raise TypeError(f"cannot make shard URLs from {type(source).__name__}: {source!r}")
