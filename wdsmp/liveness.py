"""Whether a process is alive, and a child that ends with its parent: the tests behind every
sweep of what dead processes left, and the watch that keeps a child from outliving its parent.

Shard claims (``DirectoryShardList``), loader semaphores and shared-memory
segments carry the pid of their owner; each is reclaimed only when that
process is gone. Worker processes (FastLoader's, ``wdsmp convert``'s pool)
call ``exit_with_parent`` first, so that a parent killed without a chance to
stop them (SIGKILL, the OOM killer) leaves none of them blocked forever.
"""

import os
import threading

__all__ = ["exit_with_parent", "pid_alive"]

PARENT_GONE = 3  # the exit code of a child whose parent died


def pid_alive(pid):
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


def exit_with_parent():
    """Exit this process (``os._exit(PARENT_GONE)``) as soon as its multiprocessing parent is
    gone, wherever its main thread is blocked: a daemon thread waits on the parent's sentinel
    (a pipe only the parent holds open, under spawn and forkserver alike), which becomes
    readable when the parent dies. Nothing happens in a process without such a parent."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_when_ready, args=(parent.sentinel,), daemon=True,
                         name="wdsmp-parent-watch").start()


def _exit_when_ready(sentinel):
    from multiprocessing.connection import wait

    wait([sentinel])
    os._exit(PARENT_GONE)
