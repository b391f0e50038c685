"""Shared memory for the batches a DataLoader worker stacks, written again once no process holds them.

A batch stacked into fresh shared memory (as torch's ``default_collate`` does in a worker) pays
the kernel for every new page, allocated, zeroed and mapped on first write: for a batch of 256
float 3x224x224 images, 0.44 ms per image against 0.03 ms for the copy itself into pages already
mapped (benchmarks/RESULTS.md), a fifth of what the import-swapped pipeline spends per image. So
a worker keeps the shared memory of batches the main process has let go of and stacks the next
batches of that size into it, through a mapping it keeps.

NOTE [a batch no process holds]: a segment is a memfd that the worker keeps open (``fd``) and
maps once (``view``); the tensor it hands out is over a second open of the same file, made
from ``/proc/self/fd`` for each batch, and only that open file travels: torch's
file-descriptor sharing sends the main process a duplicate of its descriptor, the main process
maps it, and anything that passes the batch on (to a thread, another process, a forked child)
holds the same open file again. The kernel releases an open file when its last descriptor and
mapping are gone, and reports that to an inotify watch on the file as IN_CLOSE_WRITE; the
worker's own descriptor is never released while the segment is in use, so that event says the
batch's open file, and with it every holder of the batch, is gone. Only then is the segment
written again, under a new open. A batch kept (in a list, as a numpy view, in another process)
keeps its open file and is never overwritten; an event that never comes (lost in an inotify
queue overflow) leaves a segment unused, never reused early.

One more holder is not a mapping: torch's receiving side caches the storages it rebuilt by
inode, for as long as each is alive, and under the ``file_system`` sharing strategy a storage
that is shared again (``share_memory_()``, a queue) moves into memory of its own and lets go
of the file while it lives on; a later batch in the same file would then be found in that
cache and come out with the old values. So a worker recycles only where the process taking
its batches shares by file descriptor: it must have been forked by that process (a
DataLoader's workers under the ``fork`` start method), whose strategy it inherited when it
started, and that strategy must be ``file_descriptor`` (the default on Linux). Spawned
workers, and those forked by a fork server (Python 3.14's default), stack into new memory as
torch does. Not seen from a worker: a process that turns to ``file_system`` after its workers
started, or one further on (the main process passes its batches to another process, which
shares them on under ``file_system`` and keeps them): there ``WDSMP_NEW_BATCH_MEMORY=1`` turns
recycling off.

Only on Linux with ``memfd_create`` and inotify: elsewhere :func:`stack` gives None and the
caller stacks as torch does. A worker keeps at most one free segment (for the size it stacked
last) and tracks at most ``_TRACKED`` segments; memfds have no name, so nothing is left behind
when it exits.
"""

import ctypes
import multiprocessing
import os
import struct
import sys
import threading

from . import _env

__all__ = ["stack"]

_MIN_BYTES = 1 << 20  # smaller batches take few new pages; not worth a file and a watch
_TRACKED = 8  # segments in use or free, per process; past it the oldest in use is forgotten
_IN_CLOSE_WRITE, _IN_NONBLOCK, _IN_CLOEXEC = 0x8, os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class _Segment:
    """One memfd: its descriptor (-1 once closed), size, inotify watch and the worker's own
    mapping of it."""

    __slots__ = ("fd", "nbytes", "watch", "view")

    def __init__(self, fd, nbytes, watch, view):
        self.fd, self.nbytes, self.watch, self.view = fd, nbytes, watch, view


def _storage_over(fd, nbytes):
    """A torch storage mapping ``fd``'s file, over a descriptor of its own that a program this
    process runs does not inherit (torch's duplicate is inheritable)."""
    import torch

    storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
    os.set_inheritable(storage._share_fd_cpu_()[0], False)
    return storage


class _Pool:
    """This process's segments: ``busy`` (a batch handed out, by watch) and ``free`` (one). A
    segment being filled is in neither, so no other thread forgets it meanwhile."""

    def __init__(self):
        self.lock = threading.Lock()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.inotify = self.libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self.inotify < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.busy, self.free = {}, None

    def _released(self):
        """Move the segments whose batches every process has let go of to ``free``."""
        while True:
            try:
                data = os.read(self.inotify, 4096)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                watch, mask, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                segment = self.busy.pop(watch, None) if mask & _IN_CLOSE_WRITE else None
                if segment is not None:
                    old, self.free = self.free, segment
                    if old is not None:
                        self._forget(old)

    def _forget(self, segment):
        """Stop tracking ``segment``: its memory goes once its last holder lets go of it."""
        fd, segment.fd = segment.fd, -1  # first, so that a child forked meanwhile leaves it
        if fd < 0:
            return
        if self.inotify >= 0:
            self.libc.inotify_rm_watch(self.inotify, segment.watch)  # before the close, which it would report
        os.close(fd)
        segment.view = None

    def _new_segment(self, nbytes):
        fd = os.memfd_create("wdsmp-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            watch = self.libc.inotify_add_watch(self.inotify, f"/proc/self/fd/{fd}".encode(), _IN_CLOSE_WRITE)
            if watch < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch failed")
            return _Segment(fd, nbytes, watch, _storage_over(fd, nbytes))
        except BaseException:
            os.close(fd)  # the watch goes with the file
            raise

    def take(self, nbytes):
        """A segment of ``nbytes`` that no process holds, for the caller alone until
        :meth:`hand_out` or :meth:`discard`."""
        with self.lock:
            self._released()
            segment, self.free = self.free, None
            if segment is not None and segment.nbytes != nbytes:
                self._forget(segment)
                segment = None
            if segment is None:
                segment = self._new_segment(nbytes)
            return segment

    def hand_out(self, segment):
        """A storage over a new open of filled ``segment``'s file, the batch tensor's; from now
        on the segment waits, busy, for the last holder of that open file."""
        fd = os.open(f"/proc/self/fd/{segment.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            storage = _storage_over(fd, segment.nbytes)
        finally:
            os.close(fd)  # the storage holds its own duplicate
        with self.lock:
            if self.inotify < 0:  # closed by another thread meanwhile: nobody will hear of it
                self._forget(segment)
                return storage
            while len(self.busy) >= _TRACKED:
                self._forget(self.busy.pop(next(iter(self.busy))))
            self.busy[segment.watch] = segment
        return storage

    def discard(self, segment):
        """Forget ``segment``, taken but never handed out (or handed out while interrupted)."""
        with self.lock:
            if self.busy.get(segment.watch) is segment:
                del self.busy[segment.watch]
            self._forget(segment)

    def _segments(self):
        return [*self.busy.values(), *([self.free] if self.free is not None else [])]

    def abandon(self):
        """Close this pool's descriptors in a forked child, which shares the parent's inotify
        instance (so its watches are left alone) and whose parent keeps its own files open."""
        for fd in [self.inotify, *(segment.fd for segment in self._segments())]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.busy, self.free = {}, None

    def close(self):
        """Forget every segment and close the inotify instance (the pool is not used again)."""
        with self.lock:
            for segment in self._segments():
                self._forget(segment)
            self.busy, self.free = {}, None
            inotify, self.inotify = self.inotify, -1
            os.close(inotify)


_UNMADE = object()
_POOL = _UNMADE  # this process's pool, made at its first batch; None where there can be none
_POOL_LOCK = threading.Lock()


def _pool():
    """This process's pool, or None."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is _UNMADE:
            _POOL = None
            if sys.platform.startswith("linux") and hasattr(os, "memfd_create"):
                try:
                    _POOL = _Pool()
                except OSError:  # no inotify instance left to this user, say
                    pass
        return _POOL


def _give_up(pool):
    """Stop recycling in this process (a segment could not be made: no /proc, no descriptors)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is pool:
            _POOL = None
            pool.close()


def _after_fork_in_child():
    """A forked child makes a pool of its own when it stacks; the parent's is abandoned there."""
    global _POOL, _POOL_LOCK
    _POOL_LOCK = threading.Lock()  # another thread may have held it at the fork
    pool, _POOL = _POOL, _UNMADE
    if isinstance(pool, _Pool):
        pool.abandon()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _forked_from_consumer():
    """Whether this process was forked (not spawned, nor forked from a fork server) by the
    process that started it, as a DataLoader's workers are by the process taking their batches
    under the ``fork`` start method: only then is this process's torch sharing strategy that
    process's (NOTE [a batch no process holds])."""
    if multiprocessing.parent_process() is None:  # not started by this multiprocessing at all
        return False
    process = multiprocessing.current_process()  # of the class its parent started it as
    method = getattr(type(process), "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
    return method == "fork"  # the default context's method, resolved in the parent before a fork


def stack(tensors):
    """``torch.stack(tensors)`` of plain CPU tensors of one shape and dtype, into shared memory
    reused once no process holds an earlier batch in it (NOTE [a batch no process holds]); None
    where that is not done (small batches, a worker not forked, another sharing strategy, no
    memfd or inotify, ``WDSMP_NEW_BATCH_MEMORY=1``)."""
    import torch
    import torch.multiprocessing

    first = tensors[0]
    shape = (len(tensors), *first.shape)
    nbytes = first.element_size() * first.numel() * len(tensors)
    if (nbytes < _MIN_BYTES or torch.multiprocessing.get_sharing_strategy() != "file_descriptor"
            or not _forked_from_consumer() or _env.new_batch_memory()):
        return None
    pool = _pool()
    if pool is None:
        return None
    try:
        segment = pool.take(nbytes)
    except (OSError, RuntimeError):  # no /proc, no descriptors (torch raises RuntimeError for that)
        _give_up(pool)
        return None
    try:
        torch.stack(tensors, out=torch.empty(0, dtype=first.dtype).set_(segment.view, 0, shape))
        storage = pool.hand_out(segment)
    except (OSError, RuntimeError):  # out of descriptors, say: torch's own way decides
        pool.discard(segment)
        return None
    except BaseException:
        pool.discard(segment)
        raise
    return torch.empty(0, dtype=first.dtype).set_(storage, 0, shape)
