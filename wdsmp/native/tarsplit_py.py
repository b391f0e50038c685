"""Pure-Python twin of the native tar splitter (``src/ext/_tarsplit.pyx``): ``TarSplitter``,
``TarHeaders``, which walks a tar file's headers alone, and ``TarStreamHeaders``, which walks a
stream's headers and drops the data between them.

Same classes, same results, same errors; selected with ``WDSMP_PUREPYTHON=1`` or
when the extension is not built. Cold paths are shared through ``wdsmp.formats.tar``.
"""

import os
from collections import deque
from typing import IO, Deque, List, Optional, Tuple

from ..formats import tar as _tf
from ..formats.tar import BLOCK, checksum_ok, header_number

_Member = Tuple[str, Optional[bytes], int]  # (name, data, offset) as yielded; (name, data, size) as held
_SKIP_CHUNK = 1 << 20  # data skipped is read this much at a time (the native splitter's buffer)


def _cstr(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


def _padded(size: int) -> int:
    """``size`` bytes of data and the padding to the next block."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


class TarSplitter:
    """Iterate the regular-file members of an uncompressed tar stream.

    Yields ``(name, data, offset)``: the member path (str), its contents
    (bytes) and the byte offset where its headers start (as ``tarfile``'s
    ``TarInfo.offset``: a GNU long-name or pax header counts as the start).
    Directories are skipped; hard and symbolic links to members read shortly
    before come with those members' data, and ``links`` lists them (NOTE [tar
    links] in ``wdsmp.formats.tar``); GNU long names and pax ``path``, ``linkpath`` and
    ``size`` records are applied. Damage raises ``TarFormatError`` naming
    ``url`` and the offset: a stream that ends without the end-of-archive
    marker is an error, not a short shard; so are a member larger than
    ``max_member_size`` (default: ``tarformat.member_size_limit()``), devices,
    FIFOs and unknown member types. ``reading`` is ``(name, offset)`` of the member whose
    data is being read, None between members: where a failing stream broke off.
    """

    def __init__(self, stream: IO[bytes], url: Optional[str] = None, bufsize: int = 1 << 20,
                 max_member_size: Optional[int] = None) -> None:
        if bufsize < 4 * BLOCK or bufsize % BLOCK:
            raise ValueError(f"bufsize must be a multiple of {BLOCK} and at least {4 * BLOCK}")
        self.stream = stream
        self.url = url
        self.max_member_size = _tf.member_size_limit(max_member_size)
        self._recent: Deque[_Member] = deque()  # (name, data, size) of the members held for links, oldest first
        self._held = 0
        self.links: List[Tuple[str, str, int]] = []
        self.reading: Optional[Tuple[str, int]] = None  # (name, offset) of the member whose data is being read
        self.position = 0
        self._done = False

    def __iter__(self) -> "TarSplitter":
        return self

    def _read(self, n: int) -> bytes:
        """Up to n bytes; fewer only at the end of the stream. Read in chunks, so that a size
        claimed by a header costs memory only as its data arrives."""
        parts = []
        while n > 0:
            chunk = self.stream.read(min(n, _tf.UNTRUSTED_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
        data = b"".join(parts)
        self.position += len(data)
        return data

    def _remember(self, name: str, data: Optional[bytes], size: int) -> None:
        """Hold a member of ``size`` bytes for links (NOTE [tar links] in ``wdsmp.formats.tar``): the last
        LINK_MEMBERS, within LINK_WINDOW bytes, the newest always."""
        recent = self._recent
        if len(recent) == _tf.LINK_MEMBERS:
            self._held -= recent.popleft()[2]
        recent.append((name, data, size))
        self._held += size
        while self._held > _tf.LINK_WINDOW and len(recent) > 1:
            self._held -= recent.popleft()[2]

    def _take(self, size: int, name: Optional[str], hoff: int) -> bytes:
        padded = _padded(size)
        data = self._read(size)
        if len(data) < size:
            raise _tf.truncated_member(self.url, name, hoff, len(data), padded)
        pad = self._read(padded - size)
        if len(pad) < padded - size:
            raise _tf.truncated_member(self.url, name, hoff, size + len(pad), padded)
        return data

    def _skip(self, padded: int, name: Optional[str], hoff: int) -> None:
        """Drop the next ``padded`` bytes (data no one holds: metadata, or a member walked for its
        header alone) a chunk at a time, so that what the data claims is never held, as
        ``src/ext/_tarsplit.pyx`` drops it through its buffer."""
        got = 0
        while got < padded:
            chunk = self._read(min(padded - got, _SKIP_CHUNK))
            if not chunk:
                raise _tf.truncated_member(self.url, name, hoff, got, padded)
            got += len(chunk)

    def _member(self, size: int, name: str, hoff: int) -> Optional[bytes]:
        """A regular member's data (``TarHeaders`` and ``TarStreamHeaders`` skip it instead)."""
        return self._take(size, name, hoff)

    def __next__(self) -> _Member:
        if self._done:
            raise StopIteration
        try:
            return self._next()
        except BaseException:
            self._done = True  # a damaged stream cannot be resumed
            raise

    def _next(self) -> _Member:
        longname = longlink = pax = None
        moff = -1
        while not self._done:
            hoff = self.position
            header = self._read(BLOCK)
            if len(header) < BLOCK:
                if hoff == 0:
                    if not header:
                        raise _tf.empty_file(self.url)
                    raise _tf.not_a_tar(self.url, header)
                if not header:
                    raise _tf.missing_end_marker(self.url, hoff)
                raise _tf.truncated_header(self.url, hoff, len(header))
            if not any(header):
                self._done = True
                break
            if not checksum_ok(header):
                if hoff == 0:
                    raise _tf.not_a_tar(self.url, header)
                raise _tf.bad_checksum(self.url, hoff)
            size = header_number(header[124:136])
            if size < 0:
                raise _tf.bad_number(self.url, hoff, "size")
            typeflag = header[156:157]
            if moff < 0 and typeflag != _tf.PAX_GLOBAL:
                moff = hoff
            if longname is not None:
                name = longname
            elif pax is not None and "path" in pax:
                name = pax["path"]
            else:
                raw = _cstr(header[:100])
                if header[257:263] == b"ustar\0" and header[345]:
                    raw = _cstr(header[345:500]) + b"/" + raw
                name = _tf.decode_name(raw)
            if pax is not None and "size" in pax:
                size = pax["size"]
            if size > self.max_member_size and typeflag not in _tf.SKIPPED_TYPES:
                raise _tf.member_too_large(self.url, name if typeflag in _tf.REGULAR_TYPES else None, hoff,
                                           size, self.max_member_size)
            if typeflag in _tf.REGULAR_TYPES:
                self.reading = (name, moff)
                data = self._member(size, name, hoff)
                self.reading = None
                if name.endswith("/"):  # an old-style directory entry
                    longname = longlink = pax = None
                    moff = -1
                    continue
                self._remember(name, data, size)
                return (name, data, moff)
            if typeflag in (_tf.HARD_LINK, _tf.SYMBOLIC_LINK):
                if longlink is not None:
                    target = longlink
                elif pax is not None and "linkpath" in pax:
                    target = pax["linkpath"]
                else:
                    target = _tf.decode_name(_cstr(header[157:257]))
                data, linked = _tf.resolve_link(self.url, typeflag, name, target, moff, self._recent)
                self.links.append((name, target, moff))
                self._remember(name, data, linked)
                return (name, data, moff)
            # Errors inside extension headers name no member: the member they
            # belong to is not known yet.
            if typeflag == _tf.GNU_LONGNAME:
                longname = _tf.decode_name(self._take(size, None, hoff).split(b"\0", 1)[0])
            elif typeflag == _tf.GNU_LONGLINK:
                longlink = _tf.decode_name(self._take(size, None, hoff).split(b"\0", 1)[0])
            elif typeflag == _tf.PAX_HEADER:
                pax = _tf.parse_pax(self._take(size, None, hoff), self.url, hoff)
            elif typeflag == _tf.GNU_SPARSE:
                raise _tf.unsupported_sparse(self.url, name, hoff)
            elif typeflag == _tf.DIRECTORY:
                longname = longlink = pax = None
                moff = -1
            elif typeflag in _tf.SKIPPED_TYPES:  # metadata: skip its data, held by no cap
                if typeflag != _tf.PAX_GLOBAL:
                    longname = longlink = pax = None
                    moff = -1
                    self._skip(_padded(size), name, hoff)
                else:
                    self._skip(_padded(size), None, hoff)
            else:
                raise _tf.unsupported_type(self.url, name, hoff, typeflag)
        raise StopIteration


class TarHeaders(TarSplitter):
    """The regular-file members of an uncompressed tar file, from their headers alone: yields
    ``(name, None, offset)`` as ``TarSplitter`` yields ``(name, data, offset)``, with the same
    names and errors, but member data is never read: the walk jumps over it with ``pread``
    on the file's descriptor. ``file`` is a binary file object opened on a regular file; it
    is read from its start, and its size tells a truncated member from a whole one. A member
    over ``max_member_size`` is refused as ``TarSplitter`` refuses it."""

    def __init__(self, file: IO[bytes], url: Optional[str] = None, bufsize: int = 4096,
                 max_member_size: Optional[int] = None) -> None:
        super().__init__(file, url, bufsize, max_member_size)
        self.fd = file.fileno()
        self.size = os.fstat(self.fd).st_size

    def _read(self, n: int) -> bytes:
        parts = []
        while n > 0:
            chunk = os.pread(self.fd, min(n, _tf.UNTRUSTED_CHUNK), self.position)
            if not chunk:
                break
            parts.append(chunk)
            self.position += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _skip(self, padded: int, name: Optional[str], hoff: int) -> None:
        """Jump over ``padded`` bytes by offset, if the file has them."""
        if self.position + padded > self.size:
            raise _tf.truncated_member(self.url, name, hoff, max(self.size - self.position, 0), padded)
        self.position += padded

    def _member(self, size: int, name: str, hoff: int) -> Optional[bytes]:
        self._skip(_padded(size), name, hoff)
        return None


class TarStreamHeaders(TarSplitter):
    """The regular-file members of an uncompressed tar stream, from their headers: yields
    ``(name, None, offset)`` as ``TarSplitter`` yields ``(name, data, offset)``, with the same
    names and errors. A stream has no offsets to jump to (a gzip-compressed shard), so member
    data is read, a chunk at a time, and dropped: what counts a shard holds no member, whatever
    its size. A member over ``max_member_size`` is refused as ``TarSplitter`` refuses it, so
    that a count agrees with what the reader yields."""

    def _member(self, size: int, name: str, hoff: int) -> Optional[bytes]:
        self._skip(_padded(size), name, hoff)
        return None
