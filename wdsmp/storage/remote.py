"""Remote objects as streams: ``http://`` and ``https://`` in-process, and the
resume and upload machinery that :mod:`wdsmp.storage.s3` shares.

Reading, a :class:`ResumableReader` streams one object from start to end and
survives a dropped connection, a stalled server or a 5xx reply by asking again
for the bytes it has not yet delivered (NOTE [resume protocol]); it delivers
exactly the object's bytes or raises :class:`~wdsmp.errors.ShardError`, never a
short shard. Writing, a :class:`SpooledUpload` collects the bytes in a spool
(memory, then a temporary file) and uploads them on ``close()``, so a failed
upload can be retried from the start and nothing half-written appears remotely.

HTTP goes through urllib3 (already a dependency of botocore), never a shell, and
through the proxy that ``http_proxy``/``https_proxy`` name (``no_proxy`` excepted);
its ``Retry`` follows redirects and retries a request that fails before a reply
(backoff, Retry-After), so wdsmp's own loop is only the resume below.

NOTE [resume protocol]: a reader knows ``pos``, the bytes it has delivered
(bytes of a read that failed midway were never delivered, and are asked for
again), and, from the first reply, the object's ``size`` (Content-Length of a 200, or
the total of a 206's Content-Range) and its ETag. After a transient failure
(connection reset or refused, read or connect timeout, a body that ends before
its Content-Length, HTTP 408, 429 or 5xx but 501/505) it waits, doubling the
delay from ``backoff`` up to ``max_backoff`` (with jitter; over HTTP, at least
a server's Retry-After up to ``max_backoff``, as urllib3's ``Retry`` does it for
the request), and asks for ``Range: bytes=pos-``.
The reply must be a 206 whose Content-Range starts at ``pos`` and whose total
and ETag match the first reply's; a changed size or ETag is an error (the object
was replaced while being read). A server that ignores Range and answers 200 with
the whole object is accepted when its size and ETag match: the first ``pos``
bytes are read and discarded (slow, but correct; the minimum rate below judges
those reads too). ``retries`` bounds the
failures in a row (over HTTP, urllib3 counts those before a reply by kind:
connect, read, status); every delivered byte resets the count, so a long object
over a flaky link still finishes while a dead server fails after ``retries`` waits.
End of data is only accepted at ``size`` (or, when no size was given, at the
server's clean end of the body). One failure is not retried: a connection refused
by this machine (localhost, 127.0.0.0/8, ::1), where nothing listens on that port,
fails at once, where retries would only delay the error by many seconds.

A server can also keep a read alive without serving it: a byte now and then
resets every read timeout (a trickle). So the time spent waiting in reads is
added up per connection, and once it reaches ``rate_window`` seconds the bytes
that came meanwhile must be at least ``min_rate`` per second of it; slower is a
transient failure (the connection is dropped and the rest asked for again), and
``retries`` slow windows in a row end the read with a ShardError naming the
URL and the rate. Only waiting counts: a consumer that reads slowly never makes
the server look slow. Reads return as soon as some bytes arrive (urllib3's
``read1``), so that a trickle cannot hold one read for long.
"""

import functools
import io
import ipaddress
import os
import random
import re
import tempfile
import time
from dataclasses import dataclass, fields
from types import ModuleType, TracebackType
from typing import IO, TYPE_CHECKING, Any, Dict, Mapping, Optional, Type, Union
from urllib.parse import unquote, urlsplit

from .._internal import env
from ..errors import ShardError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer
    from urllib3 import PoolManager, Retry
    from urllib3.connectionpool import ConnectionPool
    from urllib3.response import BaseHTTPResponse

__all__ = [
    "HTTPReader",
    "refused_here",
    "HTTPWriter",
    "RemoteOptions",
    "Reply",
    "ResumableReader",
    "SpooledUpload",
    "Transient",
    "buffered_reader",
    "open_http",
]

_READ_BUFFER = 1 << 20  # a BufferedReader this large hands big readinto() calls straight to the stream
_SPOOL_MEMORY = 16 << 20  # upload bytes kept in memory before the spool moves to a temporary file
_SKIP_CHUNK = 1 << 20
_REDIRECTS = 10
_EXCERPT = 300  # characters of an error reply's body quoted in the message
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_TRANSIENT_STATUSES = (408, 429, *(status for status in range(500, 600) if status not in (501, 505)))
_CROSS_HOST_DROPPED = ("authorization", "cookie", "proxy-authorization")


@dataclass(frozen=True)
class RemoteOptions:
    """Timeouts (seconds), the slowest rate accepted (bytes per second of waiting, judged over
    ``rate_window`` seconds of it; 0: none) and retry policy of one remote stream; NOTE
    [resume protocol].

    ``gopen(url, **kw)`` builds one from the keywords named here and ignores the
    others (they belong to other schemes, as ``ignore_status`` to ``pipe:``).
    """

    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    min_rate: float = 1024.0  # bytes per second of waiting, 0: no minimum
    rate_window: float = 30.0  # seconds of waiting over which min_rate is judged

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{field.name} must be a number >= 0, not {value!r}")
        if not isinstance(self.retries, int):
            raise ValueError(f"retries must be an integer, not {self.retries!r}")
        if self.connect_timeout == 0 or self.read_timeout == 0 or self.rate_window == 0:
            raise ValueError("connect_timeout, read_timeout and rate_window must be > 0")

    @classmethod
    def from_kw(cls, kw: Mapping[str, Any]) -> "RemoteOptions":
        """The options among ``kw`` (a gopen keyword dict); the rest is ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kw.items() if k in names})

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row (1, 2, ...)."""
        return min(self.max_backoff, self.backoff * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)


class Transient(Exception):
    """A failure worth retrying (NOTE [resume protocol]); ``final`` when it was retried
    already (by urllib3's ``Retry``) as often as ``retries`` allows; ``slow`` when bytes
    came, but slower than ``min_rate``."""

    def __init__(self, message: str, final: bool = False, slow: bool = False) -> None:
        super().__init__(message)
        self.final = final
        self.slow = slow


@dataclass
class Reply:
    """What a stream needs of a GET reply: the body and the headers NOTE [resume protocol] checks."""

    body: object
    status: int
    length: Optional[int] = None  # Content-Length of this reply
    content_range: Optional[str] = None
    etag: Optional[str] = None


def _this_machine(host: Optional[str]) -> bool:
    """Whether ``host`` (a name or an address, maybe in brackets) is this machine's loopback."""
    host = (host or "").strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refused_here(exn: Optional[BaseException], host: Optional[str]) -> bool:
    """Whether ``exn``, or an error it was raised from, is a connection refused by ``host`` when
    that is this machine: nothing listens on the port, and retrying would only wait (module NOTE)."""
    seen = exn
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return _this_machine(host)
        seen = seen.__cause__ or seen.__context__
    return False


def _refused_error(method: str, host: str, port: Optional[int], where: str, proxy: bool = False) -> ShardError:
    server = "the proxy (the proxy variables name it)" if proxy else "the server"
    return ShardError(f"{method} failed: connection refused by {host}:{port}, on this machine: nothing listens "
                      f"there (not retried: start {server}, or check the port)", url=where)


def _located(url: str, origin: Optional[str]) -> str:
    return url if origin is None or origin == url else f"{url} (from {origin})"


def buffered_reader(raw: io.RawIOBase, bufsize: int = 8192) -> io.BufferedReader:
    """``raw`` behind a BufferedReader of at least 1 MiB: ``readinto1`` of a large buffer goes straight through."""
    return io.BufferedReader(raw, max(bufsize, _READ_BUFFER))


class ResumableReader(io.RawIOBase):
    """One remote object read start to end, resumed after failures; NOTE [resume protocol].

    Subclasses implement ``_get(offset)`` (a :class:`Reply`, or raise
    :class:`Transient` or ShardError), ``_read(body, view)`` and ``_drop(body)``.
    ``origin`` is the URL the caller gave, when gopen rewrote or routed it.
    """

    _body: Any = None  # class default: close() runs from __del__ even if __init__ failed
    _waited: float  # seconds spent in this connection's reads (set by _connect)
    _got: int  # and their bytes

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, origin: Optional[str] = None) -> None:
        super().__init__()
        self.url = url
        self.origin = origin
        self.options = options or RemoteOptions()
        self.pos = 0
        self.size: Optional[int] = None
        self.etag: Optional[str] = None
        self._done = False
        self._failures = 0
        self._slow = 0  # slow windows in a row; bytes that come slowly do not reset it
        self._connect()  # open now, so that a missing object fails in gopen(), not at the first read

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        self._checkClosed()
        return self.pos

    @property
    def where(self) -> str:
        """The URL for error messages: the one requested, and the caller's if gopen rewrote it."""
        return _located(self.url, self.origin)

    def _error(self, problem: str) -> ShardError:
        return ShardError(problem, url=self.where)

    def readinto(self, b: "WriteableBuffer") -> int:
        self._checkClosed()
        view = memoryview(b).cast("B")
        if not len(view):
            return 0
        while not self._done:
            if self._body is None:
                if self.size is not None and self.pos >= self.size:
                    break  # it broke after the last byte: nothing left to ask for
                self._connect()
            try:
                self._check_rate()
                started = time.monotonic()
                n = self._read(self._body, view)
                self._waited += time.monotonic() - started
            except Transient as exn:
                self._release()
                self._wait(exn)
                continue
            if n:
                self.pos += n
                self._got += n
                self._failures = 0
                return n
            self._release()
            if self.size is None or self.pos == self.size:
                self._done = True
            else:
                self._wait(Transient(f"body ended after {self.pos} of {self.size} bytes"))
        return 0

    def close(self) -> None:
        if not self.closed:
            self._release()
        super().close()

    def _release(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            self._drop(body)

    def _check_rate(self) -> None:
        """A slow Transient when the reads of a whole ``rate_window`` (their waiting only) gave
        less than ``min_rate`` bytes per second (NOTE [resume protocol])."""
        waited, window = self._waited, self.options.rate_window
        if waited < window or not self.options.min_rate:
            return
        got, self._waited, self._got = self._got, 0, 0
        if got >= self.options.min_rate * waited:
            self._slow = 0
            return
        raise Transient(f"GET too slow: {got:,} bytes in {waited:.1f} s of waiting ({got / waited:,.1f} bytes/s), "
                        f"less than min_rate={self.options.min_rate:g} bytes/s over rate_window={window:g} s",
                        slow=True)

    def _wait(self, exn: Transient) -> None:
        """Count a failure, then sleep before the next try or give up (NOTE [resume protocol])."""
        self._failures += 1
        self._slow += exn.slow
        if exn.final or self._failures > self.options.retries or self._slow > self.options.retries:
            at = f" at byte {self.pos} of {self.size}" if self.size is not None else ""
            raise self._error(f"{exn}{at}; gave up after {self.options.retries} retries") from exn
        time.sleep(self.options.delay(self._failures))

    def _connect(self) -> None:
        self._waited = self._got = 0  # seconds spent in this connection's reads, and their bytes
        while True:
            try:
                reply = self._get(self.pos)
            except Transient as exn:
                self._wait(exn)
                continue
            self._body = reply.body
            try:
                self._accept(reply)
                return
            except Transient as exn:
                self._release()
                self._wait(exn)
            except BaseException:
                self._release()
                raise

    def _accept(self, reply: Reply) -> None:
        """Check a reply against what is known of the object (NOTE [resume protocol])."""
        offset, skip = self.pos, 0
        if reply.status == 206:
            match = _CONTENT_RANGE.fullmatch((reply.content_range or "").strip())
            if match is None or int(match.group(1)) != offset:
                raise self._error(f"asked for bytes {offset}- and got status 206 with "
                                  f"Content-Range {reply.content_range!r}")
            total = None if match.group(3) == "*" else int(match.group(3))
        elif reply.status == 200:
            total, skip = reply.length, offset  # a 200 after a Range request ignored it: skip ahead
        else:
            raise self._error(f"unexpected status {reply.status}")
        if self.size is not None and total is not None and total != self.size:
            raise self._error(f"object changed while being read: size was {self.size}, now {total}")
        if self.etag is not None and reply.etag is not None and reply.etag != self.etag:
            raise self._error(f"object changed while being read: ETag was {self.etag}, now {reply.etag}")
        if offset and skip and self.size is None and self.etag is None:
            raise self._error("server ignored Range and the object has neither size nor ETag "
                              "to tell it is the same one: cannot resume")
        self.size = total if total is not None else self.size
        self.etag = reply.etag if reply.etag is not None else self.etag
        self._skip(skip)

    def _skip(self, count: int) -> None:
        """Read and drop ``count`` bytes (a 200 to a Range request), judged by the minimum rate as
        any read is: a server that trickles them would otherwise hold the read for ever."""
        view = memoryview(bytearray(min(count, _SKIP_CHUNK))) if count else None
        while count:
            assert view is not None
            self._check_rate()
            started = time.monotonic()
            n = self._read(self._body, view[:min(count, len(view))])
            self._waited += time.monotonic() - started
            self._got += n
            if not n:
                raise Transient(f"body ended while skipping to byte {self.pos}")
            count -= n

    def _get(self, offset: int) -> Reply:
        raise NotImplementedError

    def _read(self, body: Any, view: memoryview) -> int:
        raise NotImplementedError

    def _drop(self, body: Any) -> None:
        raise NotImplementedError


class SpooledUpload(io.RawIOBase):
    """Bytes written are spooled, then uploaded by ``close()`` with retries.

    Only an explicit ``close()`` (or leaving a ``with`` block normally) uploads:
    leaving it by an exception, calling :meth:`abort`, or dropping the object
    unclosed discards the spool, so an abandoned shard never appears remotely.
    Subclasses implement ``_upload(spool, size)``, which raises
    :class:`Transient` for a failure worth retrying.
    """

    _spool: Optional["tempfile.SpooledTemporaryFile[bytes]"] = None

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, origin: Optional[str] = None) -> None:
        super().__init__()
        self.url = url
        self.origin = origin
        self.options = options or RemoteOptions()
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY)

    @property
    def where(self) -> str:
        """The URL for error messages: the one requested, and the caller's if gopen rewrote it."""
        return _located(self.url, self.origin)

    def writable(self) -> bool:
        return True

    def write(self, b: "ReadableBuffer") -> int:
        self._checkClosed()
        assert self._spool is not None
        return self._spool.write(b)

    def abort(self) -> None:
        """Discard what was written; nothing is uploaded. Idempotent."""
        if not self.closed:
            if self._spool is not None:
                self._spool.close()
            super().close()

    def __del__(self) -> None:
        self.abort()  # no network traffic from a finalizer, and no upload nobody asked for

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def close(self) -> None:
        """Upload what was written; raises ShardError if that fails. Idempotent."""
        if self.closed or self._spool is None:  # the second: __init__ failed, nothing to upload
            self.abort()
            return
        try:
            size = self._spool.tell()
            for failures in range(1, self.options.retries + 2):
                self._spool.seek(0)
                try:
                    self._upload(self._spool, size)
                    return
                except Transient as exn:
                    if exn.final or failures > self.options.retries:
                        raise ShardError(f"upload failed: {exn}; gave up after {self.options.retries} retries",
                                         url=self.where) from exn
                    time.sleep(self.options.delay(failures))
        finally:
            self._spool.close()
            super().close()

    def _upload(self, spool: IO[bytes], size: int) -> None:
        raise NotImplementedError


# HTTP


# proxy URL or None -> urllib3 pool manager, of the process in _pools_pid
_pools: Dict[Optional[str], "PoolManager"] = {}
_pools_pid: Optional[int] = None  # connections are never shared across a fork


def _urllib3() -> ModuleType:
    try:
        import urllib3
    except ImportError as exn:
        raise ImportError("http:// and https:// URLs need urllib3: pip install urllib3") from exn
    return urllib3


def _pool_manager(url: str) -> "PoolManager":
    """The pool manager for ``url``: direct, or through the proxy the environment names for
    it (``env.http_proxy``: curl's variables, which webdataset's curl reads too)."""
    global _pools_pid
    if _pools_pid != os.getpid():
        _pools.clear()
        _pools_pid = os.getpid()
    parts = urlsplit(url)
    proxy = env.http_proxy(parts.scheme, parts.hostname or "")
    manager = _pools.get(proxy)
    if manager is None:
        urllib3 = _urllib3()
        if proxy is None:
            manager = urllib3.PoolManager(num_pools=32, maxsize=16)
        elif urlsplit(proxy).scheme.lower().startswith("socks"):
            try:
                import socks  # noqa: F401 - PySocks; first, so that urllib3 warns of nothing missing
            except ImportError as exn:
                raise ImportError(f"the proxy {proxy} for {url} is a SOCKS proxy, which needs PySocks: "
                                  f"pip install pysocks") from exn
            from urllib3.contrib.socks import SOCKSProxyManager

            manager = SOCKSProxyManager(proxy, num_pools=32, maxsize=16)  # it takes credentials from the URL
        else:  # credentials in the proxy's URL are sent to it, as curl sends them
            credentials = _url_credentials(proxy)
            auth = {} if credentials is None else urllib3.make_headers(proxy_basic_auth=credentials)
            manager = urllib3.ProxyManager(proxy, num_pools=32, maxsize=16, proxy_headers=auth)
        _pools[proxy] = manager
    return manager


def _retry_policy(options: RemoteOptions, retries: int) -> "Retry":
    """urllib3's ``Retry`` for one request: ``retries`` tries more after a failure before a
    reply or a transient status, waiting as ``options`` says (a server's Retry-After too,
    up to ``max_backoff``), and up to ``_REDIRECTS`` redirects (credentials dropped when
    one leaves the host)."""
    return _capped_retry_class()(
        total=None, connect=retries, read=retries, status=retries, other=0, redirect=_REDIRECTS,
        allowed_methods=None, status_forcelist=_TRANSIENT_STATUSES, raise_on_status=False,
        backoff_factor=options.backoff, backoff_max=options.max_backoff, backoff_jitter=options.backoff,
        remove_headers_on_redirect=_CROSS_HOST_DROPPED)


@functools.lru_cache(maxsize=None)
def _capped_retry_class() -> Type["Retry"]:
    urllib3: Any = _urllib3()  # Any: its Retry is a base class here

    class CappedRetry(urllib3.Retry):
        """``Retry`` that waits no longer for a server's Retry-After than for its own backoff, and
        not at all after a connection refused by this machine (``refused_here``)."""

        def parse_retry_after(self, retry_after: str) -> float:
            return min(super().parse_retry_after(retry_after), self.backoff_max)

        def increment(self, method: Optional[str] = None, url: Optional[str] = None,
                      response: Optional["BaseHTTPResponse"] = None, error: Optional[Exception] = None,
                      _pool: Optional["ConnectionPool"] = None, _stacktrace: Optional[TracebackType] = None) -> "Retry":
            if error is not None and _pool is not None and refused_here(error, _pool.host):
                raise urllib3.exceptions.MaxRetryError(_pool, url, error) from error
            return super().increment(method, url, response, error, _pool, _stacktrace)

    return CappedRetry


def _excerpt(response: "BaseHTTPResponse") -> str:
    """The start of an error reply's body, for the message; the connection is then let go."""
    try:
        text = response.read(_EXCERPT, decode_content=True).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the status is the error; the body is a courtesy
        text = ""
    finally:
        response.close()
        response.release_conn()
    return f": {' '.join(text.split())}" if text else ""


def _status_error(method: str, response: "BaseHTTPResponse", where: str) -> Union[Transient, ShardError]:
    """The error for a reply of a status that is not success: a final Transient for a
    transient status (urllib3 retried it while it could), a ShardError otherwise."""
    message = f"{method} failed: HTTP {response.status} {response.reason or ''}".rstrip() + _excerpt(response)
    if response.status in _TRANSIENT_STATUSES:
        return Transient(message, final=True)
    return ShardError(message, url=where)


def _send(method: str, url: str, headers: Mapping[str, str], body: Optional[IO[bytes]], options: RemoteOptions,
          where: str, retries: int) -> "BaseHTTPResponse":
    """One HTTP exchange under :func:`_retry_policy`: the reply (of any status).

    A failure before a reply that is still there when the retries run out is a final
    :class:`Transient`; too many redirects and other failures are ShardErrors naming
    ``where``. The body (a seekable file) is rewound for each request, so a 307
    redirect resends it (AIStore's gateway redirects a PUT to a storage target).
    """
    urllib3 = _urllib3()
    errors = urllib3.exceptions
    timeout = urllib3.Timeout(connect=options.connect_timeout, read=options.read_timeout)
    manager = None
    try:
        manager = _pool_manager(url)
        return manager.urlopen(method, url, body=body, headers=headers, retries=_retry_policy(options, retries),
                               body_pos=None if body is None else 0, preload_content=False,
                               decode_content=False, timeout=timeout)
    except errors.MaxRetryError as exn:
        if exn.pool is not None and refused_here(exn.reason, exn.pool.host):
            proxy = getattr(manager, "proxy", None)
            through = proxy is not None and (exn.pool.host, exn.pool.port) == (proxy.host, proxy.port)
            raise _refused_error(method, exn.pool.host, exn.pool.port, where, through) from exn
        if isinstance(exn.reason, errors.ResponseError):  # the only one raised: too many redirects
            raise ShardError(f"{method} failed: more than {_REDIRECTS} redirects, the last to {exn.url}",
                             url=where) from exn
        if isinstance(exn.reason, (errors.ProtocolError, errors.TimeoutError, errors.NewConnectionError,
                                   ConnectionError, TimeoutError)):
            raise Transient(f"{method} failed: {exn.reason}", final=True) from exn
        raise ShardError(f"{method} failed: {exn.reason}", url=where) from exn
    except (errors.HTTPError, OSError) as exn:
        raise ShardError(f"{method} failed: {exn}", url=where) from exn


class HTTPReader(ResumableReader):
    """An HTTP(S) object streamed with urllib3; NOTE [resume protocol].

    ``headers`` are sent with every request (and dropped, as urllib3 does, for
    credentials when a redirect leaves the host). Bytes are delivered as stored:
    ``Accept-Encoding: identity`` is asked for and no Content-Encoding is undone.
    """

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, headers: Optional[Mapping[str, str]] = None,
                 origin: Optional[str] = None) -> None:
        self.headers = dict(headers or {})
        super().__init__(url, options, origin)

    def _get(self, offset: int) -> Reply:
        headers = dict(self.headers, **{"Accept-Encoding": "identity"})
        if offset:
            headers["Range"] = f"bytes={offset}-"
        response = _send("GET", self.url, headers, None, self.options, self.where,
                         self.options.retries - self._failures)
        if response.status in (200, 206):
            length = response.headers.get("Content-Length")
            return Reply(response, response.status, int(length) if length and length.isdigit() else None,
                         response.headers.get("Content-Range"), response.headers.get("ETag"))
        raise _status_error("GET", response, self.where)

    def _read(self, body: Any, view: memoryview) -> int:
        errors = _urllib3().exceptions
        try:
            data = body.read1(len(view))  # what has come, not a full view: NOTE [resume protocol]
        except (errors.HTTPError, OSError) as exn:
            raise Transient(f"GET failed: {exn}") from exn
        view[:len(data)] = data
        return len(data)

    def _drop(self, body: Any) -> None:
        body.close()  # an unfinished body's connection cannot be reused
        body.release_conn()


class HTTPWriter(SpooledUpload):
    """Bytes written are PUT to ``url`` on ``close()`` (with Content-Length, retried on failure)."""

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, headers: Optional[Mapping[str, str]] = None,
                 origin: Optional[str] = None) -> None:
        self.headers = dict(headers or {})
        super().__init__(url, options, origin)

    def _upload(self, spool: IO[bytes], size: int) -> None:
        headers = dict(self.headers, **{"Content-Length": str(size)})
        response = _send("PUT", self.url, headers, spool, self.options, self.where, self.options.retries)
        if 200 <= response.status < 300:
            response.drain_conn()
            response.release_conn()
            return
        raise _status_error("PUT", response, self.where)


def _url_credentials(url: str) -> Optional[str]:
    """``"user:password"`` of ``scheme://user:password@host/...``, %-decoded as curl decodes
    it; None when the URL has none (or cannot be parsed: its request fails on its own)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.username is None:
        return None
    return f"{unquote(parts.username)}:{unquote(parts.password or '')}"


def _with_url_credentials(url: str, headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` with the Basic authorization that credentials in ``url`` ask for, as curl
    sends it (urllib3 would drop them); an Authorization given in ``headers`` wins."""
    credentials = _url_credentials(url)
    if credentials is None or any(name.lower() == "authorization" for name in headers):
        return headers
    return dict(headers, Authorization=_urllib3().make_headers(basic_auth=credentials)["authorization"])


def open_http(url: str, mode: str = "rb", bufsize: int = 8192, headers: Optional[Mapping[str, str]] = None,
              origin: Optional[str] = None, **kw: Any) -> Union[io.BufferedReader, HTTPWriter]:
    """Open an http(s) URL: a BufferedReader over an :class:`HTTPReader`, or an :class:`HTTPWriter`.

    Keywords of :class:`RemoteOptions` set timeouts and retries; ``headers`` are
    sent with each request, with Basic authorization for credentials in the URL
    (``https://user:password@host/...``); other keywords are ignored.
    """
    options = RemoteOptions.from_kw(kw)
    headers = _with_url_credentials(url, headers or {})
    if mode == "rb":
        return buffered_reader(HTTPReader(url, options, headers, origin), bufsize)
    if mode == "wb":
        return HTTPWriter(url, options, headers, origin)
    raise ValueError(f"mode must be 'rb' or 'wb', not {mode!r}")
