"""The worker pool: its reliance on CPython internals (NOTE [CPython internals]: each test fails,
naming the internal, on a Python where it is gone, rather than letting wdsmp degrade silently), and
the sweep of semaphores left by dead loaders (NOTE [semaphore names])."""

import fcntl
import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing import forkserver

import pytest

from wdsmp.fast import pool


@pytest.fixture
def preloads_restored():
    """The fork server's preload list as it was before the test (context() adds to it)."""
    server = forkserver._forkserver
    before = list(getattr(server, "_preload_modules", ["__main__"]))
    yield
    server._preload_modules = before


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_forkserver_preloads_are_where_cpython_keeps_them(preloads_restored):
    server = getattr(forkserver, "_forkserver", None)
    assert server is not None, "CPython no longer has multiprocessing.forkserver._forkserver"
    assert isinstance(getattr(server, "_preload_modules", None), list), \
        "CPython no longer keeps the fork server's preloads in _forkserver._preload_modules"
    multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", "json"])
    assert pool._forkserver_preloads() == ["__main__", "json"]


def test_preloads_drop_the_main_script_only_where_cpython_put_it_and_no_worker_needs_it():
    """NOTE [light workers]: the default ["__main__"] would import the user's script, and torch
    with it, into the fork server."""
    ours = ["wdsmp.fast.numpy_one_thread", "wdsmp.fast.worker"]
    assert pool.preloads(["__main__"], main=False) == ours
    assert pool.preloads(["__main__"], main=True) == ["__main__", *ours]
    assert pool.preloads(["__main__", "json"], main=False) == ["__main__", "json", *ours]
    assert pool.preloads(["json", *ours], main=True) == ["json", *ours]
    assert pool.preloads([], main=False) == ours


def test_processes_started_by_one_thread_leave_the_main_script_out_and_the_others_do_not():
    """``_main_hidden`` wraps what CPython's spawn and forkserver processes prepare themselves from
    (``spawn.get_preparation_data``); a thread starting workers behind a first batch hides the
    script from them alone (NOTE [main module])."""
    from multiprocessing import popen_forkserver, popen_spawn_posix, spawn

    main = {"init_main_from_name", "init_main_from_path"}  # python -m pytest, or the pytest script
    assert main & set(spawn.get_preparation_data("x"))
    seen = {}
    inside, leave = threading.Event(), threading.Event()

    def starter():
        with pool._main_hidden():
            seen["hidden"] = spawn.get_preparation_data("x")
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=starter)
    thread.start()
    inside.wait(10)
    seen["other thread"] = spawn.get_preparation_data("x")
    leave.set()
    thread.join()
    assert not main & set(seen["hidden"])
    assert main & set(seen["other thread"]) and main & set(spawn.get_preparation_data("x"))
    for popen in (popen_forkserver, popen_spawn_posix):
        assert popen.spawn is spawn, f"CPython's {popen.__name__} no longer prepares processes through spawn"


def test_semaphore_prefix_is_where_cpython_reads_it():
    config = getattr(multiprocessing.current_process(), "_config", None)
    assert isinstance(config, dict) and "semprefix" in config, \
        "CPython no longer keeps the semaphore name prefix in current_process()._config['semprefix']"
    before = config["semprefix"]
    with pool.named_semaphores():
        lock = multiprocessing.get_context("spawn").Lock()
    assert config["semprefix"] == before
    name = lock._semlock.name  # what sweep_semaphores finds in /dev/shm, less "sem."
    assert name.startswith(f"/{pool.SEM_PREFIX}{os.getpid()}-"), \
        f"a semaphore made inside named_semaphores() is named {name!r}: SemLock no longer reads semprefix"


@pytest.mark.processes
def test_a_spawned_child_importing_the_main_script_is_seen(tmp_path):
    """``starting_a_worker`` is what turns a loader built by a script without a main guard into
    an error instead of workers that start workers; it reads CPython's ``_inheriting``."""
    script = tmp_path / "script.py"
    record = tmp_path / "seen"
    script.write_text(
        "import multiprocessing, sys\n"
        "from wdsmp.fast import pool\n"
        "if __name__ != '__main__':\n"
        f"    open({str(record)!r}, 'w').write(str(pool.starting_a_worker()))\n"
        "def child():\n"
        "    pass\n"
        "if __name__ == '__main__':\n"
        "    assert not pool.starting_a_worker()\n"
        "    p = multiprocessing.get_context('spawn').Process(target=child)\n"
        "    p.start(); p.join(60)\n"
        "    sys.exit(p.exitcode)\n")
    subprocess.run([sys.executable, str(script)], check=True, timeout=120)
    assert record.read_text() == "True", \
        "CPython no longer sets current_process()._inheriting while a spawned child imports the main script"


def test_the_semaphore_sweep_goes_by_the_owners_lock_not_its_pid(tmp_path):
    """A pid from another PID namespace means nothing here (2**31 - 1 is no process at all), yet
    the owner that holds its lock lives; without a lock file, or with its lock free, it is gone."""
    key = f"{2**31 - 1}-0123abcd"
    owned = [f"sem.{pool.SEM_PREFIX}{key}-a1b2c3d4", f"sem.{pool.SEM_PREFIX}{key}-e5f6_7h8", f"{pool.SEM_PREFIX}{key}.lock"]
    orphan = f"sem.{pool.SEM_PREFIX}{2**31 - 2}-4567cdef-zz"  # its lock file is gone: its owner too
    foreign = ["sem.mp-123-abc", f"sem.{pool.SEM_PREFIX}123-abc", "wdsmp-123-0123abcd"]
    for name in [*owned, orphan, *foreign]:
        (tmp_path / name).write_bytes(b"")
    with open(tmp_path / owned[-1], "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the owner, alive in a namespace of its own
        assert pool.sweep_semaphores(str(tmp_path)) == [orphan]
    assert sorted(pool.sweep_semaphores(str(tmp_path))) == sorted(owned)
    assert sorted(os.listdir(tmp_path)) == sorted(foreign)
