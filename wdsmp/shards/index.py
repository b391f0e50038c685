"""Shard manifests: a JSON file listing shards with their sample counts.

Sample counts are what make exact epochs possible: with them a loader knows
``len()``, splits shards between ranks at sample granularity and gives every
rank the same number of batches. The format::

    {"shards": [{"url": "train-000000.tar", "samples": 1000, ...}, ...], ...}

Other keys (``size``, ``sha256``, anything at the top level) are kept for
whoever wrote them. A relative ``url`` is relative to the manifest itself:
its directory for a local file, its URL for a remote one, so a manifest can
travel with its shards. Its documented place is beside the shards, named
``index.json`` (``INDEX_NAME``): ``ShardWriter(index=True)`` and ``wdsmp
index`` write it there, and the loaders look for it there when remote shards
come without counts (``index_beside``).
"""

import json
import os
import posixpath
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union, cast
from urllib.parse import urlsplit, urlunsplit

from .._internal.atomic import atomic_write
from .urls import expand_urls  # not through shardlists, which imports torch.utils.data
from .._internal.validation import count as count_of, is_int
from ..gopen import gopen, local_path

__all__ = ["INDEX_NAME", "index_beside", "is_index", "read_entries", "read_index", "relative_url", "resolve_url",
           "shard_counts", "shard_table", "write_atomic", "write_index"]

INDEX_NAME = "index.json"  # the shard index beside the shards it lists


def is_index(urls: Any) -> bool:
    """Whether a loader's ``urls`` argument names a shard index: a string whose path ends in
    ``.json``, a query string or fragment after it not counted (a presigned URL such as
    ``https://host/train/index.json?X-Amz-Signature=...``)."""
    if not isinstance(urls, str):
        return False
    path = urls if local_path(urls) is not None else urlsplit(urls).path
    return path.endswith(".json")


def index_beside(url: str) -> Optional[str]:
    """The URL of the shard index beside the remote shard ``url`` (``INDEX_NAME`` in its
    directory, without the shard's query string); None for what has no directory to look in
    (a local file, ``pipe:``, ``-``)."""
    parts = urlsplit(url)
    if local_path(url) is not None or parts.scheme == "pipe" or not parts.netloc:
        return None
    directory = posixpath.dirname(parts.path)
    return urlunsplit(parts._replace(path=posixpath.join(directory or "/", INDEX_NAME), query="", fragment=""))


def resolve_url(base: str, url: str) -> str:
    """``url`` made absolute against the manifest at ``base`` (a path or a URL)."""
    if "://" in url or url.startswith(("pipe:", "/")) or url == "-":
        return url
    path = local_path(base)
    if path is not None:
        return os.path.join(os.path.dirname(path), url)
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=posixpath.join(posixpath.dirname(parts.path), url), query=""))


def relative_url(index: str, url: str) -> str:
    """``url`` as the manifest at ``index`` should list it, so that ``resolve_url(index, ...)``
    names the same shard from any working directory: a local file in the manifest's directory
    or below, relative to it (the directory can move as a whole); any other local file, its
    absolute path (a relative path would be read against the manifest's directory); anything
    else (a URL, ``-``) as given."""
    path = local_path(url)
    if path is None:
        return url
    path = os.path.abspath(path)
    base = local_path(index)
    if base is None:
        return path
    relative = os.path.relpath(path, os.path.dirname(os.path.abspath(base)))
    outside = relative == os.pardir or relative.startswith(os.pardir + os.sep)  # not "..x.tar"
    return path if outside else relative


def read_entries(source: str) -> List[Dict[str, Any]]:
    """The entries of the manifest at ``source`` (path or URL, read with gopen): dicts with every
    key the writer put there (``size``, ``sha256``, ...), ``url`` made absolute against ``source``.

    ValueError naming the manifest and the entry when the file is not one.
    """
    with gopen(source, "rb") as stream:
        text = stream.read()
    try:
        index = json.loads(text)
    except ValueError as exn:
        raise ValueError(f"shard index {source!r} is not JSON: {exn}") from exn
    shards = index.get("shards") if isinstance(index, dict) else None
    if not isinstance(shards, list) or not shards:
        raise ValueError(f"shard index {source!r} has no non-empty 'shards' list")
    entries = []
    for i, entry in enumerate(shards):
        url = entry.get("url") if isinstance(entry, dict) else None
        samples = entry.get("samples") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not is_int(samples, 0):
            raise ValueError(f"shard index {source!r}: entry {i} ({entry!r}) needs a 'url' string and a "
                             f"'samples' count >= 0")
        entries.append(dict(entry, url=resolve_url(source, url)))
    return entries


def read_index(source: str) -> List[Tuple[str, int]]:
    """``[(url, samples), ...]`` from a manifest at ``source`` (see :func:`read_entries`)."""
    return [(entry["url"], entry["samples"]) for entry in read_entries(source)]


def write_index(path: str, shards: Iterable[Union[Tuple[str, int], Dict[str, Any]]], **extra: Any) -> None:
    """Write a manifest of ``shards`` (``(url, samples)`` pairs or dicts with more keys) to
    ``path``: a local file, atomically, or any URL gopen writes (HTTP PUT, S3, ...), whole
    at close; ``extra`` keys go to the top level."""
    entries = [dict(entry) if isinstance(entry, dict) else {"url": entry[0], "samples": entry[1]}
               for entry in shards]
    text = json.dumps(dict(extra, shards=entries), indent=1) + "\n"
    if local_path(path) is None:
        with gopen(path, "wb") as stream:
            stream.write(text.encode())
        return
    write_atomic(cast(str, local_path(path)), text)  # a local path: checked above


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to the local file ``path`` (its directory made if missing) through a temp
    beside it, renamed over it at the end: a reader never sees half a manifest or index file,
    and a failure leaves no temp behind."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_write(path) as temp, open(temp, "w") as stream:
        stream.write(text)


def shard_counts(urls: Any, index: Optional[str] = None) -> Sequence[Tuple[str, Optional[int]]]:
    """``[(url, count or None), ...]`` for a loader's ``urls`` argument: a manifest (``.json``),
    a shard spec (brace patterns, ``::`` lists), URLs or ``(url, count)`` pairs; with ``index``
    (a manifest) the counts come from it, and every shard must be in it."""
    if is_index(urls) and index is None:
        return read_index(urls)
    table: Sequence[Tuple[str, Optional[int]]] = shard_table(expand_urls(urls) if isinstance(urls, str) else urls)
    if index is not None:
        counts = dict(read_index(index))
        missing = [url for url, _ in table if resolve_url(index, url) not in counts and url not in counts]
        if missing:
            raise ValueError(f"shard index {index!r} has no sample count for {len(missing)} of the shards, "
                             f"e.g. {missing[0]!r}")
        table = [(url, counts.get(url, counts.get(resolve_url(index, url)))) for url, _ in table]
    return table


def shard_table(shards: Iterable[Union[str, Tuple[str, Optional[int]]]]) -> Tuple[Tuple[str, Optional[int]], ...]:
    """``((url, count or None), ...)`` from URLs or ``(url, count)`` pairs, checked."""
    table = []
    for item in shards:
        try:
            url, count = (item, None) if isinstance(item, str) else item
        except (TypeError, ValueError):
            url = None
        if not isinstance(url, str):
            raise ValueError(f"a shard must be a URL or a (url, count) pair, not {item!r}")
        table.append((url, None if count is None else count_of(count, f"sample count of {url!r}")))
    if not table:
        raise ValueError("at least one shard is needed")
    return tuple(table)
