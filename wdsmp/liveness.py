"""Whether a process is alive, the one test behind every sweep of what dead processes left.

Shard claims (``DirectoryShardList``), loader semaphores and shared-memory
segments carry the pid of their owner; each is reclaimed only when that
process is gone.
"""

__all__ = ["pid_alive"]


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
