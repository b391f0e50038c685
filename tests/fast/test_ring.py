"""Ring: create, attach, close and unlink across real processes; stale clean-up; a full /dev/shm.

Every test uses its own name prefix, and a fixture checks that nothing with
it is left in /dev/shm afterwards.
"""

import errno
import fcntl
import gc
import multiprocessing
import os
import pickle
import secrets
import signal
import subprocess
import sys
import time
from multiprocessing import resource_tracker

import numpy as np
import pytest

from wdsmp.fast import ring as ring_module
from wdsmp.fast.layout import ArraySpec, BatchLayout
from wdsmp.fast.ring import SHM_DIR, Ring, cleanup_stale

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYOUT = BatchLayout(4, [ArraySpec("image", (8, 8, 3), "uint8"), ArraySpec("label", (), "int64")])
TIMEOUT = 60


@pytest.fixture(scope="module")
def ctx():
    """A forkserver context that imports wdsmp once, so each child starts in milliseconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["wdsmp.fast.ring"])
    return context


@pytest.fixture
def prefix():
    prefix = f"wdsmp-test-{secrets.token_hex(4)}-"
    yield prefix
    left = sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    for name in left:
        os.unlink(os.path.join(SHM_DIR, name))
    assert left == [], f"left in {SHM_DIR}: {left}"


def exists(name):
    return os.path.exists(os.path.join(SHM_DIR, name))


def join(process):
    process.join(TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(TIMEOUT)
        pytest.fail("child process hung")
    return process.exitcode


# -- children (module level, so they pickle by name)


def _write_slot(ring, slot, value):
    """Attach (by unpickling ``ring``), fill ``slot`` with ``value``, close."""
    views = ring.views(slot)
    views["image"][:] = value
    views["label"][:] = np.arange(4) + value
    ring.close()


def _write_and_exit(name, layout):
    """Attach by name, write, and exit without closing."""
    Ring.attach(name, layout).views(0)["label"][:] = 99


def _own_until_killed(layout, prefix, queue):
    """Own a ring, as an owner whose resource tracker died with it, until SIGKILLed."""
    ring = Ring.create(layout, 2, prefix=prefix)
    resource_tracker.unregister(f"/{ring.name}", "shared_memory")
    queue.put(ring.name)
    time.sleep(TIMEOUT)


def _close_fork_copy(ring):
    if ring.owner:
        raise AssertionError("a forked copy believes it owns the ring")
    ring.close()


# -- one process


def test_create_views_close(prefix):
    ring = Ring.create(LAYOUT, 3, prefix=prefix)
    assert ring.owner and not ring.closed and ring.nslots == 3
    assert ring.name.startswith(f"{prefix}{os.getpid()}-") and exists(ring.name)
    assert ring.size == LAYOUT.ring_size(3) == os.stat(os.path.join(SHM_DIR, ring.name)).st_size
    views = ring.views(2)
    assert views["image"].shape == (4, 8, 8, 3) and (views["image"] == 0).all()
    views["label"][:] = 5
    assert (ring.views(2)["label"] == 5).all() and (ring.views(1)["label"] == 0).all()
    del views
    ring.close()
    assert ring.closed and not exists(ring.name)
    ring.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        ring.views(0)


def test_context_manager_and_del_unlink(prefix):
    with Ring.create(LAYOUT, 1, prefix=prefix) as ring:
        assert exists(ring.name)
    assert not exists(ring.name)
    dropped = Ring.create(LAYOUT, 1, prefix=prefix)
    name = dropped.name
    del dropped
    gc.collect()
    assert not exists(name)


def test_attach_shares_memory_and_does_not_unlink(prefix):
    owner = Ring.create(LAYOUT, 2, prefix=prefix)
    attached = Ring.attach(owner.name, LAYOUT)
    assert not attached.owner and attached.nslots == 2
    attached.views(1)["label"][:] = [1, 2, 3, 4]
    assert owner.views(1)["label"].tolist() == [1, 2, 3, 4]
    attached.close()
    attached.close()
    assert exists(owner.name)
    owner.close()
    assert not exists(owner.name)
    with pytest.raises(FileNotFoundError, match="has closed it or died"):
        Ring.attach(owner.name, LAYOUT)


def test_attach_with_another_layout_fails_clearly(prefix):
    with Ring.create(LAYOUT, 2, prefix=prefix) as owner:
        other = BatchLayout(4, [ArraySpec("image", (16, 16, 3), "uint8"), ArraySpec("label", (), "int64")])
        with pytest.raises(ValueError, match=rf"cannot attach to ring '{owner.name}'.*different layout"):
            Ring.attach(owner.name, other)


def test_attach_rejects_files_that_are_not_rings(prefix):
    empty, junk = f"{prefix}empty", f"{prefix}junk"
    with open(os.path.join(SHM_DIR, empty), "wb"):
        pass
    with open(os.path.join(SHM_DIR, junk), "wb") as f:
        f.write(b"x" * 8192)
    try:
        with pytest.raises(ValueError, match="is empty: not a wdsmp ring"):
            Ring.attach(empty, LAYOUT)
        with pytest.raises(ValueError, match="not a wdsmp ring"):
            Ring.attach(junk, LAYOUT)
    finally:
        os.unlink(os.path.join(SHM_DIR, empty))
        os.unlink(os.path.join(SHM_DIR, junk))


@pytest.mark.parametrize("call, error, match", [
    (lambda p: Ring.create(LAYOUT, 0, prefix=p), ValueError, "nslots must be a positive int"),
    (lambda p: Ring.create(LAYOUT, 2, prefix="bad/prefix"), ValueError, "prefix must be"),
    (lambda p: Ring.create(LAYOUT, 2, prefix=""), ValueError, "prefix must be"),
    (lambda p: Ring.create("layout", 2, prefix=p), TypeError, "must be a BatchLayout"),
    (lambda p: Ring.attach("../etc/passwd", LAYOUT), ValueError, "is not a ring name"),
    (lambda p: Ring.attach(p + "x", None), TypeError, "must be a BatchLayout"),
    (lambda p: cleanup_stale(prefix="a/b"), ValueError, "prefix must be"),
])
def test_bad_arguments(prefix, call, error, match):
    with pytest.raises(error, match=match):
        call(prefix)


def test_pickling_carries_name_and_layout_only(prefix):
    big = BatchLayout(16, [ArraySpec("image", (256, 256, 3), "uint8")])
    with Ring.create(big, 2, prefix=prefix) as owner:
        data = pickle.dumps(owner)
        assert len(data) < 1024 and owner.name.encode() in data
        copy = pickle.loads(data)
        assert not copy.owner and copy.name == owner.name and copy.layout == big
        copy.close()
        assert exists(owner.name)


def test_arrays_outlive_close(prefix):
    ring = Ring.create(LAYOUT, 1, prefix=prefix)
    labels = ring.views(0)["label"]
    labels[:] = 3
    ring.close()  # must neither raise nor unmap what `labels` points at
    assert not exists(ring.name)
    labels += 1
    assert labels.tolist() == [4, 4, 4, 4]


def test_a_full_dev_shm_is_a_clear_error(prefix):
    huge = BatchLayout(1 << 20, [ArraySpec("x", (1 << 20,), "u1")])  # 1 TiB a slot
    with pytest.raises(OSError, match=r"needs 4,194,304\.0 MiB \(4 slots.*/dev/shm has only.*fewer workers") as info:
        Ring.create(huge, 4, prefix=prefix)
    assert info.value.errno == errno.ENOSPC


def test_failed_reservation_is_a_clear_error_and_leaves_nothing(prefix, monkeypatch):
    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ring_module.os, "posix_fallocate", no_room)
    with pytest.raises(OSError, match="smaller batch_size") as info:
        Ring.create(LAYOUT, 2, prefix=prefix)
    assert info.value.errno == errno.ENOSPC


# -- real processes


def test_attacher_processes_write_the_owner_reads(prefix, ctx):
    with Ring.create(LAYOUT, 3, prefix=prefix) as owner:
        children = [ctx.Process(target=_write_slot, args=(owner, slot, 10 * (slot + 1))) for slot in range(3)]
        for child in children:
            child.start()
        assert [join(child) for child in children] == [0, 0, 0]
        for slot in range(3):
            views = owner.views(slot)
            assert (views["image"] == 10 * (slot + 1)).all()
            assert views["label"].tolist() == [10 * (slot + 1) + i for i in range(4)]
        assert exists(owner.name)
    assert not exists(owner.name)


def test_attacher_exit_without_close_leaves_the_ring(prefix, ctx):
    with Ring.create(LAYOUT, 1, prefix=prefix) as owner:
        child = ctx.Process(target=_write_and_exit, args=(owner.name, LAYOUT))
        child.start()
        assert join(child) == 0
        assert exists(owner.name) and owner.views(0)["label"].tolist() == [99] * 4


def test_attacher_with_its_own_resource_tracker_does_not_unlink(prefix):
    """The multiprocessing.shared_memory pitfall: an unrelated process attaching with
    SharedMemory(name) registers the name, and its tracker unlinks it when it exits."""
    code = ("import pickle, sys\n"
            "from multiprocessing import resource_tracker\n"
            "ring = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
            "ring.views(0)['label'][:] = 42\n"
            "print(resource_tracker._resource_tracker._pid)\n")  # exits without close()
    with Ring.create(LAYOUT, 1, prefix=prefix) as owner:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        result = subprocess.run([sys.executable, "-c", code, pickle.dumps(owner).hex()], env=env,
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "None"  # it never started a resource tracker
        time.sleep(0.3)  # the time a tracker would take to clean up after its process
        assert exists(owner.name) and owner.views(0)["label"].tolist() == [42] * 4


def test_a_forked_copy_of_the_owner_does_not_unlink(prefix):
    with Ring.create(LAYOUT, 1, prefix=prefix) as owner:
        child = multiprocessing.get_context("fork").Process(target=_close_fork_copy, args=(owner,))
        child.start()
        assert join(child) == 0
        assert exists(owner.name) and owner.owner


def test_cleanup_stale_removes_a_killed_owners_ring_only(prefix, ctx):
    queue = ctx.Queue()
    child = ctx.Process(target=_own_until_killed, args=(LAYOUT, prefix, queue))
    child.start()
    try:
        name = queue.get(timeout=TIMEOUT)
        assert name.startswith(f"{prefix}{child.pid}-") and exists(name)
        with Ring.create(LAYOUT, 1, prefix=prefix) as mine:
            assert cleanup_stale(prefix) == []  # both owners are alive
            os.kill(child.pid, signal.SIGKILL)
            assert join(child) == -signal.SIGKILL
            assert exists(name)
            assert cleanup_stale(prefix) == [name]
            assert not exists(name) and exists(mine.name)
            assert cleanup_stale(prefix) == []
    finally:
        if child.is_alive():
            child.kill()
            join(child)


def test_cleanup_stale_spares_a_locked_ring_and_foreign_names(prefix):
    dead_pid = 2**31 - 1  # above any pid_max
    stale = f"{prefix}{dead_pid}-{secrets.token_hex(4)}"
    foreign = [f"{prefix}notapid", f"{prefix}{dead_pid}-XYZ", f"wdsmp-other-{dead_pid}-{secrets.token_hex(4)}"]
    for name in [stale, *foreign]:
        open(os.path.join(SHM_DIR, name), "wb").close()
    try:
        holder = os.open(os.path.join(SHM_DIR, stale), os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)  # a live owner whose pid we cannot see (another pid namespace)
        assert cleanup_stale(prefix) == [] and exists(stale)
        os.close(holder)
        assert cleanup_stale(prefix) == [stale] and not exists(stale)
        assert all(exists(name) for name in foreign)
    finally:
        for name in [stale, *foreign]:
            if exists(name):
                os.unlink(os.path.join(SHM_DIR, name))
