"""Fixtures shared by the suite: both implementations of the native core, tar builders."""

import io
import tarfile

import pytest

import wdsmp.native
from tests.servers import _file_server, _moto_server, http_server, s3_server  # noqa: F401


@pytest.fixture(params=["native", "python"])
def impl(request, monkeypatch):
    """Run a test once with the native core and once with its pure-Python twin."""
    if request.param == "python":
        monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    else:
        monkeypatch.delenv("WDSMP_PUREPYTHON", raising=False)
        if not wdsmp.native.native_available():
            pytest.skip("native core not built")
    return request.param


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
