"""Worker processes: start them, tell whether they live, stop them for sure.

Processes only: what the workers do and what they share is the loader's
business. Workers start with ``forkserver`` by default (``spawn`` where it
is missing): both give a clean process that holds none of the main
process's threads, CUDA context or locks. The fork server imports the
worker's modules once and forks workers from that, so a worker starts in
milliseconds rather than re-importing numpy (DESIGN.md §3, step 2).

NOTE [light workers]
    Workers write numpy arrays into shared memory and never need torch, whose
    import takes a second or more of CPU: the fork server imports
    ``wdsmp.fast.worker`` alone (numpy, the tar reader and the decoders,
    about a tenth of that), as ``import wdsmp`` imports its public names on
    first use. CPython's fork server also imports the main script by default
    (its preload list is ``["__main__"]``), and a training script imports
    torch; so while the list is that default, and the loader's workers need
    nothing from the script (``refers_to_main``), ``start_server`` replaces it
    with the worker module alone (after ``numpy_one_thread``, which loads
    numpy without a BLAS thread per core). Preloads a user set are kept (the
    worker's modules are added). Workers that refer to the script import it themselves as
    they start, as under spawn, and so does any other user of the same fork
    server (a DataLoader with the forkserver context) once a loader started it.

NOTE [main module]
    A process started by forkserver or spawn imports the parent's main
    module (the user's script, as ``__mp_main__``) before it runs, so that
    functions defined there can be unpickled. A script without an
    ``if __name__ == "__main__":`` guard then runs its training code again in
    every worker, which fails (a FastLoader made while a process starts)
    with an error that names neither the cause nor the fix. Workers whose
    arguments refer to nothing in ``__main__`` (``refers_to_main``) are
    therefore started with the main module hidden, and skip that import;
    a user's function defined in the script still needs the guard, as it
    does with DataLoader under spawn.

NOTE [semaphore names]
    Queues and events for forkserver and spawn workers hold POSIX named
    semaphores (``/dev/shm/sem.*``), which multiprocessing unlinks when they
    are collected, or its resource tracker when the process dies. A SIGKILL
    to the whole process group (a job scheduler's) kills the tracker too,
    and the semaphores stay until reboot. The loader's are therefore named
    ``wdsmp-sem-<pid>-<token>-...`` (``named_semaphores``), and
    ``sweep_semaphores``, run by every new loader, unlinks those whose owner
    is gone. Whether it is gone is not told by the pid: processes in other
    PID namespaces (containers sharing the host's /dev/shm) have pids that
    mean nothing here, or another process's. Instead each process that names
    semaphores first takes an flock on ``/dev/shm/wdsmp-sem-<pid>-<token>.lock``
    and holds it until it dies (the kernel releases it then, whatever killed
    it); the sweep unlinks a semaphore, and then the lock file, only when it
    can take that lock itself or the file is gone. flock works across PID
    namespaces on one file system. The lock is taken before any semaphore
    exists, and checked to be still the file at its path (a sweep may remove
    a lock file made but not yet locked: a new token is tried then). A clean
    exit removes the lock file when none of the semaphores is left, after
    multiprocessing's exit finalizers unlinked those of queues still alive.

NOTE [CPython internals]
    multiprocessing offers no public way to read the fork server's preload
    list, to choose semaphore names, to start a process without the main
    script or to tell a child importing that script, so four functions reach
    into CPython's private parts, and nothing else in wdsmp does:
    - ``_forkserver_preloads`` reads ``forkserver._forkserver._preload_modules``
      (the list ``set_forkserver_preload`` replaces), so that wdsmp adds its
      worker module to the user's preloads instead of dropping them (NOTE
      [light workers]). If CPython renames it, the user's own preloads are
      lost (wdsmp still works).
    - ``_process_config`` returns ``current_process()._config``, whose
      ``"semprefix"`` ``synchronize.SemLock`` puts before every semaphore
      name. If CPython renames it, ``named_semaphores`` fails, or names
      nothing if the key changes, and semaphores leaked by a killed job are
      no longer swept.
    - ``_main_hidden`` wraps ``multiprocessing.spawn.get_preparation_data``
      (what spawn and forkserver processes prepare themselves from) so that
      the processes one thread starts leave out its ``init_main_from_*``
      entries, while every other thread (the training loop, as workers start
      behind a first batch: NOTE [first batch here] in ``worker.py``) sees
      ``__main__`` as it is. If CPython stops calling it, workers import the
      script again, as DataLoader's spawned workers do.
    - ``starting_a_worker`` reads ``current_process()._inheriting``, true
      while a spawned child imports the parent's main script (NOTE [main
      module]). If it goes, a script without a main guard that builds a
      loader recurses into workers again instead of getting an error that
      says what to do.
    tests/fast/test_pool.py checks all four against the running Python.
"""

import contextlib
import errno
import fcntl
import functools
import multiprocessing
import multiprocessing.util
import os
import pickle
import pickletools
import re
import secrets
import signal
import threading
import time

__all__ = ["START_METHODS", "WorkerPool", "context", "describe_exit", "named_semaphores", "no_room_for_semaphores",
           "preloads", "refers_to_main", "start_server", "starting_a_worker", "sweep_semaphores"]

START_METHODS = ("forkserver", "spawn", "fork")
_PRELOADS = ("wdsmp.fast.numpy_one_thread", "wdsmp.fast.worker")  # the fork server's own, in order
_DEFAULT_PRELOADS = ["__main__"]  # CPython's, until someone sets others
SEM_PREFIX = "wdsmp-sem-"
_SEM_DIR = "/dev/shm"
_SEMAPHORE = re.compile(rf"sem\.{re.escape(SEM_PREFIX)}(\d+-[0-9a-f]{{8}})-\w+")  # its owner's key
_OWNER_LOCK = re.compile(rf"{re.escape(SEM_PREFIX)}(\d+-[0-9a-f]{{8}})\.lock")
_owner = None  # (pid, key, descriptor of the held lock file) of this process: NOTE [semaphore names]


def context(start_method):
    """The multiprocessing context for ``start_method`` (forkserver falls back to spawn where
    missing)."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, not {start_method!r}")
    if start_method not in multiprocessing.get_all_start_methods():
        if start_method != "forkserver":
            raise ValueError(f"start method {start_method!r} is not available on this platform")
        start_method = "spawn"
    return multiprocessing.get_context(start_method)


def preloads(current, main):
    """The fork server's preloads for workers that need the main script (``main``) or not,
    given the ``current`` list (NOTE [light workers])."""
    if current == _DEFAULT_PRELOADS and not main:
        current = []
    return current + [module for module in _PRELOADS if module not in current]


def _forkserver_preloads():
    """The modules the fork server imports when it starts (NOTE [CPython internals])."""
    from multiprocessing import forkserver

    return list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))


def start_server(ctx, main=False):
    """Start the fork server of ``ctx`` now, if it uses one and it is not running, without
    waiting for it: its imports then overlap whatever the caller does before the first workers
    are needed. ``main``: whether the workers need the main script (NOTE [light workers])."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload(preloads(_forkserver_preloads(), main))
        forkserver.ensure_running()


@contextlib.contextmanager
def named_semaphores():
    """Semaphores made inside (queues, events) named after this process and its held lock
    (NOTE [semaphore names]); multiprocessing names them from its process's ``semprefix``."""
    config = _process_config()
    before = config.get("semprefix", "/mp")
    config["semprefix"] = f"/{SEM_PREFIX}{_owner_key(_SEM_DIR)}"
    try:
        yield
    finally:
        config["semprefix"] = before


def _owner_key(directory):
    """``<pid>-<token>``, this process's name for its semaphores, once it holds the flock of
    ``<directory>/wdsmp-sem-<key>.lock`` (for the rest of its life: NOTE [semaphore names])."""
    global _owner
    pid = os.getpid()
    if _owner is not None and _owner[0] == pid:
        return _owner[1]
    while True:
        key = f"{pid}-{secrets.token_hex(4)}"
        path = os.path.join(directory, f"{SEM_PREFIX}{key}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # a token drawn twice
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            here, mine = os.stat(path), os.fstat(fd)
            if (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev):
                _owner = (pid, key, fd)
                # After multiprocessing's own exit finalizers (priority 0), which unlink the
                # semaphores of queues still alive at exit: then the lock file can go too.
                multiprocessing.util.Finalize(None, _leave, (directory, pid, key), exitpriority=-1)
                return key
        except (BlockingIOError, FileNotFoundError):
            pass  # a sweep took it for a dead owner's between its creation and the lock
        os.close(fd)


def _leave(directory, pid, key):
    """At a clean exit, remove this process's lock file if none of its semaphores is left (else
    the next sweep removes it, once this process is gone and its lock free)."""
    if os.getpid() != pid:
        return
    try:
        if not any(name.startswith(f"sem.{SEM_PREFIX}{key}-") for name in os.listdir(directory)):
            os.unlink(os.path.join(directory, f"{SEM_PREFIX}{key}.lock"))
    except OSError:
        pass  # the sweep will


def _lock_of_a_dead_owner(directory, key):
    """The lock of the process that named semaphores ``key``, taken (a descriptor, -1 when the
    lock file is gone) when that process is gone; None while it holds the lock (NOTE
    [semaphore names])."""
    try:
        fd = os.open(os.path.join(directory, f"{SEM_PREFIX}{key}.lock"), os.O_RDONLY)
    except FileNotFoundError:
        return -1
    except OSError:
        return None  # not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def no_room_for_semaphores(num_workers, directory=_SEM_DIR):
    """The OSError (ENOSPC) that says why the queues of ``num_workers`` workers could not be made:
    each of their semaphores takes a page of ``directory``, and it is full."""
    count = 5 + 3 * (1 + 2 * num_workers)  # an Event, the ready queue, a task and a free queue per worker
    page = os.sysconf("SC_PAGE_SIZE")
    stat = os.statvfs(directory)
    return OSError(errno.ENOSPC, f"{directory} is full: it holds {stat.f_blocks * stat.f_frsize / 1024:,.0f} KiB, "
                                 f"and after the loader's ring and what else is there it has no room for the "
                                 f"{count} semaphores of the queues of {num_workers} workers, one page each "
                                 f"({count * page / 1024:,.0f} KiB in all); free some of {directory}, use fewer "
                                 f"workers, or enlarge it (docker run --shm-size=...)")


def _process_config():
    """This process's multiprocessing settings, where SemLock reads ``"semprefix"`` (NOTE [CPython
    internals])."""
    return multiprocessing.current_process()._config


def starting_a_worker():
    """Whether this process is a spawned worker still importing its parent's main script
    (NOTE [CPython internals])."""
    return getattr(multiprocessing.current_process(), "_inheriting", False)


def sweep_semaphores(directory=_SEM_DIR):
    """Unlink the loader semaphores whose owner is gone, then its lock file, holding that lock
    meanwhile (NOTE [semaphore names]); the names swept."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    owners = {}
    for name in names:
        match = _SEMAPHORE.fullmatch(name) or _OWNER_LOCK.fullmatch(name)
        if match is not None:
            owners.setdefault(match.group(1), []).append(name)
    swept = []
    for key, owned in owners.items():
        lock = _lock_of_a_dead_owner(directory, key)
        if lock is None:
            continue
        try:
            for name in sorted(owned, key=lambda name: name.endswith(".lock")):  # the lock file last
                try:
                    os.unlink(os.path.join(directory, name))
                    swept.append(name)
                except FileNotFoundError:  # another loader swept it first
                    pass
        finally:
            if lock >= 0:
                os.close(lock)
    return swept


def describe_exit(exitcode):
    """Words for a process exit code: ``"exit code 3"``, ``"signal SIGKILL (out of memory?)"``."""
    if exitcode is None:
        return "no exit code"
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    hint = " (killed from outside: out of memory?)" if name == "SIGKILL" else ""
    return f"signal {name}{hint}"


def refers_to_main(obj):
    """Whether unpickling ``obj`` needs the ``__main__`` module (NOTE [main module]); when in
    doubt, yes."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return True
    return any(arg in ("__main__", "__mp_main__") or (isinstance(arg, str) and arg.startswith("__main__ "))
               for _, arg, _ in pickletools.genops(data))


_hiding = threading.local()  # .main: processes this thread starts leave the main script out


@contextlib.contextmanager
def _main_hidden():
    """Processes this thread starts inside do not import the user's script (NOTE [main module]);
    other threads' processes do as before (NOTE [CPython internals])."""
    from multiprocessing import spawn

    if not getattr(spawn.get_preparation_data, "_wdsmp_hides_main", False):
        spawn.get_preparation_data = _without_main(spawn.get_preparation_data)
    _hiding.main = True
    try:
        yield
    finally:
        _hiding.main = False


def _without_main(preparation_data):
    """CPython's ``spawn.get_preparation_data`` (what a new process prepares itself from), less
    the main script where the calling thread hides it."""

    @functools.wraps(preparation_data)
    def prepared(name):
        data = preparation_data(name)
        if getattr(_hiding, "main", False):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    prepared._wdsmp_hides_main = True
    return prepared


class WorkerPool:
    """``len(argsets)`` daemon processes of ``mp_context`` (see ``context``) running
    ``target(*args)``, one per argument tuple; with ``main=False`` they start without
    importing the main module (NOTE [main module])."""

    def __init__(self, target, argsets, mp_context, name="wdsmp-worker", main=True):
        self.processes = [mp_context.Process(target=target, args=tuple(args), name=f"{name}-{i}", daemon=True)
                          for i, args in enumerate(argsets)]
        hide = not main and mp_context.get_start_method() != "fork"  # a fork copies __main__ as it is
        try:
            with _main_hidden() if hide else contextlib.nullcontext():
                for process in self.processes:
                    process.start()
        except BaseException:  # no process left running that nobody will stop
            self.processes = [p for p in self.processes if p.pid is not None]
            self.stop(0.0)
            raise

    def dead(self):
        """``[(worker, exitcode), ...]`` of the workers that have exited."""
        return [(i, p.exitcode) for i, p in enumerate(self.processes) if p.exitcode is not None]

    def pids(self):
        return [p.pid for p in self.processes]

    def activity(self, worker):
        """What worker ``worker``'s process has done so far, as the kernel counts it: CPU time
        (all threads), bytes read and written, and its main thread's context switches (each
        sleep, wait or blocking read that returned). Two equal snapshots mean it did nothing in
        between: stopped (SIGSTOP), stuck in a read that never returns, or deadlocked. None
        when it cannot be read (the process is gone, or /proc says nothing)."""
        import psutil

        try:
            process = psutil.Process(self.processes[worker].pid)
            with process.oneshot():
                cpu, switches = process.cpu_times(), process.num_ctx_switches()
                try:
                    io = process.io_counters()  # read_chars counts sockets and pipes too
                except (psutil.AccessDenied, AttributeError):
                    io = ()
        except (psutil.Error, OSError):
            return None
        return cpu.user, cpu.system, switches.voluntary, switches.involuntary, tuple(io)

    def state(self, worker):
        """Worker ``worker``'s process state in the kernel's words ("stopped", "disk-sleep", ...)."""
        import psutil

        try:
            return psutil.Process(self.processes[worker].pid).status()
        except (psutil.Error, OSError):
            return "unknown"

    def kill(self, worker):
        """SIGKILL worker ``worker`` (a stopped process too; one in an uninterruptible read dies
        when the read returns)."""
        self.processes[worker].kill()

    def stop(self, timeout=5.0):
        """Wait up to ``timeout`` seconds for the workers to exit (after the caller told them to),
        then terminate, then kill the rest. Idempotent."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for escalate in ("terminate", "kill"):
            alive = [p for p in self.processes if p.exitcode is None]
            if not alive:
                break
            for process in alive:
                getattr(process, escalate)()
            for process in alive:
                process.join(2.0)
        for process in self.processes:
            if process.exitcode is not None:
                process.close()
        self.processes = [p for p in self.processes if _unclosed(p)]


def _unclosed(process):
    try:
        return process.exitcode is None
    except ValueError:  # closed
        return False
