"""Exception types of wdsmp.

Every error subclasses :class:`WdsmpError` and the builtin type webdataset
raises in the same case, so ``except`` clauses written for webdataset keep
catching: a damaged tar or gzip shard is a ``tarfile.ReadError`` (and a
``ValueError``), a missing field a ``KeyError`` as well as a ``ValueError``
(webdataset raises the one in ``map_dict``, the other in ``to_tuple`` and
``rename``), a missing local shard a ``FileNotFoundError``, a URL that secure
mode refuses a ``ValueError``. Code that wants
to can catch everything wdsmp raises.

Errors about data carry where it happened: the shard URL, the tar member and
the byte offset in the (decompressed) tar stream, both as attributes and in the
message, so a log line is enough to find the bad bytes. Messages show URLs with
their passwords masked (``_redact.py``); the ``url`` attribute keeps the URL as given.
"""

import tarfile
from typing import Any, Optional, Tuple, Type, cast

from ._internal.redact import redacted

__all__ = [
    "WdsmpError",
    "ShardError",
    "ShardNotFoundError",
    "SecureModeError",
    "TarFormatError",
    "SampleError",
    "MissingFieldError",
    "DecodeError",
    "WorkerError",
    "PipeError",
]


def _where(url: Optional[str], member: Optional[str] = None, offset: Optional[int] = None) -> str:
    """Text naming the place of an error: shard, member and byte offset."""
    parts = [f"shard {redacted(url)!r}" if url is not None else "shard <stream>"]
    if member is not None:
        parts.append(f"member {member!r}")
    if offset is not None:
        parts.append(f"offset {offset}")
    return ", ".join(parts)


class WdsmpError(Exception):
    """Base class of every exception wdsmp raises on purpose."""


class _Located:
    """Mixin: an error with a shard URL, a member name and a byte offset."""

    def __init__(self, problem: str, url: Optional[str] = None, member: Optional[str] = None,
                 offset: Optional[int] = None) -> None:
        self.problem = problem
        self.url = url
        self.member = member
        self.offset = offset
        # a mixin: the exception class after it in the MRO takes the message
        cast(Any, super()).__init__(f"{redacted(problem)} ({_where(url, member, offset)})")

    # The message as it was given: KeyError, a base of MissingFieldError, would quote it.
    __str__ = BaseException.__str__

    def __reduce__(self) -> Tuple[Type["_Located"], Tuple[str, Optional[str], Optional[str], Optional[int]]]:
        # Keep the attributes when the error crosses a process boundary.
        return (type(self), (self.problem, self.url, self.member, self.offset))


class ShardError(_Located, WdsmpError, OSError):
    """A shard could not be opened or read (missing file, failing command)."""


class ShardNotFoundError(ShardError, FileNotFoundError):
    """A local shard that does not exist (webdataset lets ``open`` raise FileNotFoundError)."""


class SecureModeError(ShardError, ValueError):
    """Secure mode refused a URL (a local file, a command, ``-``): a ValueError, as in webdataset."""


class TarFormatError(_Located, WdsmpError, tarfile.ReadError, ValueError):
    """A shard is not a well-formed tar archive (truncated, bad checksum, corrupt gzip, ...);
    a ``tarfile.ReadError``, as webdataset's reader raises."""


class SampleError(_Located, WdsmpError, ValueError):
    """Tar members do not group into samples (duplicate or interleaved members)."""


class MissingFieldError(SampleError, KeyError):
    """A sample lacks a field a stage asks for: a ``KeyError`` as webdataset's ``map_dict``
    raises, and a ``ValueError`` as its ``to_tuple`` and ``rename`` do."""


class DecodeError(_Located, WdsmpError, ValueError):
    """A field of a sample could not be decoded."""


class WorkerError(WdsmpError, RuntimeError):
    """A loader worker process failed; the message carries its traceback."""


class PipeError(WdsmpError, OSError):
    """A ``pipe:`` command exited with a non-zero status."""

    def __init__(self, command: str, status: int, stderr: str = "") -> None:
        self.command = command
        self.status = status
        self.stderr = stderr
        detail = f": {stderr.strip()[-500:]}" if stderr and stderr.strip() else ""
        super().__init__(f"command {command!r} exited with status {status}{detail}")

    def __reduce__(self) -> Tuple[Type["PipeError"], Tuple[str, int, str]]:
        return (type(self), (self.command, self.status, self.stderr))
