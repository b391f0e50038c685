"""Fixtures shared by the suite: both implementations of the native core, tar builders, and the
leak checks: no test may leave a wdsmp shared-memory segment, and the session must end without
stray child processes or open files."""

import gc
import io
import os
import re
import tarfile

import psutil
import pytest

import wdsmp.native.core
from tests.servers import _file_server, _moto_server, _proxy_server, http_proxy, http_server, s3_server  # noqa: F401
from tests.servers import without_proxies


@pytest.fixture(params=["native", "python"])
def impl(request, monkeypatch):
    """Run a test once with the native core and once with its pure-Python twin."""
    if request.param == "python":
        monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    else:
        monkeypatch.delenv("WDSMP_PUREPYTHON", raising=False)
        if not wdsmp.native.core.native_available():
            pytest.skip("native core not built")
    return request.param


def region_decoder_missing():
    """Why the JPEG region decoder is not in use, for a skip message: in the pure-Python twins'
    variant of a test (``WDSMP_PUREPYTHON=1``, as ``impl`` sets it or the second CI run does) it
    has no twin, and the native variant runs the test; otherwise it was not built."""
    if os.environ.get("WDSMP_PUREPYTHON", "").strip().lower() in ("1", "true", "yes", "on"):
        return ("pure-Python twins' variant (WDSMP_PUREPYTHON=1): the JPEG region decoder has no twin; "
                "the native variant runs this test")
    return "the JPEG region decoder is not built here (no libjpeg-turbo headers at build time)"


def tar_bytes(members, format=tarfile.GNU_FORMAT, extra=None):
    """A tar archive in memory from ``[(name, data), ...]``; ``extra(tar)`` may add more."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            extra(tar)
    return buf.getvalue()


def write_tar(path, members, **kw):
    path.write_bytes(tar_bytes(members, **kw))
    return str(path)


def _segments():
    """This process's wdsmp segments (names end in ``-<owner pid>-<random>``; other processes on
    the machine may be running loaders of their own)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    mine = re.compile(rf"wdsmp-(.*-)?{os.getpid()}-[0-9a-f]{{8}}")
    return {name for name in os.listdir("/dev/shm") if mine.fullmatch(name)}


@pytest.fixture(autouse=True, scope="session")
def user_cache(tmp_path_factory):
    """The user's cache directory (where local shards' sample counts are kept) is the suite's own,
    never the home directory of whoever runs it."""
    directory = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(directory)
    yield directory
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    """No proxy variable of the machine running the suite reaches the tests: http(s) URLs follow
    them, and the test servers are on 127.0.0.1 (tests of proxies set their own)."""
    without_proxies(monkeypatch)


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Every test leaves /dev/shm as it found it (NOTE [ring ownership])."""
    before = _segments()
    yield
    leaked = _segments() - before
    if leaked:
        gc.collect()  # a loader only dropped, not closed, is closed by its finalizer
        leaked = _segments() - before
    assert not leaked, f"the test left shared-memory segments behind: {sorted(leaked)}"


# multiprocessing's own helpers live as long as the interpreter: not leaks.
_INFRASTRUCTURE = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def _open_files():
    """{fd: path} of this process's descriptors that are files (pipes and sockets belong to
    servers and multiprocessing's helpers)."""
    files = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/pym-") and target.endswith(" (deleted)"):
            continue  # an arena of multiprocessing's shared heap: kept for the process's life by design
        if "/matplotlib/mpl-data/fonts/" in target:
            continue  # matplotlib caches the fonts it drew with, open, for the process's life
        if target.startswith("/") and not target.startswith(("/dev/null", "/dev/pts", "/dev/tty", "/proc/")):
            files[int(fd)] = target
    return files


# The tests that exercise the pure-Python twins (wdsmp.native's tarsplit_py, imgops_py and pilimage_py):
# the tests of the modules with twins, and of the readers and loaders that call them. With
# WDSMP_PUREPYTHON=1, CI's second pass runs these (``-m twins``); every other test reaches the twins
# only through the same calls these make, so running it twice checks nothing more.
TWIN_TESTS = frozenset({
    "tests/test_tarsplit.py", "tests/test_tarheaders.py", "tests/test_tariterators.py", "tests/test_samplespans.py",
    "tests/test_shardcount.py", "tests/test_roundtrip.py", "tests/test_specdecode.py", "tests/test_lazyjpeg.py",
    "tests/test_autodecode.py", "tests/test_exact.py", "tests/test_cache.py", "tests/test_seeds.py",
    "tests/fast/test_imgops.py", "tests/fast/test_imagedecode.py", "tests/fast/test_loader.py",
    "tests/fast/test_order.py", "tests/cli/test_verify.py", "tests/cli/test_index.py",
})


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        if str(item.path.relative_to(root)) in TWIN_TESTS:
            item.add_marker(pytest.mark.twins)


def pytest_sessionstart(session):
    session.config._wdsmp_files = _open_files()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run on child processes or open files left behind by the suite."""
    gc.collect()
    stray = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or any(h in " ".join(child.cmdline()) for h in _INFRASTRUCTURE):
                continue
            stray.append(f"pid {child.pid}: {' '.join(child.cmdline())[:200]}")
        except psutil.NoSuchProcess:
            continue
    before = session.config._wdsmp_files
    files = sorted(f"{path} (fd {fd})" for fd, path in _open_files().items() if before.get(fd) != path)
    if stray or files:
        print("\nleak check: the suite left " + "; ".join(
            [f"child processes: {', '.join(stray)}"] * bool(stray) + [f"open files: {', '.join(files)}"] * bool(files)))
        session.exitstatus = 1
