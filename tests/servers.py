"""Real servers on 127.0.0.1 for tests of remote URLs, as pytest fixtures.

``http_server``: a threaded HTTP/1.1 file server over a per-test directory,
with Range, ETag, PUT uploads, a request log, and faults a test sets per path
(an error status, a connection reset or a short body after some bytes, a
stall, a trickle, a redirect, a Range request answered with the whole object).
``s3_server``: moto's S3 as a real server over HTTP, with the AWS variables
(dummy credentials, region, ``AWS_ENDPOINT_URL``) pointing at it.
``http_proxy``: a forwarding HTTP proxy, with the proxy variables cleared.

The servers live for the session; the function-scoped fixtures reset them.
"""

import http.client
import os
import re
import socket
import struct
import sys
import threading
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

__all__ = ["Fault", "FileServer", "ForwardProxy", "Request", "S3Server", "http_proxy", "http_server", "s3_server",
           "without_proxies"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
FAULT_KINDS = ("status", "reset", "short", "stall", "trickle", "redirect", "ignore_range")


@dataclass(frozen=True)
class Request:
    """One request as the server saw it."""

    method: str
    path: str  # with the query string
    range: str = None
    headers: dict = None
    size: int = None  # bytes of a PUT body


@dataclass
class Fault:
    """What goes wrong on the next ``times`` requests for a path (``times=None``: all of them).

    ``status``: answer ``status`` (with ``retry_after`` if given); ``reset``: send
    ``after`` body bytes, then reset the connection; ``short``: send ``after`` body
    bytes of the Content-Length promised, then close; ``stall``: send ``after``
    bytes, then wait ``seconds``; ``trickle``: send ``after`` bytes, then one byte
    every ``seconds``; ``redirect``: 307 to ``location``;
    ``ignore_range``: answer a Range request with 200 and the whole object (also with
    ``whole=True``, whatever the kind). ``method`` is the request method it applies to; PUT
    knows ``status`` and ``redirect``.
    """

    kind: str
    times: int = 1
    method: str = "GET"
    status: int = 500
    after: int = 0
    seconds: float = 2.0
    location: str = None
    retry_after: str = None
    whole: bool = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client's connection pool is exercised

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):
        self.server.files.serve_get(self)

    def do_PUT(self):
        self.server.files.serve_put(self)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, files):
        self.files = files
        self.resets = set()  # ids of sockets to close with RST instead of FIN
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is a test's doing
            super().handle_error(request, client_address)

    def shutdown_request(self, request):
        if id(request) in self.resets:
            self.resets.discard(id(request))
            request.close()  # SO_LINGER 0 is set: the close resets the connection
            return
        super().shutdown_request(request)


class FileServer:
    """Serves ``root`` over HTTP on 127.0.0.1; see the module docstring."""

    def __init__(self):
        self.root = None
        self.log = []
        self._faults = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs=dict(poll_interval=0.05),
                                        daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def reset(self, root):
        with self._lock:
            self.root = Path(root) if root is not None else None
            self.log = []
            self._faults = {}
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)

    def url(self, path):
        return f"{self.endpoint}/{path.lstrip('/')}"

    def put_file(self, path, data):
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return self.url(path)

    def file(self, path):
        return (self.root / path.lstrip("/")).read_bytes()

    def fault(self, path, kind, times=1, **kw):
        """Make the next ``times`` requests for ``path`` fail as ``kind`` (see :class:`Fault`).

        Faults set for one path are used up in the order they were set.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, not {kind!r}")
        with self._lock:
            self._faults.setdefault("/" + path.lstrip("/"), []).append(Fault(kind, times, **kw))

    def requests(self, path=None, method=None):
        with self._lock:
            log = list(self.log)
        return [r for r in log if (path is None or urlsplit(r.path).path == "/" + path.lstrip("/"))
                and (method is None or r.method == method)]

    # the handler's side

    def _take_fault(self, path, method):
        with self._lock:
            queue = self._faults.get(path, [])
            fault = next((f for f in queue if f.method == method), None)
            if fault is not None and fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    queue.remove(fault)
            return fault

    def _record(self, handler, size=None):
        with self._lock:
            self.log.append(Request(handler.command, handler.path, handler.headers.get("Range"),
                                    dict(handler.headers), size))

    def _local(self, path):
        if self.root is None:
            return None
        target = (self.root / unquote(path).lstrip("/")).resolve()
        return target if target.is_relative_to(self.root.resolve()) else None

    def _reply(self, handler, status, body=b"", headers=()):
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def serve_get(self, handler):
        path = urlsplit(handler.path).path
        self._record(handler)
        fault = self._take_fault(path, "GET")
        kind = fault.kind if fault else None
        if kind == "status":
            extra = [("Retry-After", fault.retry_after)] if fault.retry_after else []
            return self._reply(handler, fault.status, b"injected failure", extra)
        if kind == "redirect":
            return self._reply(handler, 307, b"", [("Location", fault.location)])
        target = self._local(path)
        if target is None or not target.is_file():
            return self._reply(handler, 404, b"no such file")
        data = target.read_bytes()
        stat = target.stat()
        headers = [("ETag", f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'), ("Accept-Ranges", "bytes"),
                   ("Content-Type", "application/octet-stream")]
        status, body = 200, data
        match = _RANGE.fullmatch(handler.headers.get("Range", "").strip())
        if match and kind != "ignore_range" and not (fault and fault.whole):
            start = int(match.group(1))
            end = min(int(match.group(2)), len(data) - 1) if match.group(2) else len(data) - 1
            if start >= len(data):
                return self._reply(handler, 416, b"", [("Content-Range", f"bytes */{len(data)}")])
            status, body = 206, data[start:end + 1]
            headers.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
        if kind not in ("reset", "short", "stall", "trickle"):
            return self._reply(handler, status, body, headers)
        handler.close_connection = True
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[:fault.after])
        if kind == "reset":
            self._stop.wait(0.1)  # let the client take the bytes sent: a reset may discard unread ones
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._server.resets.add(id(handler.connection))
        elif kind == "stall":
            self._stop.wait(fault.seconds)
            try:
                handler.wfile.write(body[fault.after:])
            except OSError:
                pass  # the client gave up waiting, as it should
        elif kind == "trickle":
            try:
                for i in range(fault.after, len(body)):
                    if self._stop.wait(fault.seconds):
                        break
                    handler.wfile.write(body[i:i + 1])
                    handler.wfile.flush()
            except OSError:
                pass  # the client gave up, as it should

    def serve_put(self, handler):
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    handler.rfile.readline()
                    break
                data += handler.rfile.read(size)
                handler.rfile.readline()
            data = bytes(data)
        else:
            data = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        path = urlsplit(handler.path).path
        self._record(handler, len(data))
        fault = self._take_fault(path, "PUT")
        if fault is not None and fault.kind == "status":
            return self._reply(handler, fault.status, b"injected failure")
        if fault is not None and fault.kind == "redirect":
            return self._reply(handler, 307, b"", [("Location", fault.location)])
        target = self._local(path)
        if target is None:
            return self._reply(handler, 403, b"outside the served directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return self._reply(handler, 201)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    _HOP_BY_HOP = ("connection", "keep-alive", "proxy-connection", "proxy-authorization", "transfer-encoding")

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _forward(self):
        target = urlsplit(self.path)
        self.server.log.append(self.path)
        self.server.authorizations.append(self.headers.get("Proxy-Authorization"))
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if self.command == "PUT" else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self._HOP_BY_HOP}
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            connection.request(self.command, target.path + (f"?{target.query}" if target.query else ""),
                               body=body, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
        finally:
            connection.close()
        self.send_response(reply.status, reply.reason)
        for name, value in reply.getheaders():
            if name.lower() not in self._HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = _forward


class ForwardProxy:
    """A forwarding HTTP proxy on 127.0.0.1 (requests with absolute URIs, replies relayed
    whole); ``log`` holds the URIs it was asked for, ``authorizations`` their Proxy-Authorization."""

    def __init__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.daemon_threads = True
        self._server.log = self.log = []
        self._server.authorizations = self.authorizations = []
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs=dict(poll_interval=0.05),
                                        daemon=True)
        self._thread.start()

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class S3Server:
    """moto's S3 on 127.0.0.1 as a real server (not moto's in-process mocks)."""

    region = "us-east-1"

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        self.port = self._moto.get_host_and_port()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._client = None

    def stop(self):
        self._moto.stop()

    def reset(self):
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()

    def client(self):
        if self._client is None:
            import boto3

            self._client = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint, region_name=self.region,
                aws_access_key_id="testing", aws_secret_access_key="testing")
        return self._client

    def create_bucket(self, bucket):
        self.client().create_bucket(Bucket=bucket)

    def put(self, bucket, key, data):
        self.client().put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def get(self, bucket, key):
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def aws_environment(monkeypatch, tmp_path, endpoint, region="us-east-1"):
    """Point boto3 at ``endpoint`` with dummy credentials, and away from the user's AWS files."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def _file_server():
    server = FileServer()
    yield server
    server.stop()


def without_proxies(monkeypatch):
    """Unset the proxy variables, which http(s) URLs follow: requests to 127.0.0.1 go there directly."""
    for name in list(os.environ):
        if name.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture
def http_server(_file_server, tmp_path):
    """The session's :class:`FileServer`, serving a fresh ``tmp_path/"http"``, no faults, empty log."""
    _file_server.reset(tmp_path / "http")
    yield _file_server
    _file_server.reset(None)


@pytest.fixture(scope="session")
def _moto_server():
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_server(_moto_server, monkeypatch, tmp_path):
    """The session's :class:`S3Server`, emptied, with the AWS variables pointing at it."""
    _moto_server.reset()
    aws_environment(monkeypatch, tmp_path, _moto_server.endpoint, _moto_server.region)
    return _moto_server


@pytest.fixture(scope="session")
def _proxy_server():
    server = ForwardProxy()
    yield server
    server.stop()


@pytest.fixture
def http_proxy(_proxy_server, monkeypatch):
    """The session's :class:`ForwardProxy`, its log emptied, and no proxy variable set (a test sets them)."""
    without_proxies(monkeypatch)
    _proxy_server.log.clear()
    _proxy_server.authorizations.clear()
    return _proxy_server
