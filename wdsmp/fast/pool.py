"""Worker processes: start them with a pipe each way, tell whether they live, stop them for sure.

Processes and pipes only: what the workers do and what they say is the loader's business.

NOTE [worker processes]
    By default (``start_method="spawn"``) each worker is a fresh Python
    interpreter that wdsmp starts itself (``subprocess``, running
    :data:`BOOTSTRAP`): it holds none of the script's threads, locks or CUDA
    context, and imports only what the worker needs (numpy with one BLAS
    thread, the tar reader, the decoders), about 0.2 s of CPU, in parallel
    across workers. It does not import the user's script, which imports
    torch (a second or more of CPU per worker) and, without an
    ``if __name__ == "__main__":`` guard, would run its training code again,
    unless the loader's arguments refer to a function defined there
    (``refers_to_main``): then the worker imports the script as
    multiprocessing's spawn does (as ``__mp_main__``), and the script needs
    the guard, as with DataLoader under spawn. Nothing of this touches
    ``multiprocessing``'s settings in the user's process (no fork server,
    no preloads, no semaphores). The worker gets the parent's ``sys.path``
    and ``sys.argv``, its environment and working directory, and its isolation
    flags (``interpreter_flags``: a script run with ``-I`` or ``-E`` starts no
    worker that reads ``PYTHONPATH`` or the working directory).

    ``start_method="fork"`` forks the workers from the user's process
    through multiprocessing: no interpreter to start, and the script's
    functions as they are, but every lock of the script is copied as it is,
    held or not, so a lock another thread held at that moment (a logger's, a
    profiler's) never comes free in the worker. ``"forkserver"`` is taken as
    ``"spawn"``: both ask for a clean process, which is what a spawned
    worker is.

    Each worker has two pipes (``multiprocessing.connection.Connection``):
    the loader sends on one, the worker on the other. Pipes hold no named
    semaphores, so a killed job leaves nothing of them behind. A spawned
    worker also holds the read end of a third pipe whose write end the
    loader's process holds: it becomes readable when that process is gone,
    however it died, and the worker exits (``liveness.exit_with_parent``).
    A process the script forks later (a DataLoader's worker under fork)
    holds a copy of that end too, so then the workers exit once those end as
    well (they watch their own parent). A spawned worker that cannot start
    its target (the script fails to import, a function does not unpickle)
    sends why (``StartFailed``) before it exits.
"""

import multiprocessing
import os
import pickle
import pickletools
import runpy
import signal
import subprocess
import sys
import time
import traceback
import types
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union, cast

from .._internal.liveness import exit_with_parent

__all__ = ["BOOTSTRAP", "EOF", "START_METHODS", "StartFailed", "WorkerPool", "describe_exit", "interpreter_flags",
           "main_module", "refers_to_main", "run_spawned", "starting_a_worker"]

START_METHODS = ("spawn", "forkserver", "fork")

# What a spawned worker runs (``python -c``, with the parent's isolation flags: ``interpreter_flags``):
# the working directory that ``-c`` puts first on sys.path goes before anything is imported (a
# planted ``multiprocessing.py`` must not run), SIGINT is the loader's to handle (NOTE [shutdown
# order] in loader.py), sys.path must be the parent's before wdsmp itself is imported, the
# pickled call is read at once (the loader's send of it need not wait for the imports), and
# numpy loads with one BLAS thread (``numpy_one_thread``).
BOOTSTRAP = """\
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
from multiprocessing.connection import Connection
inbox, outbox, sentinel = (int(fd) for fd in sys.argv[1:4])
inbox = Connection(inbox, writable=False)
sys.path[:], sys.argv[:], main, worker = inbox.recv()
call = inbox.recv_bytes()
import wdsmp.fast.numpy_one_thread
from wdsmp.fast.pool import run_spawned
run_spawned(inbox, outbox, sentinel, main, call, worker)
"""

EOF = object()  # what ``WorkerPool.receive`` returns for a worker whose pipe has closed (it exited)

_importing_main = False  # set in a spawned worker while it imports the user's script


# sys.flags that keep code from the environment, the user's site or the working directory out
# of an interpreter, or change what it compiles, and the option that sets each.
_FLAG_OPTIONS = (("isolated", "-I"), ("ignore_environment", "-E"), ("no_user_site", "-s"), ("no_site", "-S"),
                 ("safe_path", "-P"), ("dont_write_bytecode", "-B"), ("bytes_warning", "-b"))


def interpreter_flags() -> List[str]:
    """The command-line options that give a spawned worker this interpreter's isolation and
    compilation settings (``-I``, ``-E``, ``-s``, ``-S``, ``-P``, ``-B``, ``-O``, ``-b``, ``-W``):
    a script run with ``python -I`` must not start workers that read ``PYTHONPATH`` or the
    user's site-packages, as multiprocessing's own spawn does not."""
    flags = sys.flags
    options = [option for name, option in _FLAG_OPTIONS for _ in range(int(getattr(flags, name, 0)))]
    options += ["-O"] * flags.optimize
    options += [f"-W{option}" for option in sys.warnoptions]
    return options


def starting_a_worker() -> bool:
    """Whether this process is a spawned worker still importing the user's script (NOTE [worker
    processes]): a loader made now comes from a script without a main guard."""
    return _importing_main


def _unpicklable(exn: BaseException) -> TypeError:
    """The error for workers' arguments that do not pickle, with the ways out."""
    return TypeError(f"what the workers are given must pickle, to reach their processes ({exn}): define "
                     f"functions at module level (not lambdas, nor functions defined in functions), or "
                     f"start the workers with start_method='fork'")


def refers_to_main(obj: object) -> bool:
    """Whether unpickling ``obj`` needs the ``__main__`` module; TypeError when ``obj`` does not pickle."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exn:
        raise _unpicklable(exn) from exn
    return any(arg in ("__main__", "__mp_main__") or (isinstance(arg, str) and arg.startswith("__main__ "))
               for _, arg, _ in pickletools.genops(data))


def main_module() -> Optional[Tuple[str, str]]:
    """How a spawned worker imports the user's script: ``("name", module name)`` for ``python -m``,
    ``("path", file)`` for a script; None where there is none to import (an interactive session,
    ``python -c``)."""
    main = sys.modules["__main__"]
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return "name", name
    path = getattr(main, "__file__", None)
    return None if path is None else ("path", os.path.abspath(path))


@dataclass(frozen=True)
class StartFailed:
    """What a spawned worker sends when it cannot start its target (the user's script fails to
    import, the call does not unpickle): the exception as text, before it exits."""

    exc_type: str
    message: str
    traceback: str


def run_spawned(inbox: Connection, outbox: int, sentinel: int, main: Optional[Tuple[str, str]], call: bytes,
                worker: int) -> None:
    """The rest of :data:`BOOTSTRAP` in a spawned worker: watch the parent (file descriptor
    ``sentinel``), import the user's script if asked (``main``, from ``main_module``), then run
    worker number ``worker`` of the pickled ``call`` with its pipes (``outbox``: a descriptor)."""
    global _importing_main
    sender = Connection(outbox, readable=False)
    exit_with_parent(sentinel)
    try:
        if main is not None:
            _importing_main = True
            try:
                how, where = main
                if how == "name":
                    namespace = runpy.run_module(where, run_name="__mp_main__", alter_sys=True)
                else:
                    namespace = runpy.run_path(where, run_name="__mp_main__")
                module = types.ModuleType("__mp_main__")
                module.__dict__.update(namespace)
                sys.modules["__main__"] = sys.modules["__mp_main__"] = module
            finally:
                _importing_main = False
        target, argsets = pickle.loads(call)
    except BaseException as exn:
        failure = StartFailed(type(exn).__qualname__, str(exn),
                              "".join(traceback.format_exception(type(exn), exn, exn.__traceback__)))
        try:
            sender.send(failure)
        except OSError:
            pass  # the loader is gone
        sys.exit(1)
    target(inbox, sender, *argsets[worker])


def _run_forked(target: Callable[..., object], inbox: Connection, outbox: Connection, args: Tuple[object, ...],
                parents_ends: Iterable[Connection]) -> None:
    """A forked worker: the loader's pipes are its; SIGINT is the loader's to handle. The copies
    of the loader's ends of the pipes (``parents_ends``) that the fork made are closed, so that
    the worker sees its pipe close when the loader closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    for connection in parents_ends:
        connection.close()
    target(inbox, outbox, *args)


class _Spawned:
    """A spawned worker's process, seen as a multiprocessing ``Process`` is (``pid``, ``exitcode``,
    ``join``, ``terminate``, ``kill``)."""

    def __init__(self, popen: "subprocess.Popen[bytes]") -> None:
        self.popen = popen
        self.pid = popen.pid

    @property
    def exitcode(self) -> Optional[int]:
        return self.popen.poll()

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self.popen.terminate()

    def kill(self) -> None:
        self.popen.kill()


class WorkerPool:
    """``len(argsets)`` worker processes running ``target(inbox, outbox, *args)``, one per argument
    tuple, started by ``start_method`` (NOTE [worker processes]): ``inbox`` is the connection the
    worker receives on, ``outbox`` the one it sends on. ``main``: a spawned worker imports the
    user's script first (``main_module()``)."""

    processes: "List[Union[multiprocessing.process.BaseProcess, _Spawned]]"
    inboxes: List[Connection]
    outboxes: List[Connection]
    _sentinel: Optional[int]

    def __init__(self, target: Callable[..., object], argsets: Sequence[Sequence[object]], start_method: str = "spawn",
                 main: bool = False, name: str = "wdsmp-worker") -> None:
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, not {start_method!r}")
        self.processes, self.inboxes, self.outboxes = [], [], []
        self._sentinel = None  # the write end of spawned workers' parent watch
        try:
            if start_method == "fork":
                self._fork(target, argsets, name)
            else:
                self._spawn(target, argsets, main_module() if main else None)
        except BaseException:  # no process left running that nobody will stop
            self.stop(0.0)
            raise

    def _fork(self, target: Callable[..., object], argsets: Sequence[Sequence[object]], name: str) -> None:
        if multiprocessing.current_process().daemon:
            raise ValueError("start_method='fork' cannot start workers from a daemonic process (a DataLoader's "
                             "worker, say): multiprocessing refuses it; use start_method='spawn' (the default), "
                             "whose workers need no multiprocessing")
        ctx = multiprocessing.get_context("fork")
        for i, args in enumerate(argsets):
            inbox, to_worker = _pipe()
            from_worker, outbox = _pipe()
            self.inboxes.append(to_worker)
            self.outboxes.append(from_worker)
            try:
                process = ctx.Process(target=_run_forked, name=f"{name}-{i}", daemon=True,
                                      args=(target, inbox, outbox, tuple(args), self.inboxes + self.outboxes))
                process.start()
            finally:
                inbox.close()
                outbox.close()
            self.processes.append(process)

    def _spawn(self, target: Callable[..., object], argsets: Sequence[Sequence[object]],
               main: Optional[Tuple[str, str]]) -> None:
        # Pickled once for all, before any process starts: what the argument tuples share (the
        # loader's settings) goes once.
        try:
            call = pickle.dumps((target, [tuple(args) for args in argsets]), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as exn:
            raise _unpicklable(exn) from exn
        watch, self._sentinel = os.pipe()
        try:
            for _ in argsets:  # all started first: each imports its modules while the next starts
                inbox, to_worker = os.pipe()
                from_worker, outbox = os.pipe()
                self.inboxes.append(Connection(to_worker, readable=False))
                self.outboxes.append(Connection(from_worker, writable=False))
                try:
                    popen = subprocess.Popen([sys.executable, *interpreter_flags(), "-c", BOOTSTRAP, str(inbox),
                                              str(outbox), str(watch)], pass_fds=(inbox, outbox, watch))
                finally:
                    os.close(inbox)
                    os.close(outbox)
                self.processes.append(_Spawned(popen))
        finally:
            os.close(watch)
        for worker, connection in enumerate(self.inboxes):
            connection.send((sys.path, sys.argv, main, worker))
            connection.send_bytes(call)

    def send(self, worker: int, message: object) -> bool:
        """Send ``message`` to worker ``worker``; False where it cannot take it any more (it exited:
        the liveness checks report that)."""
        try:
            self.inboxes[worker].send(message)
            return True
        except (OSError, ValueError):  # a broken pipe, or closed by stop()
            return False

    def receive(self, workers: Iterable[int], timeout: Optional[float], most: int = 64) -> List[Tuple[int, Any]]:
        """``[(worker, message), ...]``: the messages waiting from ``workers`` (at most ``most`` from
        each), waiting up to ``timeout`` seconds for the first; the message is :data:`EOF` where a
        worker's pipe has closed (it exited; it is not listened to again)."""
        connections = {self.outboxes[w]: w for w in workers if not self.outboxes[w].closed}
        received: List[Tuple[int, Any]] = []
        for connection in cast(List[Connection], wait(list(connections), timeout)):
            worker = connections[connection]
            for _ in range(most):
                try:
                    received.append((worker, connection.recv()))
                except (EOFError, OSError):
                    connection.close()
                    received.append((worker, EOF))
                    break
                if not connection.poll():
                    break
        return received

    def dead(self) -> List[Tuple[int, int]]:
        """``[(worker, exitcode), ...]`` of the workers that have exited."""
        return [(i, p.exitcode) for i, p in enumerate(self.processes) if p.exitcode is not None]

    def join(self, worker: int, timeout: Optional[float]) -> None:
        """Wait up to ``timeout`` seconds for worker ``worker`` to exit."""
        self.processes[worker].join(timeout)

    def pids(self) -> List[Optional[int]]:
        return [p.pid for p in self.processes]

    def activity(self, worker: int) -> Optional[Tuple[Tuple[int, float, float, int, int, Tuple[int, ...]], ...]]:
        """What worker ``worker``'s process and the processes it started (a program a stage
        runs) have done so far, as the kernel counts it, each process apart: CPU time (all
        threads), bytes read and written, and context switches (each sleep, wait or blocking
        read that returned). Two equal snapshots mean none of them did anything in between:
        stopped (SIGSTOP), stuck in a read that never returns, or deadlocked. None when the
        worker cannot be read (it is gone, or /proc says nothing)."""
        import psutil

        try:
            process = psutil.Process(self.processes[worker].pid)
            family = [process, *process.children(recursive=True)]
        except (psutil.Error, OSError):
            return None
        snapshot: List[Tuple[int, float, float, int, int, Tuple[int, ...]]] = []
        for member in family:
            try:
                with member.oneshot():
                    cpu, switches = member.cpu_times(), member.num_ctx_switches()
                    try:
                        io = member.io_counters()  # read_chars counts sockets and pipes too
                    except (psutil.AccessDenied, AttributeError):
                        io = ()
            except (psutil.Error, OSError):
                if member is process:
                    return None
                continue  # a child that ended meanwhile: the snapshot changes, a sign of life
            snapshot.append((member.pid, cpu.user, cpu.system, switches.voluntary, switches.involuntary, tuple(io)))
        return tuple(snapshot)

    def state(self, worker: int) -> str:
        """Worker ``worker``'s process state in the kernel's words ("stopped", "disk-sleep", ...)."""
        import psutil

        try:
            return psutil.Process(self.processes[worker].pid).status()
        except (psutil.Error, OSError):
            return "unknown"

    def kill(self, worker: int) -> None:
        """SIGKILL worker ``worker`` and the processes it started (a stopped process too; one in
        an uninterruptible read dies when the read returns)."""
        _kill_children(self.processes[worker].pid)
        self.processes[worker].kill()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the pipes (a worker blocked sending gets a broken pipe; one waiting for messages
        reads what was sent, then the end), wait up to ``timeout`` seconds for the workers to exit,
        then terminate, then kill the rest. Idempotent."""
        for connection in self.outboxes + self.inboxes:
            connection.close()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        if self._sentinel is not None:
            os.close(self._sentinel)  # what a spawned worker watches for its parent's end
            self._sentinel = None
        for escalate in ("terminate", "kill"):
            alive = [p for p in self.processes if p.exitcode is None]
            if not alive:
                break
            for process in alive:
                if escalate == "kill":
                    _kill_children(process.pid)  # what the worker started goes with it
                getattr(process, escalate)()
            for process in alive:
                process.join(2.0)


def _kill_children(pid: Optional[int]) -> None:
    """SIGKILL the processes that process ``pid`` started, and theirs."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.Error, OSError):
        return
    for child in children:
        try:
            child.kill()
        except (psutil.Error, OSError):
            pass


def _pipe() -> Tuple[Connection, Connection]:
    """``(read end, write end)`` of a new pipe, as connections."""
    read, write = os.pipe()
    return Connection(read, writable=False), Connection(write, readable=False)


def describe_exit(exitcode: Optional[int]) -> str:
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
