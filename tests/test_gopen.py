"""Tests of wdsmp.gopen: real files, real subprocesses, no mocks."""

import io
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from wdsmp.errors import PipeError, ShardError
from wdsmp.gopen import (
    Pipe,
    gopen,
    gopen_schemes,
    local_path,
    reader,
    register_scheme,
)

DATA = bytes(range(256)) * 4099  # ~1 MiB, not a multiple of any buffer size
ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def datafile(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    return path


def read_all_into(stream, size=1 << 20):
    """Read the way the tar splitter does: readinto a reused memoryview until 0."""
    buf = bytearray(size)
    view = memoryview(buf)
    out = bytearray()
    while True:
        n = stream.readinto(view)
        if n == 0:
            return bytes(out)
        out += view[:n]


def assert_reaped(pid):
    """The child is gone and was waited for: no zombie left behind."""
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]


# local files


@pytest.mark.parametrize("form", ["plain", "path", "file_url", "file_localhost"])
def test_local_read_write(tmp_path, form):
    path = tmp_path / "out.bin"
    url = {
        "plain": str(path),
        "path": path,
        "file_url": f"file://{path}",
        "file_localhost": f"file://localhost{path}",
    }[form]
    with gopen(url, "wb") as stream:
        stream.write(DATA)
    assert path.read_bytes() == DATA
    with gopen(url) as stream:
        assert isinstance(stream, io.BufferedReader)
        assert read_all_into(stream) == DATA


def test_file_relative_and_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a b.bin").write_bytes(b"hello")
    with gopen("file:a b.bin") as stream:
        assert stream.read() == b"hello"
    with reader(f"file://{tmp_path}/a%20b.bin") as stream:
        assert stream.read() == b"hello"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tar"
    with pytest.raises(ShardError, match=r"cannot open .*nope\.tar.*for reading") as info:
        gopen(str(path))
    assert info.value.url == str(path)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(ShardError, match="nope.tar"):
        gopen(f"file://{path}")


def test_directory_and_missing_parent(tmp_path):
    with pytest.raises(ShardError, match="for reading"):
        gopen(str(tmp_path))
    with pytest.raises(ShardError, match="for writing"):
        gopen(str(tmp_path / "no" / "such" / "dir.tar"), "wb")


def test_file_url_with_host_is_refused():
    with pytest.raises(ShardError, match="not a local file URL"):
        gopen("file://otherhost/data.tar")


def test_bad_mode(datafile):
    with pytest.raises(ValueError, match="mode must be"):
        gopen(str(datafile), "r")


def test_local_path():
    assert local_path("/data/a.tar") == "/data/a.tar"
    assert local_path("rel/a.tar") == "rel/a.tar"
    assert local_path(Path("/data/a.tar")) == "/data/a.tar"
    assert local_path("file:///data/a%20b.tar") == "/data/a b.tar"
    assert local_path("file://localhost/data/a.tar") == "/data/a.tar"
    assert local_path("file:rel/a.tar") == "rel/a.tar"
    assert local_path("file://otherhost/a.tar") is None
    assert local_path("pipe:cat a.tar") is None
    assert local_path("http://host/a.tar") is None
    assert local_path("-") is None


# standard streams

STDIO_SCRIPT = """
import sys
from wdsmp.gopen import gopen
with gopen("-") as stream:
    first = stream.read(3)
    rest = stream.readline()
assert not sys.stdin.closed
more = sys.stdin.buffer.read()
with gopen("-", "wb") as stream:
    stream.write(first[::-1] + rest + more)
assert not sys.stdout.closed
sys.stdout.write("|still open")
"""


def test_stdin_stdout():
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", STDIO_SCRIPT], input=b"abcdef\nghi",
                            capture_output=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"cbadef\nghi|still open"


# pipe: reading


def test_pipe_read(datafile):
    with gopen(f"pipe:cat {datafile}") as stream:
        assert isinstance(stream, Pipe)
        assert stream.readable() and not stream.writable()
        assert read_all_into(stream) == DATA
        pid = stream.proc.pid
    assert stream.closed and stream.status == 0
    assert_reaped(pid)


def test_pipe_read_methods(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_bytes(b"one\ntwo\nthree")
    with gopen(f"pipe:cat {path}") as stream:
        assert stream.readline() == b"one\n"
        assert stream.read(2) == b"tw"
        assert list(stream) == [b"o\n", b"three"]
    with gopen(f"pipe:cat {path}") as stream:
        assert stream.read() == b"one\ntwo\nthree"


@pytest.mark.parametrize("command, status, stderr", [
    ("false", 1, None),
    ("cat /nonexistent/shard.tar", 1, "nonexistent/shard.tar"),
    ("printf 'partial data'; echo 'upload broke' >&2; exit 3", 3, "upload broke"),
])
def test_pipe_read_failure(command, status, stderr):
    stream = gopen(f"pipe:{command}")
    with pytest.raises(PipeError, match=f"status {status}") as info:
        read_all_into(stream)
    assert info.value.status == status
    if stderr:
        assert stderr in str(info.value)
    with pytest.raises(PipeError, match=f"status {status}"):
        stream.read()  # the error is sticky: no empty shard after it
    stream.close()  # reported already; close does not raise again
    assert_reaped(stream.proc.pid)


def test_pipe_read_failure_comes_after_the_data():
    stream = gopen("pipe:printf 'abc'; exit 3")
    assert stream.read(100) == b"abc"  # the data the command wrote is delivered first
    with pytest.raises(PipeError, match="status 3"):
        stream.read(100)  # then the read that finds end of file reports the status
    stream.close()


def test_pipe_ignore_status():
    with gopen("pipe:printf 'ok'; exit 3", ignore_status=[3]) as stream:
        assert stream.read() == b"ok"
    assert stream.status == 3
    with gopen("pipe:printf 'ok'; exit 4", ignore_errors=True) as stream:
        assert stream.read() == b"ok"


def test_pipe_early_close_no_error_no_zombie():
    marker = f"wdsmp-test-{uuid.uuid4().hex}"
    stream = gopen(f"pipe:yes {marker}")
    assert stream.read(1000).startswith(marker.encode())
    pid = stream.proc.pid
    stream.close()  # no PipeError: the command died of our doing
    assert stream.status is not None
    assert_reaped(pid)
    deadline = time.monotonic() + 10
    while any(marker in " ".join(p.info["cmdline"] or []) for p in
              psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, "command survived the early close"
        time.sleep(0.05)


def test_pipe_early_close_of_silent_command():
    stream = gopen("pipe:printf x; exec sleep 60")
    assert stream.read(1) == b"x"
    start = time.monotonic()
    stream.close()
    assert time.monotonic() - start < 10
    assert_reaped(stream.proc.pid)


def test_pipe_read_after_close():
    stream = gopen("pipe:true")
    stream.close()
    stream.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        stream.read()


def test_pipe_garbage_collected_is_reaped():
    stream = gopen("pipe:yes")
    stream.read(10)
    proc = stream.proc
    del stream
    assert proc.returncode is not None
    assert_reaped(proc.pid)


# pipe: writing


def test_pipe_write(tmp_path):
    path = tmp_path / "out.bin"
    with gopen(f"pipe:cat > {path}", "wb") as stream:
        assert stream.writable() and not stream.readable()
        stream.write(DATA[:1000])
        stream.write(memoryview(DATA)[1000:])
        stream.flush()
    assert stream.status == 0
    assert path.read_bytes() == DATA
    assert_reaped(stream.proc.pid)


def test_pipe_write_failure(tmp_path):
    stream = gopen("pipe:cat > /nonexistent/dir/out.tar", "wb")
    with pytest.raises(PipeError, match="status [12]") as info:
        stream.write(b"some data")
        stream.close()
    assert "/nonexistent/dir/out.tar" in info.value.stderr
    stream.close()
    assert_reaped(stream.proc.pid)


def test_pipe_write_failure_after_much_data():
    stream = gopen("pipe:head -c 10 > /dev/null; echo 'gave up' >&2; exit 5", "wb")
    with pytest.raises(PipeError, match="status 5.*gave up"):
        for _ in range(1000):
            stream.write(DATA)
        stream.close()
    stream.close()


def test_pipe_write_command_stops_reading_with_success():
    stream = gopen("pipe:head -c 10 > /dev/null", "wb")
    with pytest.raises(ShardError, match="exited before reading all its input"):
        for _ in range(1000):
            stream.write(DATA)
        stream.close()
    stream.close()
    assert stream.status == 0


def test_pipe_write_timeout():
    stream = Pipe("exec sleep 60", mode="wb", timeout=0.5)
    with pytest.raises(PipeError, match=r"status -9.*killed"):
        stream.close()
    assert_reaped(stream.proc.pid)


def test_pipe_wrong_direction(tmp_path):
    with gopen(f"pipe:cat > {tmp_path / 'x'}", "wb") as stream:
        with pytest.raises(io.UnsupportedOperation, match="mode 'wb'"):
            stream.read()


# the scheme table


def test_register_scheme(datafile):
    opened = []

    def opener(url, mode, bufsize, **kw):
        opened.append((url, mode, kw))
        return open(url.split("://", 1)[1], mode)

    previous = register_scheme("mine", opener)
    try:
        assert previous is None
        with gopen(f"mine://{datafile}", extra=1) as stream:
            assert stream.read() == DATA
        with gopen(f"MINE://{datafile}") as stream:
            assert stream.read(3) == DATA[:3]
        assert opened[0] == (f"mine://{datafile}", "rb", {"extra": 1})
    finally:
        del gopen_schemes["mine"]


def test_register_scheme_validates():
    with pytest.raises(ValueError, match="not a URL scheme"):
        register_scheme("no spaces", open)
    with pytest.raises(ValueError, match="not a URL scheme"):
        register_scheme("", open)
    with pytest.raises(TypeError, match="not callable"):
        register_scheme("mine", "open")


def test_unknown_scheme():
    with pytest.raises(ShardError, match=r"no opener for URL scheme 'nosuch'.*file, pipe") as info:
        gopen("nosuch://host/a.tar")
    assert info.value.url == "nosuch://host/a.tar"
