"""Shared memory for the batches a DataLoader worker stacks, written again once no process holds them.

A batch stacked into fresh shared memory (as torch's ``default_collate`` does in a worker) pays
the kernel for every new page, allocated, zeroed and mapped on first write: for a batch of 256
float 3x224x224 images, 0.42 ms per image against 0.03 ms for the copy itself into pages already
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
queue overflow) leaves a segment unused, never reused early. torch's receiving side caches
storages by inode but only while one is alive, which by then none is.

Only on Linux with ``memfd_create`` and inotify, and only under torch's ``file_descriptor``
sharing strategy (the default there; under ``file_system`` torch copies the batch into memory
of its own anyway): elsewhere :func:`stack` gives None and the caller stacks as torch does. A
worker keeps at most one free segment (for the size it stacked last) and tracks at most
``_TRACKED`` segments; memfds have no name, so nothing is left behind when it exits.
"""

import ctypes
import os
import struct
import sys
import threading

__all__ = ["stack"]

_MIN_BYTES = 1 << 20  # smaller batches take few new pages; not worth a file and a watch
_TRACKED = 8  # segments in use or free, per process; past it the oldest in use is forgotten
_IN_CLOSE_WRITE, _IN_NONBLOCK, _IN_CLOEXEC = 0x8, os.O_NONBLOCK, os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class _Segment:
    """One memfd: its descriptor, size, inotify watch and the worker's own mapping of it."""

    __slots__ = ("fd", "nbytes", "watch", "view")

    def __init__(self, fd, nbytes, watch, view):
        self.fd, self.nbytes, self.watch, self.view = fd, nbytes, watch, view


class _Pool:
    """This process's segments: ``busy`` (a batch handed out, by watch) and ``free`` (one)."""

    def __init__(self):
        import torch

        self.torch, self.lock = torch, threading.Lock()
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
                    if self.free is not None:
                        self._forget(self.free)
                    self.free = segment

    def _forget(self, segment):
        """Stop tracking ``segment``: its memory goes once its last holder lets go of it."""
        self.libc.inotify_rm_watch(self.inotify, segment.watch)
        os.close(segment.fd)
        segment.view = None

    def _new_segment(self, nbytes):
        fd = os.memfd_create("wdsmp-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            watch = self.libc.inotify_add_watch(self.inotify, f"/proc/self/fd/{fd}".encode(), _IN_CLOSE_WRITE)
            if watch < 0:
                raise OSError(ctypes.get_errno(), "inotify_add_watch failed")
            view = self.torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        return _Segment(fd, nbytes, watch, view)

    def take(self, nbytes):
        """A segment of ``nbytes`` that no process holds, marked busy."""
        with self.lock:
            self._released()
            segment, self.free = self.free, None
            if segment is not None and segment.nbytes != nbytes:
                self._forget(segment)
                segment = None
            if segment is None:
                segment = self._new_segment(nbytes)
            while len(self.busy) >= _TRACKED:
                self._forget(self.busy.pop(next(iter(self.busy))))
            self.busy[segment.watch] = segment
            return segment

    def drop(self, segment):
        """Forget busy ``segment``, whose batch was never handed out."""
        with self.lock:
            if self.busy.pop(segment.watch, None) is not None:
                self._forget(segment)

    def hand_out(self, segment):
        """A storage over a new open of ``segment``'s file: what the batch tensor is over."""
        fd = os.open(f"/proc/self/fd/{segment.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            return self.torch.UntypedStorage._new_shared_fd_cpu(fd, segment.nbytes)
        finally:
            os.close(fd)  # the storage holds its own duplicate

    def abandon(self):
        """Close this pool's descriptors in a forked child, which shares the parent's inotify
        instance (so its watches are left alone) and whose parent keeps its own files open."""
        os.close(self.inotify)
        for segment in [*self.busy.values(), *([self.free] if self.free else [])]:
            os.close(segment.fd)
            segment.view = None

    def close(self):
        """Forget every segment and close the inotify instance (the pool is not used again)."""
        with self.lock:
            for segment in [*self.busy.values(), *([self.free] if self.free else [])]:
                self._forget(segment)
            self.busy, self.free = {}, None
            os.close(self.inotify)


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
    if isinstance(_POOL, _Pool):
        _POOL.abandon()
    _POOL = _UNMADE


os.register_at_fork(after_in_child=_after_fork_in_child)


def stack(tensors):
    """``torch.stack(tensors)`` of plain CPU tensors of one shape and dtype, into shared memory
    reused once no process holds an earlier batch in it (NOTE [a batch no process holds]); None
    where that is not done (small batches, no memfd or inotify, another sharing strategy)."""
    import torch
    import torch.multiprocessing

    first = tensors[0]
    shape = (len(tensors), *first.shape)
    nbytes = first.element_size() * first.numel() * len(tensors)
    if nbytes < _MIN_BYTES or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return None
    pool = _pool()
    if pool is None:
        return None
    try:
        segment = pool.take(nbytes)
    except OSError:
        _give_up(pool)
        return None
    try:
        torch.stack(tensors, out=torch.empty(0, dtype=first.dtype).set_(segment.view, 0, shape))
        storage = pool.hand_out(segment)
    except BaseException as error:
        pool.drop(segment)
        if isinstance(error, OSError):  # out of descriptors, say: torch's own way may still work
            return None
        raise
    return torch.empty(0, dtype=first.dtype).set_(storage, 0, shape)
