"""Data and conftest for running webdataset's own test suite against wdsmp.

webdataset's source distribution ships its tests without the files they read
(``testdata/``) or the ``conftest.py`` they import names from. This writes
equivalents of what those tests assert about them (sample counts, fields,
the first image's shape) into the unpacked distribution: local shards under
``testdata/``, "remote" shards under ``remote/`` (served on 127.0.0.1 by
``webdataset_suite.sh``) and ``tests/conftest.py``. Only wdsmp's tenbin and
the standard library write the shards, so the same data also serves a
reference run against webdataset itself.

Not a test module (pytest does not collect it); ``webdataset_suite.sh`` runs
it as ``python tests/webdataset_suite_data.py ROOT``.
"""

import gzip
import io
import json
import os
import sys
import tarfile

import numpy as np
from PIL import Image

FIRST_IMAGE = (793, 600)  # (rows, columns) of the first sample's png, as the tests assert
SAMPLES_PER_SHARD = 47
REMOTE_SHARDS = 4  # at least as many as the DataLoader workers of the remote tests

CONFTEST = '''\
"""Names webdataset's tests import from ``tests.conftest`` (written by webdataset_suite_data.py)."""

import os

import pytest

local_data = "testdata/imagenet-000000.tgz"
compressed = "testdata/compressed.tar"
remote_loc = os.environ["WDSMP_SUITE_REMOTE"]
remote_shard = "imagenet-000000.tgz"
remote_shards = "imagenet-{000000..LAST}.tgz"
remote_sample = remote_loc + "sample.tgz"


OPTIONAL = {"torchvision", "lmdb"}  # used by some tests, not needed by either library


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Skip, rather than fail, a test whose optional module is not installed here."""
    outcome = yield
    error = outcome.excinfo[1] if outcome.excinfo else None
    while error is not None and not isinstance(error, ModuleNotFoundError):
        error = error.__cause__  # a library may say why it needs the module, from the import error
    if error is not None and error.name in OPTIONAL:
        outcome.force_exception(pytest.skip.Exception(f"needs {error.name}, not installed"))


def count_samples_tuple(source, *predicates, n=10000):
    """How many of the first ``n`` items of ``source`` are samples meeting every predicate."""
    count = 0
    for index, sample in enumerate(source):
        if index >= n:
            break
        assert isinstance(sample, (tuple, dict, list)), (type(sample), sample)
        assert all(predicate(sample) for predicate in predicates)
        count += 1
    return count
'''


def png(rows, columns, shade):
    """An RGB test picture as PNG bytes: a gradient with noise, so that shards are
    large enough for the tests that cut them after 10 kB to cut samples off."""
    y, x = np.mgrid[0:rows, 0:columns]
    noise = np.random.default_rng(shade).integers(0, 32, size=(rows, columns))
    pixels = np.stack([(x * 223) // max(columns - 1, 1) + noise, (y * 223) // max(rows - 1, 1) + noise,
                       np.full_like(x, shade)], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def write_shard(path, samples, compress=False):
    """A tar (gzip-compressed if ``compress``) of ``[(key, {ext: bytes})]``, members in order."""
    with open(path, "wb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if compress else raw
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
            for key, fields in samples:
                for ext, data in fields.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime, info.mode = len(data), 0, 0o444
                    tar.addfile(info, io.BytesIO(data))
        if compress:
            stream.close()


def imagenet_like(shard, with_json=False):
    """47 samples with ``cls``, ``png``, ``wnid`` and ``xml`` (or ``json``) fields."""
    samples = []
    for i in range(SAMPLES_PER_SHARD):
        rows, columns = FIRST_IMAGE if i == 0 and shard == 0 else (48 + i, 64 + i)
        label = (shard * SAMPLES_PER_SHARD + i) % 1000
        fields = {"cls": str(label).encode(), "png": png(rows, columns, (17 * i) % 256)}
        if with_json:
            fields["json"] = json.dumps([label, f"n{label:08d}"]).encode()
        else:
            fields["wnid"] = f"n{label:08d}".encode()
            fields["xml"] = f"<annotation><label>{label}</label></annotation>".encode()
        samples.append((f"n{label:08d}_{shard:02d}{i:03d}", fields))
    return samples


def write_all(root):
    from wdsmp import tenbin

    testdata, remote = os.path.join(root, "testdata"), os.path.join(root, "remote")
    os.makedirs(testdata, exist_ok=True)
    os.makedirs(remote, exist_ok=True)
    write_shard(os.path.join(testdata, "imagenet-000000.tgz"), imagenet_like(0), compress=True)
    write_shard(os.path.join(testdata, "compressed.tar"),
                [("hello", {"txt.gz": gzip.compress(b"hello\n", mtime=0)})])
    rng = np.random.default_rng(0)
    write_shard(os.path.join(testdata, "tendata.tar"),
                [(f"{i:06d}", {"ten": tenbin.encode_buffer([rng.normal(size=(28, 28)),
                                                            rng.normal(size=(28, 28))])})
                 for i in range(100)])
    for shard in range(REMOTE_SHARDS):
        write_shard(os.path.join(remote, f"imagenet-{shard:06d}.tgz"),
                    imagenet_like(shard, with_json=True), compress=True)
    write_shard(os.path.join(remote, "sample.tgz"),
                [(str(10 + i), {"cls": b"0", "png": png(32, 32, i)}) for i in range(5)], compress=True)
    with open(os.path.join(root, "tests", "conftest.py"), "w") as f:
        f.write(CONFTEST.replace("LAST", f"{REMOTE_SHARDS - 1:06d}"))
    open(os.path.join(root, "tests", "__init__.py"), "w").close()


if __name__ == "__main__":
    write_all(sys.argv[1])
