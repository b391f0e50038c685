"""Open a shard URL as a binary stream: ``-``, local files, ``pipe:`` and a scheme table.

Local paths and ``file:`` URLs give ordinary ``io`` objects (a BufferedReader
when reading, so a tar splitter can ``readinto`` a large buffer). Other schemes
are looked up in :data:`gopen_schemes`, to which :func:`register_scheme` adds
more without touching this module. Built in: ``http``/``https`` and ``s3``
in-process (:mod:`wdsmp.storage.remote`, :mod:`wdsmp.storage.s3`: resumed reads, uploads on
close), ``gs`` and ``ais`` through their command-line tools (``gsutil`` or
``gcloud storage``; ``ais``), run from argument lists, never a shell.

Each call, before dispatching, :func:`gopen`

1. rewrites the URL by the first matching rule of ``GOPEN_REWRITE``, then
   ``WDS_REWRITE`` (``regex=replacement;...``; the regex is anchored at the
   start of the URL, as in webdataset), so ``WDS_REWRITE="gs://=/shared/data/"``
   reads a local mirror; errors name both URLs;
2. routes the schemes listed in ``USE_AIS_FOR`` (``gs``, ``gs:s3``) through
   AIStore, as ``ais://`` always is: over its HTTP API when ``AIS_ENDPOINT`` is
   set (``GET {AIS_ENDPOINT}/v1/objects/{bucket}/{object}?provider=gcp``), else
   with the ``ais`` command;
3. in secure mode (``WDS_SECURE=1``, or ``secure=True`` for one call; an
   argument cannot turn the variable off) refuses, after rewriting, everything
   that reaches the local machine: plain paths, ``file:``, ``pipe:`` and ``-``.

NOTE [pipe status]: a ``pipe:`` command that fails must be an error, never an
empty or short shard. Reading, the command's status is checked by the read that
finds its output at end of file (data always comes before the error), and a bad
status is raised from that read; readers therefore read to end of file;
writing, it is checked by ``close()``. A reader that closes before end of file
ends the command itself (the command then dies of SIGPIPE or SIGTERM), so that
status is ours, not the command's, and is not reported. Every path waits for
the process, so none is left a zombie.

NOTE [abandoned writes]: a writer that gives up (an exception inside ``with
TarWriter(...)``; not ``sys.exit(0)`` nor a generator closed by its consumer,
which end the writing as a normal exit does) must not leave output that looks
complete. :func:`abandon`
ends a stream opened for writing without completing it: an upload
(``http``, ``s3``) is discarded, never sent; a ``pipe:`` command is
terminated before its input ends, so a command that commits on end of input
(an uploader) does not, and what it wrote lacks the rest; a local file is
removed. The writers above it write no end-of-archive marker and no gzip
trailer, so whatever a command passed on reads as truncated, an error.
"""

import errno
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, NoReturn, Optional, Sequence, Tuple, Union, cast
from urllib.parse import quote, unquote, urlsplit

from ._internal import env
from ._internal.redact import redacted
from .errors import PipeError, SecureModeError, ShardError, ShardNotFoundError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

    from .storage.remote import HTTPWriter
    from .storage.s3 import S3Writer

_URL = Union[str, "os.PathLike[str]"]

__all__ = [
    "Pipe",
    "ais_object_url",
    "abandon",
    "gopen",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_http",
    "gopen_pipe",
    "gopen_s3",
    "gopen_schemes",
    "has_opener",
    "info",
    "local_path",
    "local_shard_stat",
    "reader",
    "register_scheme",
    "rewrite_url",
    "set_options",
]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_MODES = ("rb", "wb")
_STDERR_TAIL = 4000  # bytes of a command's stderr kept for its error message
_KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when a reader stops early


def _check_mode(mode: str) -> None:
    if mode not in _MODES:
        raise ValueError(f"mode must be 'rb' or 'wb', not {mode!r}")


class Pipe(io.RawIOBase):
    """A command's stdout ("rb") or stdin ("wb") as a binary file; see NOTE [pipe status].

    ``command`` is a shell command line (a string, run with ``shell=True``, as a
    ``pipe:`` URL is) or an argument list (run without a shell, so nothing in
    it is interpreted). ``timeout`` bounds the wait for the command once its
    output has ended (reading) or its input is closed (writing); past it the
    command is killed and PipeError raised. Statuses in ``ignore_status`` count
    as success, and ``ignore_errors=True`` accepts any status, as in webdataset.
    ``url`` names the shard in errors (default ``pipe:<command>``). Other keyword
    arguments go to ``subprocess.Popen``.
    """

    proc = _stderr = None  # class defaults: close() runs from __del__ even if __init__ failed
    origin = None  # the caller's URL, when gopen rewrote it into this command

    def __init__(self, command: Union[str, Sequence[str]], mode: str = "rb", bufsize: int = 8192,
                 timeout: float = 3600.0, ignore_status: Optional[Iterable[int]] = (), ignore_errors: bool = False,
                 url: Optional[str] = None, **popen_kw: Any) -> None:
        super().__init__()
        argv = not isinstance(command, str)
        self.command = shlex.join(command) if argv else cast(str, command)
        self.url = url or f"pipe:{self.command}"
        self.mode = mode
        _check_mode(mode)
        self.timeout = timeout
        self.ignore_status = {0, *(ignore_status or ())}
        self.ignore_errors = ignore_errors
        self.status: Optional[int] = None
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: it cannot fill up and deadlock
        popen_kw.setdefault("shell", not argv)
        stdio: Dict[str, Any] = dict(stdout=subprocess.PIPE) if mode == "rb" else dict(stdin=subprocess.PIPE)
        try:
            # bufsize > 1 keeps a BufferedReader/Writer, whose short read means end of file.
            self.proc = subprocess.Popen(list(command) if argv else command, bufsize=bufsize if bufsize > 1 else -1,
                                         stderr=self._stderr, **stdio, **popen_kw)
        except OSError as exn:
            self._stderr.close()
            raise ShardError(f"cannot start command: {exn}", url=self.url) from exn
        self._stream = cast(io.BufferedIOBase, self.proc.stdout if mode == "rb" else self.proc.stdin)

    def readable(self) -> bool:
        return self.mode == "rb"

    def writable(self) -> bool:
        return self.mode == "wb"

    def _check(self, mode: str) -> None:
        if self.closed:
            raise ValueError(f"I/O operation on closed pipe {self.url!r}")
        if self.mode != mode:
            raise io.UnsupportedOperation(f"pipe {self.url!r} was opened with mode {self.mode!r}")

    def readinto(self, b: "WriteableBuffer") -> Optional[int]:
        self._check("rb")
        n = self._stream.readinto(b)
        if not n and memoryview(b).nbytes:
            self._at_eof()
        return n

    def read(self, size: Optional[int] = -1) -> bytes:
        self._check("rb")
        data = self._stream.read(size)
        if size is None or size < 0 or (not data and size):
            self._at_eof()
        return data

    def readline(self, size: Optional[int] = -1) -> bytes:
        self._check("rb")
        line = self._stream.readline(size)
        if not line and size != 0:
            self._at_eof()
        return line

    def write(self, b: "ReadableBuffer") -> Optional[int]:
        self._check("wb")
        try:
            return self._stream.write(b)
        except BrokenPipeError as exn:
            self._broken(exn)

    def flush(self) -> None:
        super().flush()  # raises ValueError once closed
        if self.mode == "wb" and not self._stream.closed:
            try:
                self._stream.flush()
            except BrokenPipeError as exn:
                self._broken(exn)

    def close(self) -> None:
        """Finish the command (NOTE [pipe status]); idempotent."""
        if self.closed:
            return
        try:
            if self.proc is not None and self.status is None:
                if self.mode == "rb":
                    self._stop()
                else:
                    self._finish_writing()
        finally:
            self._release()
            super().close()

    def abort(self) -> None:
        """Writing: end the command before its input ends, its status unreported (NOTE
        [abandoned writes]); reading: as ``close()``. Idempotent."""
        if self.closed:
            return
        try:
            if self.proc is not None and self.status is None:
                if self.mode == "wb":
                    _end_process(self.proc)
                self._stop()
        finally:
            self._release()
            super().close()

    def _at_eof(self) -> None:
        """The command's output ended: its status decides if the data was whole."""
        if self.status is None:
            self._reap()
        self._check_status()

    def _finish_writing(self) -> None:
        try:
            self._stream.close()  # end of input for the command
        except BrokenPipeError as exn:
            self._broken(exn)
        self._reap()
        self._check_status()

    def _broken(self, exn: BaseException) -> NoReturn:
        """The command stopped reading its input: say why, or at least that it did."""
        if self.status is None:
            self._reap()
        self._check_status(exn)
        raise ShardError("command exited before reading all its input", url=self.url) from exn

    def _stop(self) -> None:
        """A reader closing early ends the command; its status is then not reported."""
        assert self.proc is not None
        try:
            self._stream.close()  # a command still writing gets SIGPIPE
        except BrokenPipeError:
            pass  # an abandoned writer's command is gone: its unread input does not matter
        _end_process(self.proc)
        self.status = self.proc.returncode

    def _reap(self) -> None:
        """Wait for the command, killing it if it outlives ``timeout``."""
        assert self.proc is not None
        try:
            self.status = self.proc.wait(self.timeout)
        except subprocess.TimeoutExpired as exn:
            self.proc.kill()
            self.status = self.proc.wait()
            note = f"\n(killed: still running {self.timeout}s after its stream ended)"
            raise PipeError(self._described(), self.status, self._stderr_tail() + note) from exn

    def _check_status(self, cause: Optional[BaseException] = None) -> None:
        if self.ignore_errors or self.status in self.ignore_status:
            return
        raise PipeError(self._described(), cast(int, self.status), self._stderr_tail()) from cause

    def _described(self) -> str:
        return self.command if self.origin is None else f"{self.command} (for {self.origin})"

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        size = self._stderr.seek(0, io.SEEK_END)
        self._stderr.seek(max(0, size - _STDERR_TAIL))
        return self._stderr.read().decode("utf-8", "replace")

    def _release(self) -> None:
        if self.proc is not None and not self._stream.closed:
            try:
                self._stream.close()
            except BrokenPipeError:
                pass  # the command is gone and its status already reported
        if self._stderr is not None:
            self._stderr.close()


def _end_process(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM, then SIGKILL after a grace period; waits for the process either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(_KILL_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def abandon(stream: Union[IO[bytes], io.IOBase]) -> None:
    """End ``stream``, opened with :func:`gopen` for writing, so that what was written never
    looks complete (NOTE [abandoned writes]): its ``abort()`` where it has one (uploads,
    ``pipe:``), else close it and remove the local regular file it wrote (never a symbolic
    link's target, a device or a FIFO)."""
    abort = getattr(stream, "abort", None)
    if abort is not None:
        abort()
        return
    path = getattr(stream, "name", None)
    stream.close()
    if isinstance(path, str) and os.path.isfile(path) and not os.path.islink(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class _Borrowed(io.RawIOBase):
    """stdin or stdout lent to a caller: close() flushes but keeps the process's stream open."""

    def __init__(self, stream: Any, mode: str) -> None:  # a binary standard stream, or what replaced it
        super().__init__()
        self._stream = stream
        self.mode = mode

    def readable(self) -> bool:
        return self.mode == "rb"

    def writable(self) -> bool:
        return self.mode == "wb"

    def _open(self) -> Any:
        if self.closed:
            raise ValueError("I/O operation on closed standard stream")
        return self._stream

    def readinto(self, b: "WriteableBuffer") -> Optional[int]:
        return self._open().readinto(b)

    def read(self, size: Optional[int] = -1) -> bytes:
        return self._open().read(size)

    def readline(self, size: Optional[int] = -1) -> bytes:
        return self._open().readline(size)

    def write(self, b: "ReadableBuffer") -> Optional[int]:
        return self._open().write(b)

    def flush(self) -> None:
        super().flush()
        if self.mode == "wb":
            self._stream.flush()


def _standard_stream(mode: str) -> _Borrowed:
    if mode == "rb":
        return _Borrowed(getattr(sys.stdin, "buffer", sys.stdin), mode)
    sys.stdout.flush()  # text printed before comes first
    return _Borrowed(getattr(sys.stdout, "buffer", sys.stdout), mode)


def _as_url(url: _URL) -> str:
    """URLs are strings; a ``pathlib.Path`` is accepted as the path it names."""
    return os.fspath(url) if isinstance(url, os.PathLike) else url


def local_path(url: _URL) -> Optional[str]:
    """The filesystem path a plain path or ``file:`` URL names, else None."""
    url = _as_url(url)
    if not isinstance(url, str) or url == "-":
        return None
    match = _SCHEME.match(url)
    if match is None:
        return url
    if match.group(1).lower() != "file":
        return None
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        return None
    return unquote(parts.path)


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def local_shard_stat(path: str, url: Optional[str] = None) -> os.stat_result:
    """The ``os.stat_result`` of the local shard file ``path`` (named ``url`` in errors), or a
    ShardError saying what the path is instead of a regular file: ``ShardNotFoundError`` "no
    such file", "symlink loop", "is a directory", "not a regular file" (a FIFO, a device, a
    socket; through a symbolic link, its target is named).

    The rule every reader of local shards applies before it opens one (the loaders' counts,
    their span walks and their workers, ``wdsmp bench``), so each kind of path is named the
    same way everywhere and nothing that is not a regular file is ever opened as a shard:
    opening a FIFO for reading waits for a writer, forever; ``/dev/zero`` gives endless zeros
    and ``/dev/null`` none. It only looks (``os.stat``, ``os.lstat``), never opens."""
    url = path if url is None else url
    where = "" if path == url else f"{path!r}: "
    try:
        info = os.stat(path)
    except OSError as exn:
        if exn.errno == errno.ELOOP:
            raise ShardError(f"{where}symlink loop: its symbolic links lead back to themselves, never to a file "
                             f"({exn.strerror})", url=url) from exn
        if exn.errno in (errno.ENOENT, errno.ENOTDIR):
            target = _link_target(path)
            dangling = "" if target is None else f" (a symbolic link to {target!r}, which does not exist)"
            raise ShardNotFoundError(("no such file" if not where else f"no such file {path!r}") + dangling,
                                     url=url) from exn
        raise ShardError(f"{where}cannot read the shard file: {exn.strerror or exn}", url=url) from exn
    target = _link_target(path)
    link = "" if target is None else f" (by a symbolic link to {target!r})"
    if stat.S_ISDIR(info.st_mode):
        raise ShardError(f"{where}is a directory{link}, not a shard file", url=url)
    if not stat.S_ISREG(info.st_mode):
        kind = next((f" but {name}" for test, name in _KINDS if test(info.st_mode)), "")
        raise ShardError(f"{where}not a regular file{kind}{link}: a shard is read from a regular file, "
                         f"never from a FIFO or a device", url=url)
    return info


def _link_target(path: str) -> Optional[str]:
    """What the symbolic link ``path`` points to, or None where it is none (or is gone)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def gopen_file(url: _URL, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """Open a local path or ``file:`` URL; options meant for other schemes are ignored."""
    _check_mode(mode)
    url = _as_url(url)
    path = local_path(url)
    if path is None:
        raise ShardError("not a local file URL (file: URLs must have no host or localhost)", url=url)
    try:
        return open(path, mode, buffering=bufsize)
    except OSError as exn:
        action = "reading" if mode == "rb" else "writing"
        error = ShardNotFoundError if isinstance(exn, FileNotFoundError) else ShardError
        raise error(f"cannot open {path!r} for {action}: {exn.strerror or exn}", url=url) from exn


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192, timeout: float = 3600.0,
               ignore_status: Optional[Iterable[int]] = (), ignore_errors: bool = False, **kw: Any) -> Pipe:
    """Run the shell command after ``pipe:``; see NOTE [pipe status]."""
    if not url.startswith("pipe:"):
        raise ValueError(f"not a pipe: URL: {url!r}")
    return Pipe(url[len("pipe:"):], mode=mode, bufsize=bufsize, timeout=timeout,
                ignore_status=ignore_status, ignore_errors=ignore_errors)


def gopen_http(url: str, mode: str = "rb", bufsize: int = 8192,
               **kw: Any) -> Union[io.BufferedReader, "HTTPWriter"]:
    """``http://`` and ``https://`` in-process: reads resume where they broke, writes PUT on close.

    Keywords: ``connect_timeout``, ``read_timeout``, ``retries``, ``backoff``,
    ``max_backoff`` (see :class:`wdsmp.storage.remote.RemoteOptions`) and ``headers``.
    """
    from .storage.remote import open_http

    return open_http(url, mode, bufsize, **kw)


def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Union[io.BufferedReader, "S3Writer"]:
    """``s3://bucket/key`` with boto3 (configured by the standard AWS variables); as :func:`gopen_http`."""
    from .storage.s3 import open_s3

    return open_s3(url, mode, bufsize, **kw)


# The command-line tools of the gs and ais schemes: argument lists, "{url}" marks the URL's place.
_TOOLS: Dict[str, Dict[str, Tuple[Tuple[str, ...], ...]]] = {
    "gs": {"rb": (("gsutil", "cat", "{url}"), ("gcloud", "storage", "cat", "{url}")),
           "wb": (("gsutil", "cp", "-", "{url}"), ("gcloud", "storage", "cp", "-", "{url}"))},
    "ais": {"rb": (("ais", "get", "{url}", "-"),),
            "wb": (("ais", "put", "-", "{url}"),)},
    "curl": {"rb": (("curl", "--connect-timeout", "30", "--retry", "5", "-f", "-s", "-S", "-L", "{url}"),),
             "wb": (("curl", "-f", "-s", "-S", "-L", "-T", "-", "{url}"),)},
}
_TOOL_HINTS = {
    "gs": "install the Google Cloud SDK, or set USE_AIS_FOR=gs and AIS_ENDPOINT to read through AIStore",
    "ais": "install the AIStore CLI, or set AIS_ENDPOINT to use AIStore's HTTP API",
    "curl": "install curl, or use http(s):// URLs, which wdsmp reads in-process",
}


def _tool_pipe(tool: str, url: str, mode: str, bufsize: int, timeout: float) -> Pipe:
    """Run the first of the tool's commands found on PATH, as a Pipe (NOTE [pipe status])."""
    _check_mode(mode)
    templates = _TOOLS[tool][mode]
    for template in templates:
        if shutil.which(template[0]):
            argv = [url if part == "{url}" else part for part in template]
            return Pipe(argv, mode=mode, bufsize=bufsize, timeout=timeout, url=url)
    names = " or ".join(repr(t[0]) for t in templates)
    raise ShardError(f"command-line tool {names} not found on PATH ({_TOOL_HINTS[tool]})", url=url)


def gopen_gsutil(url: str, mode: str = "rb", bufsize: int = 8192, timeout: float = 3600.0, **kw: Any) -> Pipe:
    """``gs://`` with ``gsutil cat`` / ``gsutil cp - URL`` (or ``gcloud storage`` when gsutil is absent)."""
    return _tool_pipe("gs", url, mode, bufsize, timeout)


def gopen_curl(url: str, mode: str = "rb", bufsize: int = 8192, timeout: float = 3600.0, **kw: Any) -> Pipe:
    """Any URL curl can fetch, through ``curl`` (webdataset's HTTP opener); a failing status is an error."""
    return _tool_pipe("curl", url, mode, bufsize, timeout)


def gopen_htgs(url: str, mode: str = "rb", bufsize: int = 8192,
               **kw: Any) -> Union[io.BufferedReader, "HTTPWriter"]:
    """``htgs://bucket/object``: a public Google Cloud Storage object over HTTPS, read-only."""
    if mode != "rb":
        raise ValueError(f"htgs:// URLs are read-only, not {mode!r}: {url!r}")
    from .storage.remote import open_http

    rest = re.sub(r"(?i)^htgs://", "", url)
    return open_http(f"https://storage.googleapis.com/{rest}", mode, bufsize, origin=url, **kw)


def gopen_hf(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Union[io.BufferedReader, "HTTPWriter"]:
    """``hf://datasets/org/name/path``: a Hugging Face Hub file over HTTPS, with the user's token."""
    if mode != "rb":
        raise ValueError(f"hf:// URLs are read-only, not {mode!r}: {url!r}")
    try:
        from huggingface_hub import HfFileSystem, get_token, hf_hub_url
    except ImportError:
        raise ShardError("hf:// URLs need huggingface_hub (pip install huggingface_hub)", url=url) from None
    from .storage.remote import open_http

    where = HfFileSystem().resolve_path(url)
    http_url = hf_hub_url(repo_id=where.repo_id, filename=where.path_in_repo, repo_type=where.repo_type,
                          revision=where.revision)
    token = get_token()
    headers = dict(kw.pop("headers", None) or {})
    if token:
        headers.setdefault("Authorization", f"Bearer {token}")
    return open_http(http_url, mode, bufsize, origin=url, headers=headers, **kw)


# AIStore's provider names for URL schemes (it also knows the gs/s3/az aliases; be explicit).
_AIS_PROVIDERS = {"gs": "gcp", "gcp": "gcp", "s3": "aws", "aws": "aws", "az": "azure", "azure": "azure",
                  "ais": "ais", "oci": "oci"}


def ais_object_url(endpoint: str, url: str) -> str:
    """The AIStore HTTP API URL of ``scheme://bucket/object``:
    ``{endpoint}/v1/objects/{bucket}/{object}?provider=...``."""
    scheme, sep, rest = url.partition("://")
    bucket, _, name = rest.partition("/")
    if not sep or not bucket or not name:
        raise ShardError("an AIStore object URL needs a bucket and an object: scheme://bucket/object", url=url)
    provider = _AIS_PROVIDERS.get(scheme.lower(), scheme.lower())
    return f"{endpoint}/v1/objects/{quote(bucket, safe='')}/{quote(name)}?provider={provider}"


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192, timeout: float = 3600.0,
              **kw: Any) -> Union[Pipe, io.BufferedReader, "HTTPWriter"]:
    """``ais://`` (and the schemes of ``USE_AIS_FOR``) through AIStore.

    With ``AIS_ENDPOINT`` set, in-process over AIStore's HTTP API (as
    :func:`gopen_http`, redirects to storage targets followed); otherwise with
    ``ais get URL -`` / ``ais put - URL``.
    """
    endpoint = env.ais_endpoint()
    if endpoint is None:
        return _tool_pipe("ais", url, mode, bufsize, timeout)
    from .storage.remote import open_http

    return open_http(ais_object_url(endpoint, url), mode, bufsize, origin=url, **kw)


def gopen_error(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> NoReturn:
    """The opener of last resort: say which schemes there are."""
    match = _SCHEME.match(url)
    scheme = match.group(1) if match else url
    known = ", ".join(s for s in gopen_schemes if not s.startswith("__"))
    raise ShardError(f"no opener for URL scheme {scheme!r} (known schemes: {known}; "
                     f"add one with wdsmp.gopen.register_scheme)", url=url)


gopen_schemes: Dict[str, Callable[..., Any]] = {
    "__default__": gopen_error,
    "file": gopen_file,
    "pipe": gopen_pipe,
    "http": gopen_http,
    "https": gopen_http,
    "s3": gopen_s3,
    "gs": gopen_gsutil,
    "ais": gopen_ais,
    "htgs": gopen_htgs,
    "hf": gopen_hf,
}

info: dict = {}  # webdataset's module-level dict of opener state; wdsmp keeps nothing in it


def set_options(obj: object, timeout: Optional[float] = None, ignore_errors: Optional[bool] = None,
                ignore_status: Optional[Iterable[int]] = None,
                handler: Optional[Callable[[Exception], Any]] = None) -> bool:
    """Change a ``Pipe``'s timeout and status policy after opening; False for other streams.

    ``handler`` is accepted for webdataset's signature: a Pipe raises its errors.
    """
    obj = getattr(obj, "raw", obj)
    if not isinstance(obj, Pipe):
        return False
    if timeout is not None:
        obj.timeout = timeout
    if ignore_errors is not None:
        obj.ignore_errors = ignore_errors
    if ignore_status is not None:
        obj.ignore_status = {0, *ignore_status}
    return True


def register_scheme(scheme: str, opener: Callable[..., Any]) -> Optional[Callable[..., Any]]:
    """Make ``opener(url, mode, bufsize, **kw)`` open URLs ``scheme:...``; returns the old one."""
    if not isinstance(scheme, str) or not (scheme == "__default__" or _SCHEME.fullmatch(scheme + ":")):
        raise ValueError(f"not a URL scheme name: {scheme!r}")
    if not callable(opener):
        raise TypeError(f"opener for scheme {scheme!r} is not callable: {opener!r}")
    scheme = scheme if scheme == "__default__" else scheme.lower()
    previous = gopen_schemes.get(scheme)
    gopen_schemes[scheme] = opener
    return previous


def rewrite_url(url: str) -> str:
    """``url`` after the first ``GOPEN_REWRITE`` / ``WDS_REWRITE`` rule whose regex matches its start."""
    for variable, pattern, replacement in env.rewrite_rules():
        try:
            match = re.match(pattern, url)
            if match is not None:
                return match.expand(replacement) + url[match.end():]
        except re.error as exn:
            raise ValueError(f"environment variable {variable}: bad rule {pattern!r}={replacement!r}: {exn}") from exn
    return url


def _refuse_if_insecure(url: str, secure: bool) -> None:
    """Secure mode refuses what reaches the local machine: paths, file:, pipe:, ``-``."""
    cause = "secure=True" if secure else "WDS_SECURE=1" if env.secure() else None
    if cause is None:
        return
    if url == "-":
        what = "standard input and output ('-') are"
    elif local_path(url) is not None:
        what = "local files are"
    elif url.lower().startswith("pipe:"):
        what = "pipe: URLs (shell commands) are"
    else:
        return
    raise SecureModeError(f"{what} refused in secure mode (set by {cause})", url=url)


def _through_ais(url: str) -> bool:
    """Whether ``USE_AIS_FOR`` routes ``url`` (by its scheme) through AIStore."""
    match = _SCHEME.match(url)
    return match is not None and match.group(1).lower() in env.ais_schemes()


def _opener(url: str) -> Callable[..., Any]:
    match = _SCHEME.match(url)
    if match is None:
        return gopen_file
    if _through_ais(url):
        return gopen_ais
    return gopen_schemes.get(match.group(1).lower()) or gopen_schemes.get("__default__", gopen_error)


def has_opener(url: _URL) -> bool:
    """Whether ``gopen`` knows how to open ``url`` (after rewriting): ``-``, a local path, or
    a scheme with an opener, so that a tool can call an unknown scheme a usage error before
    it opens anything."""
    url = rewrite_url(_as_url(url))
    return url == "-" or _opener(url) is not gopen_error


def gopen(url: Union[str, "os.PathLike[str]"], mode: str = "rb", bufsize: int = 8192, *, secure: bool = False,
          **kw: Any) -> IO[bytes]:
    """Open ``url`` for reading ("rb") or writing ("wb") as a binary stream.

    ``-`` is stdin or stdout (closing the stream leaves them open); a path
    without a scheme is a local file; ``scheme:...`` goes to the opener in
    :data:`gopen_schemes`, which receives ``kw``. URLs are rewritten, routed
    through AIStore and checked for secure mode first, as the module says;
    ``secure=True`` turns secure mode on for this call.
    """
    _check_mode(mode)
    given = _as_url(url)
    url = rewrite_url(given) if isinstance(given, str) else given
    if env.gopen_verbose():
        route = " through AIStore (USE_AIS_FOR)" if isinstance(url, str) and _through_ais(url) else ""
        print(f"# gopen {redacted(given)!r}" + (f" -> {redacted(url)!r}" if url != given else "") + route,
              file=sys.stderr)
    try:
        _refuse_if_insecure(url, secure)
        if url == "-":
            return cast(IO[bytes], _standard_stream(mode))
        stream = _opener(url)(url, mode, bufsize, **kw)
    except ShardError as exn:
        if url == given:
            raise
        raise ShardError(f"{exn.problem}; URL rewritten from {given!r}", exn.url, exn.member, exn.offset) from exn
    if url != given:
        raw = getattr(stream, "raw", stream)
        if hasattr(raw, "origin"):
            raw.origin = given
    return stream


def reader(url: Union[str, "os.PathLike[str]"], **kw: Any) -> IO[bytes]:
    """Open ``url`` for reading (webdataset's name)."""
    return gopen(url, "rb", **kw)
