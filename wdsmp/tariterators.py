"""Tar shards to samples, by WebDataset's rules.

``url_opener`` opens each shard URL, ``tar_file_expander`` splits it into
members (with the native splitter or its twin), ``group_by_keys`` groups
consecutive members sharing a key into one sample dict. Between shards the
expander emits a boundary marker, so a sample never spans two shards, and a
shard that fails midway never leaks a half-built sample downstream.

Stricter than webdataset, by design: a field that appears twice in one sample
and a key that reappears after its sample ended (interleaved members) are
``SampleError``s, not silently merged or split samples.
"""

import gzip
import importlib
import io
import random
import re
import sys
import zlib
from typing import IO, Any, Callable, Collection, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Union

from .gopen import local_path
from .formats import tar as _tf
from .errors import SampleError, TarFormatError
from .stages.base import handle_each, pipelinefilter
from .handlers import reraise_exception
from .native.core import tar_splitter_class, tar_stream_headers_class
from .shards.urls import expand_urls

# The gopen module, as webdataset's ``tariterators.gopen`` is, its ``gopen`` looked up at each
# call (``from . import gopen`` would give the package's attribute of that name: the function).
gopen = importlib.import_module(".gopen", __package__)

__all__ = [
    "SHARD_END",
    "SHARD_FAILED",
    "ShardFailed",
    "base_plus_ext",
    "valid_sample",
    "url_opener",
    "tar_file_iterator",
    "tar_file_expander",
    "tar_member_names",
    "group_by_keys",
    "sample_count",
    "sample_spans",
    "tarfile_samples",
    "tarfile_to_samples",
    "meta_prefix",
    "meta_suffix",
    "shardlist",
    "trace",
]

trace = False  # debugging switch (webdataset's): True makes group_by_keys print each member to stderr

meta_prefix = "__"
meta_suffix = "__"

_META_FILES = r"__[^/]*__($|/)"


class _Boundary:
    """A marker between shards in the member stream (never a sample)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> Any:
        return self.name  # unpickles to the module-level singleton


class ShardFailed(_Boundary):
    """The marker after a shard that broke midway; ``member`` names the damaged
    member when the error knows it, so the sample before it can still be kept."""

    def __init__(self, member: Optional[str] = None) -> None:
        super().__init__("SHARD_FAILED")
        self.member = member

    def __reduce__(self) -> Any:
        return (ShardFailed, (self.member,))


SHARD_END = _Boundary("SHARD_END")
SHARD_FAILED = ShardFailed()


def base_plus_ext(path: str) -> Tuple[Optional[str], Optional[str]]:
    """Split a member path into (key, extension) at the first dot of its basename.

    ``"a/b.c/img.seg.png"`` -> ``("a/b.c/img", "seg.png")``; a name without a
    dot gives ``(None, None)`` and is not part of any sample.
    """
    slash = path.rfind("/") + 1
    dot = path.find(".", slash)
    if dot <= slash:
        return None, None
    return path[:dot], path[dot + 1:]


def valid_sample(sample: Any) -> bool:
    """A sample worth yielding: a non-empty dict not marked ``__bad__``."""
    return isinstance(sample, dict) and len(sample) > 0 and not sample.get("__bad__", False)


def shardlist(urls: Union[str, Iterable[str]], *, shuffle: bool = False) -> Iterator[Dict[str, str]]:
    """Shard URLs as ``{"url": ...}`` dicts, the simplest source.

    A string is a shard spec (braces, ``::``, ``${name}``, see ``expand_urls``).
    ``shuffle=True`` uses the ``random`` module, so ``random.seed`` fixes the order.
    """
    urls = expand_urls(urls) if isinstance(urls, str) else list(urls)
    if shuffle:
        random.shuffle(urls)
    for url in urls:
        yield {"url": url}


def url_opener(data: Iterable[Union[str, Mapping[str, Any]]], handler: Callable[[Exception], Any] = reraise_exception,
               opener: Optional[Callable[..., Any]] = None, local_paths: bool = False,
               **kw: Any) -> Iterator[Dict[str, Any]]:
    """For each ``{"url": ...}`` (or URL string), add a ``stream`` opened by ``opener(url, **kw)``
    (default: ``wdsmp.gopen.gopen``, looked up for each URL).

    ``local_paths=True`` also adds ``local_path`` for a local file, which
    ``tar_file_expander`` passes on to its members as ``__local_path__``:
    webdataset's ``WebDataset`` opener and ``FileCache`` do, its ``url_opener``
    (hence ``tarfile_to_samples``) does not.
    """

    def opened(sample: Union[str, Mapping[str, Any]]) -> Iterator[Dict[str, Any]]:
        if isinstance(sample, str):
            sample = {"url": sample}
        url = sample["url"]
        sample = dict(sample, stream=(opener or gopen.gopen)(url, **kw))
        path = local_path(url) if local_paths else None
        if path is not None:
            sample.setdefault("local_path", path)
        yield sample

    yield from handle_each(data, opened, handler)


class _Prefixed(io.RawIOBase):
    """A stream with bytes already read from it put back in front."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self.head = head
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        readinto = getattr(self.stream, "readinto", None)
        if readinto is not None:
            return readinto(buffer) or 0
        chunk = self.stream.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _read_upto(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = stream.read(n - len(data))
        if not more:
            break
        data += more
    return data


def _decompressed(stream: Any) -> Any:
    """The tar stream inside ``stream``: gzip is recognised by its magic, not its name."""
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek is not None else b""
    if len(head) < 2:
        head = _read_upto(stream, 2)
        stream = _Prefixed(head, stream)
    if head == _tf.GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return stream


def _members(stream: Any, url: Optional[str], max_member_size: Optional[int] = None,
             headers_only: bool = False) -> Iterator[Tuple[str, Optional[bytes], int, Optional[str]]]:
    """``(name, data, offset, link)`` of each member with data, then the stream read to its end;
    ``link`` is the member a link member was resolved to, else None (NOTE [tar links] in
    ``wdsmp.formats.tar``). ``headers_only``: ``data`` is None, the data dropped as it is read.

    Reading past the end-of-archive marker to end of file is what checks a
    ``pipe:`` command's exit status and a gzip stream's CRC; stream errors
    become TarFormatErrors naming the shard.
    """
    splitter = None
    offset: Optional[int]  # a member's; in the except clause, the cut member's (None: not known)
    try:
        tar = _decompressed(stream)
        splitter = (tar_stream_headers_class() if headers_only else tar_splitter_class())(
            tar, url, max_member_size=max_member_size)
        links = splitter.links
        for name, data, offset in splitter:
            yield name, data, offset, links[-1][1] if links and links[-1][2] == offset else None
        while tar.read(1 << 16):
            pass
    except (EOFError, zlib.error, gzip.BadGzipFile) as exn:
        # Named by the member it cut (a cut .tgz): the sample before it is then known whole.
        member, offset = (splitter and splitter.reading) or (None, None)
        raise TarFormatError(f"corrupt gzip stream: {exn}", url, member, offset) from exn


def tar_file_iterator(fileobj: IO[bytes], skip_meta: Optional[str] = _META_FILES,
                      handler: Callable[[Exception], Any] = reraise_exception,
                      select_files: Optional[Callable[[str], Any]] = None,
                      rename_files: Optional[Callable[[str], str]] = None, url: Optional[str] = None,
                      max_member_size: Optional[int] = None) -> Iterator[Dict[str, Any]]:
    """Yield ``{"fname", "data", "__offset__"}`` for each regular member of a tar stream.

    ``select_files(fname)`` keeps a member when true; ``rename_files(fname)``
    renames it. An error ends the stream (a damaged archive cannot be resumed);
    ``handler`` decides whether it is raised. A hard or symbolic link member
    comes with the data of the member it names, and ``"__link__"``: that
    member's name (NOTE [tar links] in ``wdsmp.formats.tar``). A member larger than
    ``max_member_size`` bytes (default: ``WDSMP_MAX_MEMBER_SIZE``, else 1 GiB)
    is a TarFormatError, refused before it is read.
    """
    try:
        for name, data, offset, link in _members(fileobj, url, max_member_size):
            if skip_meta is not None and re.match(skip_meta, name):
                continue
            if rename_files is not None:
                name = rename_files(name)
            if select_files is not None and not select_files(name):
                continue
            member = {"fname": name, "data": data, "__offset__": offset}
            if link is not None:
                member["__link__"] = link
            yield member
    except Exception as exn:
        handler(exn)


def tar_member_names(fileobj: IO[bytes], url: Optional[str] = None,
                     max_member_size: Optional[int] = None) -> Iterator[str]:
    """The name of each member ``tar_file_iterator(fileobj, skip_meta=None)`` yields, in order,
    with its errors (raised: a damaged stream cannot be resumed), from the headers of a tar
    stream, gzip-compressed or not. The data is read, to reach the next header and the gzip
    CRC, but dropped as it goes by, never held: what counts a ``.tar.gz`` shard's samples
    (``epochs.counts``) costs no member's memory, whatever size a member has."""
    for name, _, _, _ in _members(fileobj, url, max_member_size, headers_only=True):
        yield name


def tar_file_expander(data: Iterable[Mapping[str, Any]], handler: Callable[[Exception], Any] = reraise_exception,
                      select_files: Optional[Callable[[str], Any]] = None,
                      rename_files: Optional[Callable[[str], str]] = None, eof_value: Any = None,
                      boundaries: bool = False, max_member_size: Optional[int] = None) -> Iterator[Any]:
    """Members of every shard in ``data`` (dicts with ``url`` and ``stream``).

    ``eof_value``, unless None, follows each shard that ended cleanly
    (webdataset's default is ``{}``, which ``group_by_keys`` takes as the end
    of a shard; wdsmp's is None, the value that code written for webdataset
    passes to have none). With ``boundaries=True`` (as ``tarfile_samples``
    uses it) each shard is followed by ``SHARD_END``, or by a ``ShardFailed``
    marker when it broke midway. ``max_member_size``: see :func:`tar_file_iterator`.
    ``tar_file_iterator`` is this module's attribute at each shard; a replacement is called
    with webdataset's arguments (the stream, ``handler``, ``select_files``, ``rename_files``).
    """

    def members(source: Mapping[str, Any]) -> Iterator[Any]:
        url = source["url"]
        stream = source["stream"]
        path = source.get("local_path")
        iterate = tar_file_iterator
        try:
            own: Dict[str, Any] = {"url": url, "max_member_size": max_member_size} if iterate is _OWN_ITERATOR else {}
            files = iterate(stream, handler=reraise_exception, select_files=select_files, rename_files=rename_files,
                            **own)
            for member in files:
                member["__url__"] = url
                if path is not None:
                    member["__local_path__"] = path
                yield member
        except Exception as exn:
            if boundaries:
                damaged = getattr(exn, "member", None)
                if damaged is not None and rename_files is not None:
                    damaged = rename_files(damaged)
                yield ShardFailed(damaged)
            raise  # to the handler
        finally:
            stream.close()
        if boundaries:
            yield SHARD_END
        if eof_value is not None:
            yield eof_value

    yield from handle_each(data, members, handler)


def _sample_error(problem: str, member: Mapping[str, Any], handler: Optional[Callable[[Exception], Any]]) -> Any:
    exn = SampleError(problem, member.get("__url__"), member["fname"], member.get("__offset__"))
    return (handler or reraise_exception)(exn)


def _complete(sample: Mapping[str, Any], boundary: Any, keys: Callable[[str], Tuple[Any, Any]]) -> bool:
    """Whether a shard's last sample is whole: always at a clean end; after a failure,
    only when the damaged member is known to belong to another sample."""
    if boundary is SHARD_END:
        return True
    damaged = getattr(boundary, "member", None)
    return damaged is not None and keys(damaged)[0] != sample["__key__"]


def group_by_keys(data: Iterable[Any], keys: Callable[[str], Tuple[Any, Any]] = base_plus_ext,
                  lcase: bool = True, suffixes: Optional[Collection[str]] = None,
                  handler: Optional[Callable[[Exception], Any]] = None) -> Iterator[Dict[str, Any]]:
    """Group consecutive members with the same key into sample dicts.

    A sample gets ``__key__``, ``__url__`` (and ``__local_path__`` when the
    members have one) and one entry per extension. It ends when the key
    changes or the shard ends (a boundary marker, or an empty dict: webdataset's
    end-of-shard value). A repeated extension, or a key that comes back after its
    sample ended, is a ``SampleError``; if ``handler`` lets the stream go on,
    that whole sample is dropped. ``keys(fname)`` splits a member name into
    (key, extension); a key of None skips the member.
    """
    current: Any = None  # the sample being grouped
    closed: Set[str] = set()
    shard = None
    tracing = trace  # read once per stream, as a switch set before iterating
    for member in data:
        if isinstance(member, dict) and not member:
            member = SHARD_END
        if isinstance(member, _Boundary):
            if valid_sample(current) and _complete(current, member, keys):
                yield current
            current, shard = None, None
            closed.clear()
            continue
        prefix, suffix = keys(member["fname"])
        if tracing:
            print(f"group_by_keys: {prefix!r} {suffix!r} -> {sorted(current) if current else None}",
                  file=sys.stderr)
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        url = member.get("__url__")
        if url != shard:  # members from an expander without boundary markers
            if valid_sample(current):
                yield current
            current, shard = None, url
            closed.clear()
        if current is not None and prefix != current["__key__"]:
            if valid_sample(current):
                yield current
            closed.add(current["__key__"])
            current = None
        if current is None:
            current = {"__key__": prefix, "__url__": url}
            if "__local_path__" in member:
                current["__local_path__"] = member["__local_path__"]
            if prefix in closed:
                current["__bad__"] = True
                problem = f"key {prefix!r} reappears after its sample ended (interleaved members)"
                if not _sample_error(problem, member, handler):
                    return
        if suffix in current and not current.get("__bad__"):
            current["__bad__"] = True
            problem = f"duplicate field {suffix!r} in sample {prefix!r}"
            if not _sample_error(problem, member, handler):
                return
        if suffixes is None or suffix in suffixes:
            current[suffix] = member["data"]
    if valid_sample(current):
        yield current


def sample_count(names: Iterable[str], boundary: _Boundary = SHARD_END,
                 keys: Callable[[str], Tuple[Any, Any]] = base_plus_ext) -> int:
    """How many samples ``tarfile_samples`` makes of a local shard whose regular members are
    named ``names``, in order, ending with ``boundary`` (``SHARD_END``, or the ``ShardFailed``
    marker of a shard that broke there): the count that makes an epoch exact without reading
    any member's data. The rules are ``sample_spans``'."""
    return len(sample_spans(((name, 0, 0) for name in names), boundary, keys))


def sample_spans(members: Iterable[Tuple[str, int, int]], boundary: _Boundary = SHARD_END,
                 keys: Callable[[str], Tuple[Any, Any]] = base_plus_ext) -> List[Tuple[int, int]]:
    """The byte span ``(start, end)`` of each sample ``tarfile_samples`` makes of a local shard
    whose regular members are ``members``, ``(name, start, end)`` triples in order (``start``
    where the member's headers begin, ``end`` where its padded data ends), ending with
    ``boundary`` (``SHARD_END``, or the ``ShardFailed`` marker of a shard that broke there).
    Reading a span alone gives that sample (what a global shuffle reads, ``wdsmp/epochs/spans.py``).

    The reader's own rules, applied to the names alone: meta files skipped as
    ``tar_file_iterator`` skips them, names split by ``keys`` (``base_plus_ext``) and
    extensions lowercased as in ``group_by_keys``, one sample per run of members with one key.
    A sample ``group_by_keys`` refuses (its key came back after it ended, a field twice) has no
    span: the reader drops it when the handler goes on (and raises by default); nor has the
    sample a broken shard cut.
    """
    spans, key, fields, closed, bad = [], None, None, set(), False
    start = end = 0
    for name, first, last in members:
        if name.startswith("__") and re.match(_META_FILES, name):
            continue
        prefix, suffix = keys(name)
        if prefix is None:
            continue
        if prefix != key:
            if key is not None:
                if not bad:
                    spans.append((start, end))
                closed.add(key)
            # the keys every sample of a local file has: a field by that name is a duplicate
            key, fields, bad, start = prefix, {"__key__", "__url__"}, prefix in closed, first
        assert fields is not None  # set at the first member of every sample
        suffix = suffix.lower()
        bad = bad or suffix in fields
        fields.add(suffix)
        end = last
    if key is not None and not bad and _complete({"__key__": key}, boundary, keys):
        spans.append((start, end))
    return spans


def tarfile_samples(src: Iterable[Union[str, Mapping[str, Any]]],
                    handler: Callable[[Exception], Any] = reraise_exception,
                    select_files: Optional[Callable[[str], bool]] = None,
                    rename_files: Optional[Callable[[str], str]] = None, max_member_size: Optional[int] = None, *,
                    opener: Optional[Callable[..., Any]] = None) -> Iterator[Dict[str, Any]]:
    """Shard URLs (``{"url": ...}`` dicts or strings) to samples; ``opener(url)`` opens each
    (default: ``gopen.gopen``; or the shard cache's ``FileCache.open``); ``max_member_size``: see
    :func:`tar_file_iterator`.

    ``url_opener``, ``tar_file_expander`` and ``group_by_keys`` are this module's attributes at
    the call, as in webdataset. A replacement is called with webdataset's arguments and its
    end-of-shard convention: ``tar_file_expander`` with ``handler``, ``select_files`` and
    ``rename_files``; for a replaced ``group_by_keys``, wdsmp's expander ends each shard with
    ``{}`` (webdataset's ``eof_value``) instead of its boundary markers.
    """
    streams = (url_opener(src, handler=handler) if opener is None
               else url_opener(src, handler=handler, opener=opener))
    expand, group = tar_file_expander, group_by_keys
    own: Dict[str, Any] = {}
    if expand is _OWN_EXPANDER:  # shards end in webdataset's {} for a replaced grouper, else in markers
        ends: Dict[str, Any] = {"eof_value": {}} if group is not _OWN_GROUPER else {"boundaries": True}
        own = dict(ends, max_member_size=max_member_size)
    members = expand(streams, handler=handler, select_files=select_files, rename_files=rename_files, **own)
    return group(members, handler=handler)


# This module's own stages: one replaced by assignment to the module attribute is told apart
# from them and called as webdataset calls it (it knows nothing of wdsmp's boundary markers).
_OWN_ITERATOR, _OWN_EXPANDER, _OWN_GROUPER = tar_file_iterator, tar_file_expander, group_by_keys


tarfile_to_samples = pipelinefilter(tarfile_samples)
