"""The ring: one POSIX shared-memory segment holding a header and ``nslots`` batch slots.

The loader creates the ring (``Ring.create``); workers attach to it by name
(``Ring.attach``) and write batches straight into its slots; the loader wraps
slots as tensors without copying. This module knows the memory only: which
slot is free, who writes it and when, is the business of the loader's pipes.

NOTE [ring ownership]
    * One owner: the process that called ``Ring.create``. It alone unlinks the
      segment, exactly once, in ``close()`` (or ``__del__``); a forked copy of
      the owner object does not count (the creating pid is checked).
    * Everyone else attaches and ``close()``s; ``close()`` is idempotent and
      never raises. Pickling a ring pickles ``(name, layout)``, never a view:
      unpickling attaches.
    * The segment is created through ``SharedMemory`` (so multiprocessing's
      resource tracker, a process of its own, unlinks it if the owner dies
      without a clean-up while the tracker lives). Attachers open ``/dev/shm/<name>``
      themselves and never talk to the tracker: with ``SharedMemory(name)``
      before Python 3.13 an attacher registers the name, and its tracker
      unlinks the owner's segment when the attacher exits (and unregistering
      again races with other attachers on a shared tracker, which then prints
      KeyErrors). ``track=False`` (3.13+) is not needed on this path.
    * Views come from our own mmap of the segment, not ``SharedMemory.buf``:
      Python unmaps an mmap only when the last array over it is gone, so
      ``close()`` never has to choose between raising BufferError and
      unmapping memory a batch tensor still points at. After the owner's
      ``close()`` the name is gone from /dev/shm at once; the memory goes
      when the last view does.
    * The owner holds an ``flock`` on the segment while it lives, and names
      carry its pid (``<prefix><pid>-<random>``), so ``cleanup_stale`` can
      unlink segments left by owners that died without a clean-up (SIGKILL of
      the whole process group, OOM killer) and never a live owner's.
    * Memory is reserved at creation (``posix_fallocate``), after a check of
      the free space in /dev/shm: a full /dev/shm is a clear error at start,
      not a SIGBUS in a worker halfway through an epoch.
"""

import errno
import fcntl
import mmap
import os
import re
import secrets
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Dict, List, Optional, Tuple, Type, TypeVar

import numpy as np

from .._internal.liveness import pid_alive
from .layout import BatchLayout

__all__ = ["DEFAULT_PREFIX", "SHM_DIR", "Ring", "cleanup_stale"]

SHM_DIR = "/dev/shm"
DEFAULT_PREFIX = "wdsmp-"
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,100}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


_R = TypeVar("_R", bound="Ring")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _no_room(size: int, nslots: int, slot_size: int, free: int, total: int) -> OSError:
    return OSError(errno.ENOSPC,
                   f"the loader's ring needs {_mib(size)} ({nslots} slots of {_mib(slot_size)} plus a header) "
                   f"but {SHM_DIR} has only {_mib(free)} free of {_mib(total)}; use fewer workers, a smaller "
                   f"prefetch or a smaller batch_size (fewer or smaller slots), or enlarge {SHM_DIR} "
                   f"(docker run --shm-size=...)")


def _check_shm_dir() -> None:
    if not os.path.isdir(SHM_DIR):
        raise OSError(errno.ENOENT, f"the loader's ring needs POSIX shared memory under {SHM_DIR} (Linux); "
                                    f"{SHM_DIR} does not exist here")


def _check_room(size: int, nslots: int, slot_size: int) -> None:
    """Raise a clear ENOSPC OSError unless /dev/shm has ``size`` bytes free."""
    stat = os.statvfs(SHM_DIR)
    free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
    if size > free:
        raise _no_room(size, nslots, slot_size, free, total)


class Ring:
    """``nslots`` slots of a ``BatchLayout`` in one shared-memory segment; see NOTE [ring ownership].

    Use ``Ring.create`` (owner) or ``Ring.attach`` (workers), not the
    constructor. Attributes: ``name``, ``layout``, ``nslots``, ``size``
    (bytes), ``owner``, ``closed``, ``buffer``.
    """

    def __init__(self, name: str, layout: BatchLayout, nslots: int, mapping: Optional[mmap.mmap], *,
                 shm: Optional[SharedMemory] = None, lock_fd: Optional[int] = None) -> None:
        self.name = name
        self.layout = layout
        self.nslots = nslots
        self.size = layout.ring_size(nslots)
        self._mmap = mapping
        self._shm = shm  # the owner's SharedMemory: only for unlink()
        self._lock_fd = lock_fd
        self._pid = os.getpid()

    @property
    def owner(self) -> bool:
        """Whether this object created the segment in this very process (and so will unlink it)."""
        return self._shm is not None and self._pid == os.getpid()

    @property
    def closed(self) -> bool:
        return self._mmap is None

    @property
    def buffer(self) -> mmap.mmap:
        """The whole segment, header and slots, as a writable buffer (an mmap); to register it with
        CUDA as pinned memory (``transfer.py``). ValueError once closed."""
        if self._mmap is None:
            raise ValueError(f"ring {self.name!r} is closed")
        return self._mmap

    @classmethod
    def create(cls: Type[_R], layout: BatchLayout, nslots: int, prefix: str = DEFAULT_PREFIX) -> _R:
        """Create a ring named ``<prefix><pid>-<random>``, owned by the calling process.

        OSError (ENOSPC) naming the sizes when /dev/shm cannot hold it.
        """
        if not isinstance(layout, BatchLayout):
            raise TypeError(f"layout must be a BatchLayout, not {type(layout).__name__}")
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ValueError(f"prefix must be 1-100 letters, digits, '.', '_' or '-', not {prefix!r}")
        size = layout.ring_size(nslots)
        _check_shm_dir()
        _check_room(size, nslots, layout.slot_size)
        name = f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        shm = SharedMemory(name=name, create=True, size=size)
        fd: Optional[int] = None
        mapping: Optional[mmap.mmap] = None
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exn:
                if exn.errno != errno.ENOSPC:
                    raise
                stat = os.statvfs(SHM_DIR)
                raise _no_room(size, nslots, layout.slot_size, stat.f_bavail * stat.f_frsize,
                               stat.f_blocks * stat.f_frsize) from exn
            mapping = mmap.mmap(fd, size)
            layout.write_header(mapping, nslots)
        except BaseException:
            if mapping is not None:
                mapping.close()
            if fd is not None:
                os.close(fd)
            shm.close()
            shm.unlink()
            raise
        shm.close()  # its own mapping and descriptor; the object stays for unlink()
        return cls(name, layout, nslots, mapping, shm=shm, lock_fd=fd)

    @classmethod
    def attach(cls: Type[_R], name: str, layout: BatchLayout) -> _R:
        """Attach to the ring ``name``; ValueError unless it was created with ``layout``."""
        if not isinstance(layout, BatchLayout):
            raise TypeError(f"layout must be a BatchLayout, not {type(layout).__name__}")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a ring name")
        _check_shm_dir()
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except FileNotFoundError as exn:
            raise FileNotFoundError(errno.ENOENT, f"no ring {name!r} in {SHM_DIR}: the loader that created "
                                                  f"it has closed it or died") from exn
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ValueError(f"{name!r} in {SHM_DIR} is empty: not a wdsmp ring")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            nslots = layout.read_header(mapping)
        except ValueError as exn:
            mapping.close()
            raise ValueError(f"cannot attach to ring {name!r}: {exn}") from exn
        return cls(name, layout, nslots, mapping)

    def views(self, slot: int) -> Dict[str, np.ndarray]:
        """``{field: array}`` over ``slot`` (zero-copy); see ``BatchLayout.views``."""
        return self.layout.views(self.buffer, slot)

    def close(self) -> None:
        """Let go of the ring; the owner also unlinks it. Idempotent; see NOTE [ring ownership]."""
        mapping, self._mmap = self._mmap, None
        shm, self._shm = self._shm, None
        lock_fd, self._lock_fd = self._lock_fd, None
        if shm is not None and self._pid == os.getpid():
            try:
                shm.unlink()
            except FileNotFoundError:  # someone removed it by hand: still forget it in the tracker
                resource_tracker.unregister(f"/{self.name}", "shared_memory")
        if lock_fd is not None:
            os.close(lock_fd)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # arrays still view it: it is unmapped when the last of them goes

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if "_mmap" in self.__dict__:  # fully built
            self.close()

    def __reduce__(self) -> Tuple[Any, Tuple[str, BatchLayout]]:
        return (type(self).attach, (self.name, self.layout))

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("owner" if self.owner else "attached")
        return f"Ring({self.name!r}, nslots={self.nslots}, size={self.size}, {state})"


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> List[str]:
    """Unlink rings ``<prefix><pid>-<random>`` in /dev/shm whose owner is dead; return their names.

    A segment is stale when its owner pid is not a live process and nobody
    holds its lock (NOTE [ring ownership]); a live owner's segment, or one
    this user may not open, is left alone.
    """
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix must be 1-100 letters, digits, '.', '_' or '-', not {prefix!r}")
    if not os.path.isdir(SHM_DIR):
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[0-9a-f]{8}")
    removed: List[str] = []
    for entry in sorted(os.listdir(SHM_DIR)):
        match = pattern.fullmatch(entry)
        if match is None or pid_alive(int(match.group(1))):
            continue
        path = os.path.join(SHM_DIR, entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, another user's, or a link
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
            removed.append(entry)
        except (BlockingIOError, FileNotFoundError):
            pass  # a live holder of the lock (another pid namespace), or removed meanwhile
        finally:
            os.close(fd)
    return removed
