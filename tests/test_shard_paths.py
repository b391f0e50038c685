"""Local shard paths that are not regular files, given to FastLoader, ``ExactSamples`` and
``wdsmp bench``: each is named for what it is, with its path, and none is opened (a FIFO
would block the open for good). Each case runs in a child process with a timeout, so that a
hang is a failure and not a stuck suite; FastLoader's cases use real worker processes."""

import json
import os
import signal
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import simplejpeg

import wdsmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120  # seconds for a child: generous on a loaded machine, and far less than a hang

# What the error says of each kind of path.
KINDS = {
    "directory": "is a directory, not a shard file",
    "symlink loop": "symlink loop: its symbolic links lead back to themselves",
    "FIFO": "not a regular file but a FIFO",
    "symlink to /dev/null": "not a regular file but a character device (by a symbolic link to '/dev/null')",
}


def _clear(path):
    for name in (path, path + ".back"):
        if os.path.isdir(name) and not os.path.islink(name):
            os.rmdir(name)
        elif os.path.lexists(name):
            os.remove(name)


def make_kind(kind, path):
    """Put a path of ``kind`` (a key of KINDS) at ``path``, in place of what is there."""
    _clear(path)
    if kind == "directory":
        os.mkdir(path)
    elif kind == "symlink loop":
        os.symlink(path + ".back", path)
        os.symlink(path, path + ".back")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        os.symlink(os.devnull, path)


def put_back(path, source):
    """A copy of the shard ``source`` at ``path``, in place of what is there."""
    _clear(path)
    shutil.copyfile(source, path)


def outcome(phase, action):
    """Run ``action`` and print on stdout, as a JSON line, what it raised (or that it raised nothing)."""
    try:
        action()
        found = {"phase": phase, "type": None}
    except Exception as exn:  # noqa: BLE001 - reported to the test, which judges it
        found = {"phase": phase, "type": f"{type(exn).__module__}.{type(exn).__qualname__}", "message": str(exn),
                 "shard": getattr(exn, "shard", getattr(exn, "url", None))}
    print(json.dumps(found), flush=True)


def _shard(path, count=8):
    rng = np.random.default_rng(1)
    with wdsmp.TarWriter(str(path)) as sink:
        for i in range(count):
            pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
            sink.write({"__key__": f"k{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": str(i).encode()})
    return str(path)


def _run(argv):
    """``(status, stdout, stderr)`` of the command ``argv``, run from the repository root; a
    failure if it runs past TIMEOUT (its process group is killed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        pytest.fail(f"{argv[:4]} still running after {TIMEOUT}s (a shard path blocked it):\n{out}\n{err[-3000:]}")
    return child.returncode, out, err


def _phases(script, kind, *paths):
    """The outcomes ``script`` printed (``outcome``), by phase."""
    status, out, err = _run([sys.executable, "-c", textwrap.dedent(script), kind, *paths])
    assert status == 0, err[-3000:]
    return {entry["phase"]: entry for entry in map(json.loads, out.splitlines())}


_FASTLOADER = """
    import sys
    from tests.test_shard_paths import make_kind, outcome, put_back
    from wdsmp.fast.loader import FastLoader

    kind, good, bad, later = sys.argv[1:]
    make_kind(kind, bad)
    outcome("made", lambda: FastLoader([good, bad], 4, num_workers=1, image_size=16))

    def read(**kw):
        put_back(later, good)
        with FastLoader([good, later], 4, num_workers=1, image_size=16, **kw) as loader:
            make_kind(kind, later)
            list(loader)

    outcome("read in shards order", lambda: read(shuffle=False))
    outcome("read in global order", lambda: read(shuffle=True, order="global"))
"""

_EXACT = """
    import sys
    from tests.test_shard_paths import make_kind, outcome, put_back
    from wdsmp.epochs.exact import ExactSamples

    kind, good, bad, later = sys.argv[1:]
    make_kind(kind, bad)
    outcome("made", lambda: ExactSamples([good, bad], 4))

    def read(**kw):
        put_back(later, good)
        samples = ExactSamples([good, later], 4, **kw)
        make_kind(kind, later)
        list(samples)

    outcome("read in shards order", lambda: read(shuffle=False))
    outcome("read in global order", lambda: read(shuffle=True, order="global"))
"""


def _assert_named(found, kind, path, error):
    """``found`` (an ``outcome``) is an ``error`` naming ``path`` and what KINDS says of ``kind``."""
    assert found["type"] == error, found
    assert KINDS[kind] in found["message"] and path in found["message"], found
    assert "no such file" not in found["message"].lower(), found
    assert found["shard"] == path, found


@pytest.fixture
def shards(tmp_path):
    """``(a good shard, where the bad path goes, where a good shard is made bad once a loader has it)``."""
    return _shard(tmp_path / "train-000000.tar"), str(tmp_path / "train-000001.tar"), str(tmp_path / "train-000002.tar")


@pytest.mark.processes
@pytest.mark.parametrize("kind", list(KINDS))
def test_fastloader_names_a_shard_path_for_what_it_is(shards, kind):
    """When the loader is made, and in its worker when the path became one since."""
    good, bad, later = shards
    phases = _phases(_FASTLOADER, kind, good, bad, later)
    _assert_named(phases["made"], kind, bad, "wdsmp.errors.ShardError")
    assert f"(shard {bad!r})" in phases["made"]["message"]
    for phase in ("read in shards order", "read in global order"):
        _assert_named(phases[phase], kind, later, "wdsmp.errors.WorkerError")
        assert f"wdsmp.errors.ShardError: {KINDS[kind]}" in phases[phase]["message"], phases[phase]


@pytest.mark.processes
@pytest.mark.parametrize("kind", list(KINDS))
def test_exactsamples_names_a_shard_path_for_what_it_is(shards, kind):
    """When the dataset is made, and when it reads a path that became one since."""
    good, bad, later = shards
    phases = _phases(_EXACT, kind, good, bad, later)
    for phase, path in (("made", bad), ("read in shards order", later), ("read in global order", later)):
        _assert_named(phases[phase], kind, path, "wdsmp.errors.ShardError")
        assert phases[phase]["message"].startswith(KINDS[kind]), phases[phase]


@pytest.mark.processes
@pytest.mark.parametrize("kind", list(KINDS))
def test_bench_names_a_shard_path_for_what_it_is(shards, tmp_path, kind):
    """A usage error before any shard is read (finding the image field reads the first one)."""
    good, bad, _ = shards
    make_kind(kind, bad)
    status, out, err = _run([sys.executable, "-m", "wdsmp.cli", "bench", bad, good, "--max-workers", "1",
                             "--seconds", "0.2", "--warmup", "0", "--batch-size", "4", "--quiet",
                             "--plot", str(tmp_path / "bench.png")])
    assert status == 2, (out, err)
    assert err.startswith(f"wdsmp bench: {KINDS[kind]}") and f"(shard {bad!r})" in err, err
    assert "no such file" not in err.lower(), err
