"""``s3://bucket/key`` through boto3, with the resume and upload protocol of :mod:`wdsmp.storage.remote`.

boto3 finds the endpoint, region and credentials itself, from the standard AWS
environment and configuration files (``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...). Its own retries are turned off:
wdsmp retries (NOTE [resume protocol]) so that one policy, set by the same
keywords as for HTTP, covers both the request and the body, and a dropped body
resumes with ``Range`` (and ``If-Match``, so a replaced object is an error)
instead of starting over. boto3 is imported when the first ``s3://`` URL is opened.
"""

import os
import threading
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Optional, Tuple, Union
from urllib.parse import urlsplit

from .._internal import env
from ..errors import ShardError
from .remote import RemoteOptions, Reply, ResumableReader, SpooledUpload, Transient, buffered_reader, refused_here

if TYPE_CHECKING:
    import io

__all__ = ["S3Reader", "S3Writer", "open_s3", "s3_client", "split_s3_url"]

_TRANSIENT_CODES = frozenset({
    "InternalError", "RequestTimeout", "ServiceUnavailable", "SlowDown", "Throttling",
    "ThrottlingException", "RequestLimitExceeded",
})
_CACHE_LIMIT = 8
_clients: dict = {}
_lock = threading.Lock()


def _boto3() -> ModuleType:
    try:
        import boto3
    except ImportError as exn:
        raise ImportError("s3:// URLs need boto3: pip install boto3") from exn
    return boto3


def s3_client(options: Optional[RemoteOptions] = None) -> Any:
    """A boto3 S3 client for this process, AWS environment and timeouts; cached, as clients are slow to make."""
    options = options or RemoteOptions()
    key = (os.getpid(), env.aws_environment(), options.connect_timeout, options.read_timeout)
    with _lock:  # boto3 sessions are not thread-safe; the clients they make are
        client = _clients.get(key)
        if client is None:
            boto3 = _boto3()
            from botocore.config import Config

            config = Config(connect_timeout=options.connect_timeout, read_timeout=options.read_timeout,
                            retries={"total_max_attempts": 1})
            client = boto3.session.Session().client("s3", config=config)
            if len(_clients) >= _CACHE_LIMIT:
                _clients.clear()
            _clients[key] = client
    return client


def _client_for(url: str, options: Optional[RemoteOptions]) -> Any:
    """:func:`s3_client`; AWS settings it cannot use (a missing profile, a malformed endpoint)
    are a ShardError naming ``url``."""
    _boto3()  # first: its ImportError says what to install
    from botocore.exceptions import BotoCoreError  # botocore comes with boto3

    try:
        return s3_client(options)
    except (BotoCoreError, ValueError) as exn:
        raise ShardError(f"cannot make an S3 client from the AWS settings: {exn}", url=url) from exn


def split_s3_url(url: str) -> Tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; the key is taken as written (no %-decoding)."""
    if not url.lower().startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket or not key:
        raise ShardError("an s3:// URL needs a bucket and a key: s3://bucket/key", url=url)
    return bucket, key


def _convert(action: str, exn: BaseException, url: str) -> Optional[Union[Transient, ShardError]]:
    """A boto3 failure as :class:`Transient` (worth retrying) or ShardError; None if it is neither."""
    import botocore.exceptions as bce
    from urllib3.exceptions import HTTPError

    seen: Optional[BaseException] = exn
    while seen is not None:  # upload_fileobj may wrap the client's error
        if isinstance(seen, bce.ClientError):
            meta = seen.response.get("ResponseMetadata", {})
            error = seen.response.get("Error", {})
            status, code = meta.get("HTTPStatusCode", 0), error.get("Code", "")
            message = f"{action} failed: HTTP {status} {code}: {error.get('Message', '')}".rstrip(": ")
            if status in (408, 429) or (status >= 500 and status not in (501, 505)) or code in _TRANSIENT_CODES:
                return Transient(message)
            return ShardError(message, url=url)
        if isinstance(seen, bce.EndpointConnectionError):
            endpoint = urlsplit(seen.kwargs.get("endpoint_url", ""))
            if refused_here(seen, endpoint.hostname):
                return ShardError(f"{action} failed: connection refused by {endpoint.netloc}, on this machine: "
                                  f"nothing listens there (not retried: start the server, or check "
                                  f"AWS_ENDPOINT_URL)", url=url)
        if isinstance(seen, (bce.HTTPClientError, bce.ConnectionError, bce.IncompleteReadError, HTTPError,
                             ConnectionError, TimeoutError)):
            return Transient(f"{action} failed: {seen}")
        seen = seen.__cause__ or seen.__context__
    if isinstance(exn, bce.BotoCoreError):
        return ShardError(f"{action} failed: {exn}", url=url)
    return None


class S3Reader(ResumableReader):
    """An S3 object streamed with ``get_object``; NOTE [resume protocol]."""

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, origin: Optional[str] = None) -> None:
        self.bucket, self.key = split_s3_url(url)
        self.client = _client_for(url, options)
        super().__init__(url, options, origin)

    def _get(self, offset: int) -> Reply:
        args = dict(Bucket=self.bucket, Key=self.key)
        if offset:
            args["Range"] = f"bytes={offset}-"
            if self.etag is not None:
                args["IfMatch"] = self.etag
        try:
            reply = self.client.get_object(**args)
        except Exception as exn:
            converted = _convert("GET", exn, self.where)
            if converted is None:
                raise
            raise converted from exn
        status = reply.get("ResponseMetadata", {}).get("HTTPStatusCode", 200)
        return Reply(reply["Body"], status, reply.get("ContentLength"), reply.get("ContentRange"), reply.get("ETag"))

    def _read(self, body: Any, view: memoryview) -> int:
        try:
            return body.readinto(view)
        except Exception as exn:
            converted = _convert("GET", exn, self.where)
            if converted is None:
                raise
            raise converted from exn

    def _drop(self, body: Any) -> None:
        body.close()


class _Lent:
    """The spool as lent to s3transfer, which closes what it uploads: a retry needs it open."""

    def __init__(self, spool: IO[bytes]) -> None:
        self._spool = spool

    def read(self, size: int = -1) -> bytes:
        return self._spool.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._spool.seek(offset, whence)

    def tell(self) -> int:
        return self._spool.tell()

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        pass  # SpooledUpload.close() closes the spool when the upload is over


class S3Writer(SpooledUpload):
    """Bytes written are uploaded on ``close()`` with ``upload_fileobj`` (multipart when large)."""

    def __init__(self, url: str, options: Optional[RemoteOptions] = None, origin: Optional[str] = None) -> None:
        self.bucket, self.key = split_s3_url(url)
        self.client = _client_for(url, options)
        super().__init__(url, options, origin)

    def _upload(self, spool: IO[bytes], size: int) -> None:
        try:
            self.client.upload_fileobj(_Lent(spool), self.bucket, self.key)
        except Exception as exn:
            converted = _convert("PUT", exn, self.where)
            if converted is None:
                raise
            raise converted from exn


def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, origin: Optional[str] = None,
            **kw: Any) -> Union["io.BufferedReader", S3Writer]:
    """Open an s3:// URL: a BufferedReader over an :class:`S3Reader`, or an :class:`S3Writer`.

    Keywords of :class:`~wdsmp.storage.remote.RemoteOptions` set timeouts and retries; others are ignored.
    """
    options = RemoteOptions.from_kw(kw)
    if mode == "rb":
        return buffered_reader(S3Reader(url, options, origin), bufsize)
    if mode == "wb":
        return S3Writer(url, options, origin)
    raise ValueError(f"mode must be 'rb' or 'wb', not {mode!r}")
