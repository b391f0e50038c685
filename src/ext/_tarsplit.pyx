# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native tar splitter: the regular-file members of a tar stream as ``(name, data, offset)``;
``TarHeaders``: the same from a tar file's headers alone, the data jumped over by offset;
``TarStreamHeaders``: the same from a stream's headers, the data read and dropped.

The pure-Python twin is ``wdsmp/native/tarsplit_py.py``; both share the cold paths
(errors, pax headers) in ``wdsmp/formats/tar.py``. Reads go into one reused buffer
through ``stream.readinto``; a member larger than half the buffer is read
straight into its result ``bytes`` object, so every byte is copied once.
"""

from cpython.buffer cimport PyBUF_WRITE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.stdlib cimport free, malloc
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR
from libc.string cimport memcmp, memcpy, memmove
from libc.errno cimport EINTR, errno
from posix.stat cimport fstat, struct_stat
from posix.types cimport off_t
from posix.unistd cimport pread

from wdsmp.formats import tar as _tf

cdef enum:
    BLOCK = 512
    LINK_MEMBERS = 64  # wdsmp.formats.tar.LINK_MEMBERS, checked at import

cdef long long MAX_SIZE = _tf.MAX_MEMBER_SIZE  # one limit for both splitters
cdef Py_ssize_t UNTRUSTED = _tf.UNTRUSTED_CHUNK  # allocated at most before data arrives
cdef long long LINK_WINDOW = _tf.LINK_WINDOW
if _tf.LINK_MEMBERS != LINK_MEMBERS:
    raise ImportError("src/ext/_tarsplit.pyx and wdsmp/formats/tar.py disagree on LINK_MEMBERS")


cdef long long _number(const unsigned char* p, int n) noexcept nogil:
    """A numeric header field: octal text or GNU base-256; -1 when invalid."""
    cdef long long value = 0
    cdef int i = 0, end = 0
    if p[0] & 0x80:
        if p[0] == 0xff:
            return -1  # negative
        value = p[0] & 0x7f
        for i in range(1, n):
            if value >= (MAX_SIZE >> 8):
                return -1
            value = (value << 8) | p[i]
        return value
    while end < n and p[end] != 0:
        end += 1
    while i < end and p[i] == 32:
        i += 1
    while end > i and p[end - 1] == 32:
        end -= 1
    for i in range(i, end):
        if p[i] < 48 or p[i] > 55:
            return -1
        if value >= MAX_SIZE:
            return -1
        value = value * 8 + (p[i] - 48)
    return value


cdef long long _byte_sum(const unsigned char* h) noexcept nogil:
    """Unsigned sum of a header block; a plain loop the compiler vectorises."""
    cdef long long total = 0
    cdef int i
    for i in range(BLOCK):
        total += h[i]
    return total


cdef bint _checksum_ok(const unsigned char* h, long long usum) noexcept nogil:
    """Header checksum, counting the checksum field as spaces (signed or unsigned sum)."""
    cdef long long stored = _number(h + 148, 8)
    cdef long long ssum
    cdef int i
    for i in range(148, 156):
        usum += 32 - h[i]
    if stored == usum:
        return True
    ssum = 0  # some old writers summed signed chars
    for i in range(BLOCK):
        if 148 <= i < 156:
            ssum += 32
        else:
            ssum += <signed char>h[i]
    return stored >= 0 and stored == ssum


cdef int _cstrlen(const unsigned char* p, int n) noexcept nogil:
    cdef int i = 0
    while i < n and p[i] != 0:
        i += 1
    return i


cdef class TarSplitter:
    """Iterate the regular-file members of an uncompressed tar stream.

    Yields ``(name, data, offset)``: the member path (str), its contents
    (bytes) and the byte offset where its headers start (as ``tarfile``'s
    ``TarInfo.offset``: a GNU long-name or pax header counts as the start). Directories
    are skipped; hard and symbolic links to members read shortly before come with those
    members' data, and ``links`` lists them (NOTE [tar links] in ``tarformat``); GNU long
    names and pax ``path``, ``linkpath`` and ``size`` records are applied. Damage raises
    ``TarFormatError`` naming ``url`` and the offset: a stream that ends without the
    end-of-archive marker is an error, not a short shard; so are a member larger than
    ``max_member_size`` (default: ``tarformat.member_size_limit()``), devices, FIFOs and
    unknown member types. ``reading`` is ``(name, offset)`` of the member whose data is
    being read, None between members: where a failing stream broke off.
    """

    cdef object stream
    cdef object _readinto
    cdef object _read
    cdef readonly object url
    cdef readonly long long max_member_size
    cdef readonly list links
    cdef readonly object reading  # (name, offset) of the member whose data is being read, or None
    # The members held for links (NOTE [tar links] in tarformat): a ring of names and data.
    cdef list _names, _datas
    cdef long long _sizes[LINK_MEMBERS]
    cdef int _oldest, _count
    cdef long long _held
    cdef unsigned char* buf
    cdef Py_ssize_t bufsize, start, end
    cdef readonly long long position  # stream offset of buf[start]
    cdef bint done

    def __cinit__(self):
        self.buf = NULL

    def __init__(self, stream, url=None, Py_ssize_t bufsize=1 << 20, max_member_size=None):
        if bufsize < 4 * BLOCK or bufsize % BLOCK:
            raise ValueError(f"bufsize must be a multiple of {BLOCK} and at least {4 * BLOCK}")
        self.max_member_size = _tf.member_size_limit(max_member_size)
        self.links = []
        self._names = [None] * LINK_MEMBERS
        self._datas = [None] * LINK_MEMBERS
        self._oldest = self._count = 0
        self._held = 0
        self.reading = None
        self.stream = stream
        # readinto1 where there is one: a single read at a time, so what a stream
        # delivered before failing (a cut gzip file) is split before the error.
        self._readinto = getattr(stream, "readinto1", None) or getattr(stream, "readinto", None)
        self._read = stream.read
        self.url = url
        self.bufsize = bufsize
        self.buf = <unsigned char*>malloc(bufsize)
        if self.buf == NULL:
            raise MemoryError()
        self.start = self.end = 0
        self.position = 0
        self.done = False

    def __dealloc__(self):
        free(self.buf)

    def __iter__(self):
        return self

    cdef Py_ssize_t _readinto_mem(self, unsigned char* dest, Py_ssize_t n) except -1:
        """One read of at most n bytes into dest; 0 at end of stream."""
        cdef object got
        cdef const unsigned char[:] view
        cdef Py_ssize_t k
        if self._readinto is not None:
            got = self._readinto(PyMemoryView_FromMemory(<char*>dest, n, PyBUF_WRITE))
            k = 0 if got is None else got
            if k < 0 or k > n:
                raise OSError(f"readinto() returned {k}, outside 0..{n}")
            return k
        got = self._read(n)
        if got is None or len(got) == 0:
            return 0
        view = got
        k = view.shape[0]
        if k > n:
            raise OSError(f"read() returned {k} bytes, more than the {n} asked for")
        memcpy(dest, &view[0], k)
        return k

    cdef Py_ssize_t _fill(self, Py_ssize_t need) except -1:
        """Make at least ``need`` (<= bufsize) bytes available; returns what is available."""
        cdef Py_ssize_t avail = self.end - self.start, k
        if avail >= need:
            return avail
        if self.bufsize - self.start < need:
            memmove(self.buf, self.buf + self.start, avail)
            self.start = 0
            self.end = avail
        while self.end - self.start < need:
            k = self._readinto_mem(self.buf + self.end, self.bufsize - self.end)
            if k == 0:
                break
            self.end += k
        return self.end - self.start

    cdef bytes _take(self, long long size, object name, long long hoff):
        """The next ``size`` bytes of member data, then skip its padding."""
        cdef Py_ssize_t avail = self.end - self.start, got, k
        cdef long long padded = (size + BLOCK - 1) // BLOCK * BLOCK
        cdef bytes out
        cdef char* p
        if size <= self.bufsize // 2:
            avail = self._fill(<Py_ssize_t>size)
            if avail < size:
                raise _tf.truncated_member(self.url, name, hoff, avail, padded)
            out = PyBytes_FromStringAndSize(<char*>self.buf + self.start, <Py_ssize_t>size)
            self.start += <Py_ssize_t>size
        elif size > UNTRUSTED:
            out = self._take_chunked(size, name, hoff, padded)
        else:
            # Too big to gather in the buffer: copy what is buffered, read the rest
            # straight into the result. The buffer may hold more than this member.
            out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>size)
            p = PyBytes_AS_STRING(out)
            got = avail if avail < size else <Py_ssize_t>size
            memcpy(p, self.buf + self.start, got)
            self.start += got
            if self.start == self.end:
                self.start = self.end = 0
            while got < size:
                k = self._readinto_mem(<unsigned char*>p + got, <Py_ssize_t>(size - got))
                if k == 0:
                    raise _tf.truncated_member(self.url, name, hoff, got, padded)
                got += k
        self.position += size
        if self.end - self.start >= padded - size:  # the usual case: padding is buffered
            self.start += <Py_ssize_t>(padded - size)
            self.position += padded - size
        else:
            self._skip(padded - size, name, hoff, size, padded)
        return out

    cdef bytes _take_chunked(self, long long size, object name, long long hoff, long long padded):
        """The next ``size`` bytes, read in chunks of at most UNTRUSTED and joined: a size claimed
        by a damaged header costs memory only as its data arrives (one more copy for real ones)."""
        cdef list parts = []
        cdef long long got = 0
        cdef Py_ssize_t n, k, r
        cdef bytes chunk
        n = self.end - self.start
        if n > 0:
            n = n if n < size else <Py_ssize_t>size
            parts.append(PyBytes_FromStringAndSize(<char*>self.buf + self.start, n))
            self.start += n
            got = n
        if self.start == self.end:
            self.start = self.end = 0
        while got < size:
            n = UNTRUSTED if size - got > UNTRUSTED else <Py_ssize_t>(size - got)
            chunk = PyBytes_FromStringAndSize(NULL, n)
            k = 0
            while k < n:
                r = self._readinto_mem(<unsigned char*>PyBytes_AS_STRING(chunk) + k, n - k)
                if r == 0:
                    raise _tf.truncated_member(self.url, name, hoff, got + k, padded)
                k += r
            parts.append(chunk)
            got += n
        return b"".join(parts)

    cdef int _skip(self, long long n, object name, long long hoff, long long got, long long padded) except -1:
        """Discard n bytes (padding or unused member data)."""
        cdef Py_ssize_t avail, step
        while n > 0:
            avail = self._fill(1 if n > self.bufsize else <Py_ssize_t>n)
            if avail == 0:
                raise _tf.truncated_member(self.url, name, hoff, got, padded)
            step = avail if avail < n else <Py_ssize_t>n
            self.start += step
            self.position += step
            got += step
            n -= step
        return 0

    def __next__(self):
        if self.done:
            raise StopIteration
        try:
            return self._next()
        except BaseException:
            self.done = True  # a damaged stream cannot be resumed
            raise

    cdef object _next(self):
        cdef const unsigned char* h
        cdef Py_ssize_t avail
        cdef long long hoff, size, usum, moff = -1  # moff: where the member's first header starts
        cdef unsigned char typeflag
        cdef bint regular
        cdef bytes raw, data
        longname = None
        longlink = None
        pax = None
        while not self.done:
            hoff = self.position
            avail = self._fill(BLOCK)
            if avail < BLOCK:
                if hoff == 0:
                    if avail == 0:
                        raise _tf.empty_file(self.url)
                    raise _tf.not_a_tar(self.url, self._head(avail))
                if avail == 0:
                    raise _tf.missing_end_marker(self.url, hoff)
                raise _tf.truncated_header(self.url, hoff, avail)
            h = self.buf + self.start
            usum = _byte_sum(h)
            if usum == 0:  # a zero block: the end-of-archive marker
                self.done = True
                break
            if not _checksum_ok(h, usum):
                if hoff == 0:
                    raise _tf.not_a_tar(self.url, self._head(BLOCK))
                raise _tf.bad_checksum(self.url, hoff)
            size = _number(h + 124, 12)
            if size < 0:
                raise _tf.bad_number(self.url, hoff, "size")
            typeflag = h[156]
            if moff < 0 and typeflag != c'g':
                moff = hoff
            # The name: GNU long name, pax path, or ustar prefix + name.
            if longname is not None:
                name = longname
            elif pax is not None and "path" in pax:
                name = pax["path"]
            elif memcmp(h + 257, b"ustar\0", 6) == 0 and h[345] != 0:
                raw = (<char*>h + 345)[:_cstrlen(h + 345, 155)] + b"/" + (<char*>h)[:_cstrlen(h, 100)]
                name = _tf.decode_name(raw)
            else:  # the common case, decoded straight from the buffer
                name = PyUnicode_DecodeUTF8(<char*>h, _cstrlen(h, 100), "surrogateescape")
            if pax is not None and "size" in pax:
                size = pax["size"]
            regular = typeflag == c'0' or typeflag == 0 or typeflag == c'7'
            if size > self.max_member_size and typeflag != c'g' and typeflag != c'V' and typeflag != c'D':
                raise _tf.member_too_large(self.url, name if regular else None, hoff, size, self.max_member_size)
            if typeflag == c'1' or typeflag == c'2':
                if longlink is not None:
                    target = longlink
                elif pax is not None and "linkpath" in pax:
                    target = pax["linkpath"]
                else:
                    target = _tf.decode_name((<char*>h + 157)[:_cstrlen(h + 157, 100)])
            self.start += BLOCK
            self.position += BLOCK
            if regular:
                self.reading = (name, moff)
                data = self._member(size, name, hoff)
                self.reading = None
                if PyUnicode_GET_LENGTH(name) and PyUnicode_READ_CHAR(name, PyUnicode_GET_LENGTH(name) - 1) == 47:
                    # a name ending in "/": an old-style directory entry
                    longname = longlink = pax = None
                    moff = -1
                    continue
                self._remember(name, data, size)
                return (name, data, moff)
            if typeflag == c'1' or typeflag == c'2':
                data, linked = _tf.resolve_link(self.url, bytes([typeflag]), name, target, moff,
                                                self._held_members())
                self.links.append((name, target, moff))
                self._remember(name, data, linked)
                return (name, data, moff)
            # Errors inside extension headers name no member: the member they
            # belong to is not known yet.
            if typeflag == c'L':
                longname = _tf.decode_name(self._take(size, None, hoff).split(b"\0", 1)[0])
            elif typeflag == c'K':
                longlink = _tf.decode_name(self._take(size, None, hoff).split(b"\0", 1)[0])
            elif typeflag == c'x':
                pax = _tf.parse_pax(self._take(size, None, hoff), self.url, hoff)
            elif typeflag == c'S':
                raise _tf.unsupported_sparse(self.url, name, hoff)
            elif typeflag == c'5':
                longname = longlink = pax = None
                moff = -1
            elif typeflag == c'g' or typeflag == c'V' or typeflag == c'D':  # metadata: skip its data
                if typeflag != c'g':
                    longname = longlink = pax = None
                    moff = -1
                else:
                    name = None
                self._skip((size + BLOCK - 1) // BLOCK * BLOCK, name, hoff, 0,
                           (size + BLOCK - 1) // BLOCK * BLOCK)
            else:
                raise _tf.unsupported_type(self.url, name, hoff, bytes([typeflag]))
        raise StopIteration

    cdef void _forget_oldest(self):
        cdef int i = self._oldest
        self._names[i] = None
        self._datas[i] = None
        self._held -= self._sizes[i]
        self._oldest = (i + 1) % LINK_MEMBERS
        self._count -= 1

    cdef void _remember(self, object name, object data, long long size):
        """Hold a member of ``size`` bytes for links: the last LINK_MEMBERS, within LINK_WINDOW
        bytes, the newest always (``data`` is None where only headers are read)."""
        cdef int i
        if self._count == LINK_MEMBERS:
            self._forget_oldest()
        i = (self._oldest + self._count) % LINK_MEMBERS
        self._names[i] = name
        self._datas[i] = data
        self._sizes[i] = size
        self._held += self._sizes[i]
        self._count += 1
        while self._held > LINK_WINDOW and self._count > 1:
            self._forget_oldest()

    cdef list _held_members(self):
        """``[(name, data, size)]`` of the members held, oldest first."""
        cdef int k, i
        result = []
        for k in range(self._count):
            i = (self._oldest + k) % LINK_MEMBERS
            result.append((self._names[i], self._datas[i], self._sizes[i]))
        return result

    cdef object _member(self, long long size, object name, long long hoff):
        """A regular member's data (``TarHeaders`` skips it instead)."""
        return self._take(size, name, hoff)

    cdef bytes _head(self, Py_ssize_t n):
        return (<char*>self.buf + self.start)[:n]


cdef class TarHeaders(TarSplitter):
    """The regular-file members of an uncompressed tar file, from their headers alone: yields
    ``(name, None, offset)`` as ``TarSplitter`` yields ``(name, data, offset)``, with the same
    names (GNU long names, pax records) and the same errors, but member data is never read:
    the walk jumps over it with ``pread`` on the file's descriptor, so a shard costs a few
    small reads per member whatever its size. ``file`` is a binary file object opened on a
    regular file; it is read from its start, and its size (``fstat``) tells a truncated
    member from a whole one.
    """

    cdef int fd
    cdef long long size  # of the file
    cdef long long offset  # file offset of buf[end], where the next read goes

    def __init__(self, file, url=None, Py_ssize_t bufsize=4096, max_member_size=None):
        super().__init__(file, url, bufsize, max_member_size)
        self.fd = file.fileno()
        cdef struct_stat info
        if fstat(self.fd, &info) != 0:
            raise OSError(errno, f"cannot stat the shard {url!r}")
        self.size = info.st_size
        self.offset = 0

    cdef Py_ssize_t _readinto_mem(self, unsigned char* dest, Py_ssize_t n) except -1:
        cdef ssize_t k
        while True:
            with nogil:
                k = pread(self.fd, dest, n, self.offset)
            if k >= 0:
                break
            if errno != EINTR:
                raise OSError(errno, f"cannot read the shard {self.url!r}")
        self.offset += k
        return k

    cdef int _skip(self, long long n, object name, long long hoff, long long got, long long padded) except -1:
        """Jump over n bytes: the buffered ones, then the rest by offset, if the file has them."""
        cdef Py_ssize_t buffered = self.end - self.start
        if n <= buffered:
            self.start += <Py_ssize_t>n
            self.position += n
            return 0
        if self.position + n > self.size:
            raise _tf.truncated_member(self.url, name, hoff, got + max(self.size - self.position, 0), padded)
        self.position += n
        self.offset = self.position
        self.start = self.end = 0
        return 0

    cdef object _member(self, long long size, object name, long long hoff):
        cdef long long padded = (size + BLOCK - 1) // BLOCK * BLOCK
        self._skip(padded, name, hoff, 0, padded)
        return None


cdef class TarStreamHeaders(TarSplitter):
    """The regular-file members of an uncompressed tar stream, from their headers: yields
    ``(name, None, offset)`` as ``TarSplitter`` yields ``(name, data, offset)``, with the same
    names and the same errors. A stream has no offsets to jump to (a gzip-compressed shard), so
    member data is read, but only into the reused buffer, and dropped: what counts a shard holds
    no member, whatever its size. A member over ``max_member_size`` is refused as ``TarSplitter``
    refuses it, so that a count agrees with what the reader yields.
    """

    cdef object _member(self, long long size, object name, long long hoff):
        cdef long long padded = (size + BLOCK - 1) // BLOCK * BLOCK
        self._skip(padded, name, hoff, 0, padded)
        return None
