"""Whether a process is alive, and a child that ends with its parent: the tests behind every
sweep of what dead processes left, and the watch that keeps a child from outliving its parent.

Shard claims (``DirectoryShardList``) and shared-memory segments carry the
pid of their owner; each is reclaimed only when that process is gone. Worker processes
(FastLoader's, ``wdsmp convert``'s pool) call ``exit_with_parent`` as they start, so that a parent killed without a
chance to stop them (SIGKILL, the OOM killer) leaves none of them blocked
forever.
"""

import os
import threading
from typing import Optional

__all__ = ["exit_with_parent", "pid_alive"]

PARENT_GONE = 3  # the exit code of a child whose parent died


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine.

    A zombie is dead (it has exited and closed its files); a process of another
    user is alive (it may be reading what it claimed).
    """
    import psutil  # late: keeps `import wdsmp` light

    if pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def exit_with_parent(sentinel: Optional[int] = None) -> None:
    """Exit this process (``os._exit(PARENT_GONE)``) as soon as its parent is gone, wherever its
    main thread is blocked: a daemon thread waits on ``sentinel``, the read end of a pipe whose
    write end only the parent holds, which becomes readable when the parent dies; by default
    multiprocessing's (under fork, spawn and forkserver alike). Nothing happens in a process
    without such a parent."""
    if sentinel is None:
        import multiprocessing

        parent = multiprocessing.parent_process()
        if parent is None:
            return
        sentinel = parent.sentinel
    threading.Thread(target=_exit_when_ready, args=(sentinel,), daemon=True, name="wdsmp-parent-watch").start()


def _exit_when_ready(sentinel: int) -> None:
    from multiprocessing.connection import wait

    wait([sentinel])
    os._exit(PARENT_GONE)
