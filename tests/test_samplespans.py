"""Samples read alone by their byte spans (``wdsmp/epochs/spans.py``) are the samples a shard read front to
back gives, in every tar dialect the reader knows; shards that cannot be read so say why."""

import gzip
import os
import tarfile
from pathlib import Path

import pytest

from wdsmp.errors import SampleError, ShardError, TarFormatError
from wdsmp.epochs.spans import SpanReader, locate_samples, read_positions
from wdsmp.epochs.counts import walk_local_shard
from wdsmp.tariterators import tarfile_samples

from .conftest import tar_bytes, write_tar

LONG = "d/" + "x" * 120  # longer than a ustar name: a GNU long-name or pax header before the member


def _members(n):
    members = [("__meta__.json", b"{}"), ("README", b"no dot: not part of any sample")]
    for i in range(n):
        members += [(f"{LONG}{i:03d}.jpg", bytes([i]) * (300 + 700 * i)), (f"{LONG}{i:03d}.cls", str(i).encode())]
        if i == 1:
            members.append(("__inside__/x.txt", b"meta between samples"))
    return members


@pytest.mark.parametrize("format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_each_span_reads_the_sample_the_shard_gives(tmp_path, impl, format):
    path = str(tmp_path / "a.tar")
    write_tar(Path(path), _members(5), format=format)
    files, why = locate_samples([path], str(tmp_path / "counts"))
    expected = list(tarfile_samples([path]))  # __meta__.json is a sample ("__meta__/..." would be meta)
    assert why is None and files.counts == (len(expected),) == (6,)
    reader = SpanReader(files.paths, files.spans)
    assert [reader.sample(0, i, path) for i in range(6)] == expected
    assert list(read_positions(reader, [(0, i, path) for i in (4, 0, 2)])) == [expected[i] for i in (4, 0, 2)]
    reader.close()


def test_refused_samples_have_no_span(tmp_path):
    path = str(tmp_path / "a.tar")
    write_tar(Path(path), [("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3"), ("c.jpg", b"4"), ("c.jpg", b"5"),
                     ("d.jpg", b"6")])  # a comes back after its sample ended, c has a field twice
    walk = walk_local_shard(path)
    kept = [sample["__key__"] for sample in tarfile_samples([path], handler=lambda exn: True)]
    assert walk.count == len(kept) == 3  # the first a was whole when it ended
    reader = SpanReader([path], [walk.spans])
    assert [reader.sample(0, i, path)["__key__"] for i in range(3)] == kept == ["a", "b", "d"]
    reader.close()


def test_link_members_and_gzip_cannot_be_read_alone(tmp_path):
    def link(tar):
        info = tarfile.TarInfo("b.jpg")
        info.type, info.linkname = tarfile.LNKTYPE, "a.jpg"
        tar.addfile(info)

    linked = str(tmp_path / "linked.tar")
    with open(linked, "wb") as stream:
        stream.write(tar_bytes([("a.jpg", b"x")], extra=link))
    packed = str(tmp_path / "packed.tar.gz")
    with open(packed, "wb") as stream:
        stream.write(gzip.compress(tar_bytes([("a.jpg", b"x")])))
    assert locate_samples([linked])[1] == f"{linked}: it has link members ('b.jpg')"
    assert locate_samples([packed])[1] == f"{packed}: it is gzip-compressed"
    assert walk_local_shard(packed).count == 1
    assert "is remote" in locate_samples(["http://127.0.0.1:9/x.tar"])[1]


def test_a_shard_changed_since_its_walk_is_named(tmp_path):
    path = str(tmp_path / "a.tar")
    write_tar(Path(path), _members(3))
    walk = walk_local_shard(path)
    data = bytearray(open(path, "rb").read())
    start, end = (int(x) for x in walk.spans[2])
    with open(path, "wb") as stream:  # cut inside sample 2
        stream.write(data[: start + 600])
    reader = SpanReader([path], [walk.spans])
    with pytest.raises(TarFormatError, match=r"shorter than when its samples were located(.|\n)*a.tar"):
        reader.sample(0, 2, path)
    data[start:end] = tar_bytes([("p.jpg", b"1"), ("q.jpg", b"2")])[: end - start].ljust(end - start, b"\0")
    with open(path, "wb") as stream:  # two other samples where sample 2 was
        stream.write(bytes(data))
    with pytest.raises(SampleError, match="changed since it was walked"):
        reader.sample(0, 2, path)
    data[start + 148:start + 156] = b"0000000\0"  # a bad header checksum: the offset is the shard's
    with open(path, "wb") as stream:
        stream.write(bytes(data))
    with pytest.raises(TarFormatError, match=f"offset {start}"):
        reader.sample(0, 2, path)
    reader.close()
    errors = []
    reader = SpanReader([path], [walk.spans])
    assert list(read_positions(reader, [(0, 2, path), (0, 0, path)],
                               lambda exn: errors.append(exn) or True))[0]["__key__"] == "__meta__"
    assert len(errors) == 1
    reader.close()


def test_a_file_that_is_not_the_version_walked_is_refused(tmp_path):
    path = str(tmp_path / "a.tar")
    write_tar(Path(path), _members(3))
    files, _ = locate_samples([path], str(tmp_path / "counts"))
    reader = SpanReader(files.paths, files.spans, files=files.files)
    assert reader.sample(0, 1, path)["__key__"].endswith("000")
    reader.close()
    write_tar(Path(path), _members(3)[::-1])  # the same size, other bytes: rewritten in place
    reader = SpanReader(files.paths, files.spans, files=files.files)
    with pytest.raises(ShardError, match="changed since its samples were located"):
        reader.sample(0, 1, path)
    reader.close()


def test_spans_are_kept_with_the_counts(tmp_path):
    path = str(tmp_path / "a.tar")
    write_tar(Path(path), _members(4))
    cache = str(tmp_path / "counts")
    first, _ = locate_samples([path], cache)
    os.chmod(path, 0)  # not walked again: the spans come from the cache
    try:
        again, _ = locate_samples([path], cache)
    finally:
        os.chmod(path, 0o644)
    assert (again.spans[0] == first.spans[0]).all() and again.counts == first.counts
