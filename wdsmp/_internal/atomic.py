"""Files that appear whole or not at all.

A file is written under a temp name beside its place, synced to disk, and
renamed over its place (a rename within a directory is atomic), the directory
then synced; a failure leaves no temp behind. A reader sees the old file, or
none, or the whole new one, never half of it, even after a crash.
"""

import contextlib
import os
from typing import Iterator, Optional

__all__ = ["atomic_write", "fsync_directory", "put_in_place", "remove_if_present"]


def remove_if_present(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable where the filesystem can (best effort: the
    rename itself has happened either way)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory
    finally:
        os.close(fd)


def put_in_place(temp: str, path: str) -> None:
    """Rename the complete temp ``temp``, already synced, over ``path``, durably."""
    os.replace(temp, path)
    fsync_directory(os.path.dirname(path) or ".")


@contextlib.contextmanager
def atomic_write(path: str, temp: Optional[str] = None) -> Iterator[str]:
    """The name of a temp beside ``path`` to write, as a stream or at once, however the
    caller writes files (default ``PATH.tmpPID``). When the block ends without an error,
    the temp is synced and put in place; it never outlives the block."""
    temp = f"{path}.tmp{os.getpid()}" if temp is None else temp
    try:
        yield temp
        with open(temp, "rb+") as stream:
            os.fsync(stream.fileno())
        put_in_place(temp, path)
    finally:
        remove_if_present(temp)
