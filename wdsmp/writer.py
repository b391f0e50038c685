"""Writing samples to tar archives: ``TarWriter`` (one archive) and ``ShardWriter`` (a series).

A sample is a dict with a ``__key__`` and one entry per field; field ``"input.jpg"``
of key ``"a/b"`` becomes the tar member ``a/b.input.jpg``. Values are turned
into bytes by extension (see ``encoders``, whose names this module re-exports
as webdataset's ``writer`` does).

Output is deterministic: members in sorted field order, a fixed mtime (0 unless
``mtime=`` says otherwise), uid/gid 0, fixed user and group names, gzip headers
with mtime 0. The same samples always give a byte-identical archive.

Differences from webdataset, all on purpose:

- ``mtime`` defaults to 0, not the current time (determinism).
- Keys that would escape the output directory (``..``, leading ``/``, NUL,
  backslash) and keys with a ``.`` in their last path component are rejected:
  readers split member names at that dot, so such a sample would not read back.
- ``TarWriter.write`` returns the bytes the sample added to the tar stream,
  headers and padding included (webdataset: the payload bytes).
- ``encoder=False`` also takes str (as UTF-8); other values, ints included,
  raise ValueError naming the sample and field.
- ``ShardWriter`` starts a new shard *before* a sample that would push the shard
  past ``maxsize`` (webdataset checks after), and opens its first shard at the
  first write, so an unused writer leaves no empty file behind. Shard names
  pick the compression even with an ``opener``; ``verbose`` defaults to 0 and
  its lines go to stderr.
- An exception that leaves a ``with TarWriter(...)`` or ``with ShardWriter(...)``
  block abandons the archive being written instead of finishing it (NOTE
  [abandoned writes] in :mod:`wdsmp.gopen`): no end-of-archive marker and no
  gzip trailer are written, a local file the writer opened is removed, an
  upload is never sent, a ``pipe:`` command is terminated before its input
  ends, ``post`` is not run for it and ``ShardWriter`` writes no index.
  Shards a ShardWriter finished before stay as they are. Leaving the block
  normally (or ``close()``) writes exactly what it always did.
"""

import gzip
import io
import os
import posixpath
import sys
import tarfile
import time
from typing import IO, Any, Callable, Dict, List, Literal, Optional, Tuple, TypeVar, Union, cast

from .gopen import abandon, gopen
from .formats import encoders
from .formats.encoders import (
    add_handlers,
    bytestr,
    cbor_dumps,
    default_handlers,
    encode_based_on_extension,
    encode_based_on_extension1,
    imageencoder,
    make_handlers,
    mp_dumps,
    numpy_dumps,
    numpy_npz_dumps,
    tenbin_dumps,
    torch_dumps,
)

# The encoders live in their own module; webdataset's writer module exports them too.
__all__ = [
    "ShardWriter",
    "TarWriter",
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]

_W = TypeVar("_W", bound="TarWriter")
_S = TypeVar("_S", bound="ShardWriter")


def make_encoder(spec: Union[bool, None, Dict[str, Callable[[Any], Any]], Callable[..., Any]]) -> Callable[..., Any]:
    """A sample encoder: ``True`` encodes by extension with this module's ``default_handlers``
    as it is at the call (as in webdataset, a table assigned there counts), False/None not at
    all, a dict with those handlers, a callable is the encoder itself."""
    return encoders.make_encoder(default_handlers if spec is True else spec)


def _leaves_cleanly(exn: Optional[BaseException]) -> bool:
    """Whether a ``with`` block that ended with ``exn`` (None: none) finished its writing: it
    ended normally, by ``sys.exit(0)`` (or ``sys.exit()``), or as a generator closed by its
    consumer (``GeneratorExit``: the consumer stopped asking, after whole samples); the archive
    is then finished. Any other exception, ``KeyboardInterrupt`` too (it may come between a
    sample's members), abandons it (NOTE [abandoned writes] in ``gopen.py``)."""
    if exn is None or isinstance(exn, GeneratorExit):
        return True
    return isinstance(exn, SystemExit) and exn.code in (0, None)


# Member names.


def _check_path(name: str, what: str) -> None:
    """Reject names that could write outside the extraction directory."""
    if "\0" in name or "\\" in name:
        raise ValueError(f"{what} {name!r} contains a NUL or a backslash")
    if name.startswith("/"):
        raise ValueError(f"{what} {name!r} is an absolute path")
    if ".." in name.split("/"):
        raise ValueError(f"{what} {name!r} has a '..' path component")


def _check_key(key: Any) -> None:
    if not isinstance(key, str):
        raise ValueError(f"__key__ must be a str, got {type(key).__name__} {key!r}")
    _check_path(key, "__key__")
    base = key.rsplit("/", 1)[-1]
    if not base:
        raise ValueError(f"__key__ {key!r} is empty or ends with '/'")
    if "." in base:
        raise ValueError(
            f"__key__ {key!r} has a '.' in its last path component; readers split "
            "member names at the first dot there, so the sample would not read back"
        )


class _Packer:
    """Sample -> ``[(TarInfo, bytes)]``: TarWriter's settings, without an output stream.

    ShardWriter packs a sample before choosing its shard (it needs the size), so
    this part lives apart from the stream.
    """

    def __init__(self, user: str = "bigdata", group: str = "bigdata", mode: int = 0o0444,
                 encoder: Union[None, bool, Dict[str, Callable[[Any], Any]], Callable[..., Any]] = True,
                 keep_meta: bool = False, mtime: Optional[float] = 0, format: Any = None) -> None:  # noqa: A002
        self.encoder = make_encoder(encoder)
        self.user, self.group, self.mode = user, group, mode
        self.keep_meta = keep_meta
        self.mtime = mtime
        self.format: Any = tarfile.PAX_FORMAT if format is None else getattr(tarfile, str(format), format)
        if self.format not in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            raise ValueError(f"unknown tar format {format!r}; use 'USTAR_FORMAT', 'GNU_FORMAT' or 'PAX_FORMAT'")

    def pack(self, sample: Dict[str, Any]) -> List[Tuple[tarfile.TarInfo, bytes]]:
        if not isinstance(sample, dict):
            raise ValueError(f"a sample must be a dict, got {type(sample).__name__}")
        encoded = self.encoder(sample)
        if not isinstance(encoded, dict) or "__key__" not in encoded:
            raise ValueError(f"sample {sample.get('__key__')!r} has no __key__ (after encoding)")
        key = encoded["__key__"]
        _check_key(key)
        if not all(isinstance(field, str) for field in encoded):
            raise ValueError(f"sample {key!r}: field names must be str, got {list(encoded)}")
        mtime = int(time.time() if self.mtime is None else self.mtime)
        members = []
        for field in sorted(encoded):
            if field == "__key__" or (field.startswith("_") and not self.keep_meta):
                continue
            if not field or "/" in field:
                raise ValueError(f"sample {key!r}: field name {field!r} is empty or contains '/'")
            value = encoded[field]
            if isinstance(value, str):
                value = value.encode("utf-8")
            elif isinstance(value, (bytearray, memoryview)):
                value = bytes(value)
            elif not isinstance(value, bytes):
                raise ValueError(
                    f"sample {key!r}, field {field!r} is {type(value).__name__} after encoding, not bytes "
                    "or str (with encoder=False, encode values yourself: a .cls label as b'3')"
                )
            name = f"{key}.{field}"
            _check_path(name, "member name")
            info = tarfile.TarInfo(name)
            info.size = len(value)
            info.mtime, info.mode = mtime, self.mode
            info.uid = info.gid = 0
            info.uname, info.gname = self.user, self.group
            members.append((info, value))
        return members

    def size(self, members: List[Tuple[tarfile.TarInfo, bytes]]) -> int:
        """Bytes ``members`` take in the (uncompressed) tar stream: headers plus padded data."""
        return sum(len(info.tobuf(self.format, "utf-8", "surrogateescape")) + -(-info.size // 512) * 512
                   for info, _ in members)


_SUFFIX_COMPRESSION = {"gz": "gz", "tgz": "gz", "bz2": "bz2", "xz": "xz"}


def _compression(name: Optional[str], compress: Optional[Union[bool, str]]) -> Optional[str]:
    """None, "gz", "bz2" or "xz": ``compress`` (True means gzip), or when None the name's suffix."""
    if compress is None:
        return _SUFFIX_COMPRESSION.get(name.rsplit(".", 1)[-1].lower()) if name else None
    if compress is True or compress is False:
        return "gz" if compress else None
    if compress not in ("gz", "bz2", "xz"):
        raise ValueError(f"compress must be None, a bool, 'gz', 'bz2' or 'xz', not {compress!r}")
    return compress


class TarWriter:
    """Write samples (dicts) to one tar archive.

    ``fileobj`` is a path or URL (opened with ``gopen(url, "wb")`` and closed by
    ``close()``) or an open binary stream (left open). ``encoder=True`` encodes
    values by extension (see ``make_handlers``); ``encoder=False`` takes bytes or
    str only and raises ValueError for anything else, ints included, so a
    ``.cls`` label is given as ``b"3"`` or ``"3"`` (the encoding the reader
    expects); a dict is a handler table; a callable encodes whole samples.

    ``compress`` is True (gzip), False, ``"gz"``, ``"bz2"`` or ``"xz"``; if None,
    a name ending in ``.tgz``/``.gz``/``.bz2``/``.xz`` picks it. Fields starting with ``_`` are metadata and
    are written only with ``keep_meta=True``. The pax format is used so that long
    and non-ASCII names work; members that need neither get plain ustar headers.
    """

    def __init__(self, fileobj: Any, user: str = "bigdata", group: str = "bigdata", mode: int = 0o0444,
                 compress: Optional[Union[bool, str]] = None,
                 encoder: Union[None, bool, Dict[str, Callable[[Any], Any]], Callable[..., Any]] = True,
                 keep_meta: bool = False, mtime: Optional[float] = 0, format: Any = None) -> None:  # noqa: A002
        self._packer = _Packer(user, group, mode, encoder, keep_meta, mtime, format)
        self._own: Optional[IO[bytes]] = None
        name = os.fspath(fileobj) if isinstance(fileobj, (str, os.PathLike)) else None
        self.compress = _compression(name, compress)
        if name is not None:
            fileobj = self._own = gopen(name, "wb")
        self.stream = fileobj
        # tarfile's own gzip writes the current time into the header: do it ourselves, with mtime 0.
        self._gzip: Optional[gzip.GzipFile] = None
        if self.compress == "gz":
            self._gzip = fileobj = gzip.GzipFile(filename="", mode="wb", fileobj=fileobj, mtime=0)
        tarmode = "w|" if self.compress in (None, "gz") else "w|" + self.compress
        self.tarstream = tarfile.open(fileobj=fileobj, mode=cast(Literal["w|", "w|bz2", "w|xz"], tarmode),
                                      format=self._packer.format, encoding="utf-8", errors="surrogateescape")
        self.closed = False

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if _leaves_cleanly(exc):
            self.close()
        else:
            self.abort()

    def abort(self) -> None:
        """Give the archive up: no end-of-archive marker, no gzip trailer, and a stream this
        writer opened is abandoned (``gopen.abandon``: a local file removed, an upload never
        sent). A stream the caller gave is left open, the archive in it unfinished, so readers
        see it truncated. Idempotent; what ``with`` does on an exception."""
        if self.closed:
            return
        self.closed = True
        # Neither the tar stream nor the gzip layer may finish later, from a finalizer. (Their
        # internal state, which typeshed does not describe: hence Any.)
        tarstream: Any = self.tarstream
        tarstream.closed = True
        tarstream.fileobj.closed = True
        if self._gzip is not None:
            cast(Any, self._gzip).fileobj = None
        if self._own is not None:
            abandon(self._own)

    def close(self) -> None:
        """Finish the archive (end blocks, gzip trailer); close the stream if we opened it. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            self.tarstream.close()
            if self._gzip is not None:
                self._gzip.close()
            if self._own is None and hasattr(self.stream, "flush"):
                self.stream.flush()
        finally:
            if self._own is not None:
                self._own.close()

    def write(self, obj: Dict[str, Any]) -> int:
        """Write one sample; returns the bytes it added to the (uncompressed) tar stream."""
        if self.closed:
            raise ValueError("write to a closed TarWriter")
        return self._add(self._packer.pack(obj))

    def dwrite(self, key: str, **kw: Any) -> int:
        """Write a sample given as keyword arguments: ``dwrite("k", jpg=image, cls=3)``."""
        return self.write(dict(__key__=key, **kw))

    def _add(self, members: List[Tuple[tarfile.TarInfo, bytes]]) -> int:
        start = self.tarstream.offset
        for info, data in members:
            self.tarstream.addfile(info, io.BytesIO(data))
        return self.tarstream.offset - start


def _gopen_for_writing(fname: str) -> IO[bytes]:
    return gopen(fname, "wb")


_TARWRITER_OPTIONS = ("user", "group", "mode", "compress", "encoder", "keep_meta", "mtime", "format")


class ShardWriter:
    """Write samples into a numbered series of tar shards, ``pattern % shard``.

    A shard is closed and the next one started when the next sample would make
    it hold more than ``maxcount`` samples or ``maxsize`` bytes (uncompressed tar
    bytes, headers included); a sample larger than ``maxsize`` gets a shard of
    its own. ``post(fname)`` is called after each shard is closed; ``opener(fname)``
    returns the binary stream to write it to (default: ``gopen(fname, "wb")``);
    other keyword arguments go to ``TarWriter``. ``shards`` lists the names written, ``counts``
    their sample counts. ``index=True`` writes a shard index (``wdsmp.shards.index``) of them at
    ``close()`` beside them, as ``index.json`` in the pattern's directory, where the loaders
    look for it (``index="path.json"``: there instead), so loaders know every count (``len()``,
    exact epochs), remote shards included.

    An exception leaving a ``with`` block (or ``abort()``) abandons the shard being
    written (see :meth:`TarWriter.abort`; the stream is abandoned as ``gopen.abandon``
    says), runs no ``post`` for it and writes no index: an index would list the short
    shard, or a dataset short of what the run meant to write, as complete.
    """

    def __init__(self, pattern: str, maxcount: float = 100000, maxsize: float = 3e9,
                 post: Optional[Callable[[str], Any]] = None, start_shard: int = 0, verbose: int = 0,
                 opener: Optional[Callable[[str], Any]] = None, index: Union[bool, str, None] = None,
                 **kw: Any) -> None:
        try:
            distinct = pattern % 0 != pattern % 1
        except (TypeError, ValueError) as exn:
            raise ValueError(f"ShardWriter pattern {pattern!r} needs one %-format for the shard number") from exn
        if not distinct:
            raise ValueError(f"ShardWriter pattern {pattern!r} does not use the shard number")
        if not maxcount > 0 or not maxsize > 0:
            raise ValueError(f"maxcount and maxsize must be positive, got {maxcount} and {maxsize}")
        for name, value in (("post", post), ("opener", opener)):
            if value is not None and not callable(value):
                raise ValueError(f"{name} must be callable, got {value!r}")
        unknown = sorted(set(kw) - set(_TARWRITER_OPTIONS))
        if unknown:
            raise TypeError(f"ShardWriter got unexpected keyword arguments {unknown}")
        _compression(None, kw.get("compress"))  # fail now, not at the first shard
        self.pattern, self.maxcount, self.maxsize = pattern, maxcount, maxsize
        self.post, self.verbose, self.kw = post, verbose, kw
        self.opener = opener or _gopen_for_writing
        self._packer = _Packer(**{k: v for k, v in kw.items() if k != "compress"})
        self.shard = start_shard
        self.count = self.size = self.total = 0
        self.fname: Optional[str] = None
        self.shards: List[str] = []
        self.counts: List[int] = []
        if index is True:
            from .shards.index import INDEX_NAME

            index = posixpath.join(posixpath.dirname(pattern), INDEX_NAME)
        elif not (index is None or isinstance(index, str)):
            raise ValueError(f"index must be True, a path or URL, or None, not {index!r}")
        self.index = index
        self.tarstream: Optional[TarWriter] = None
        self._stream: Any = None
        self.closed = False

    def next_stream(self) -> None:
        """Close the current shard and open the next one."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose > 0:
            print("# writing", self.fname, self.count, "%.1f GB" % (self.size / 1e9), self.total, file=sys.stderr)
        self.shard += 1
        stream = self.opener(self.fname)
        # The name decides compression even when an opener hands us a stream.
        options = dict(self.kw, compress=_compression(self.fname, self.kw.get("compress")) or False)
        try:
            self.tarstream = TarWriter(stream, **options)
        except BaseException:
            stream.close()
            raise
        self._stream = stream
        self.shards.append(self.fname)
        self.counts.append(0)
        self.count = self.size = 0

    def write(self, obj: Dict[str, Any]) -> int:
        """Write one sample, starting a new shard first if it would not fit; returns its size."""
        if self.closed:
            raise ValueError("write to a closed ShardWriter")
        members = self._packer.pack(obj)
        size = self._packer.size(members)
        if self.tarstream is None or self.count >= self.maxcount or (self.count and self.size + size > self.maxsize):
            self.next_stream()
        written = cast(TarWriter, self.tarstream)._add(members)  # next_stream() opened one if needed
        self.count += 1
        self.counts[-1] += 1
        self.total += 1
        self.size += written
        return written

    def finish(self) -> None:
        """Close the current shard (if any) and run ``post`` on it."""
        if self.tarstream is None:
            return
        try:
            self.tarstream.close()
        finally:
            self.tarstream = None
            stream, self._stream = self._stream, None
            stream.close()
        if self.post is not None:
            self.post(cast(str, self.fname))  # set with the shard just closed

    def close(self) -> None:
        """Finish the last shard, and write the index if one was asked for. Idempotent."""
        if not self.closed:
            self.closed = True
            self.finish()
            if self.index is not None:
                from .shards.index import relative_url, write_index

                write_index(self.index, [(relative_url(self.index, name), count)
                                         for name, count in zip(self.shards, self.counts)])

    def abort(self) -> None:
        """Abandon the shard being written; no ``post`` for it, no index. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.tarstream is None:
            return
        try:
            self.tarstream.abort()
        finally:
            self.tarstream = None
            stream, self._stream = self._stream, None
            abandon(stream)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if _leaves_cleanly(exc):
            self.close()
        else:
            self.abort()
