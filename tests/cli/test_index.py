"""``wdsmp index``: manifests the loaders read, with counts, sizes and digests right; DALI index
files whose offsets point at each member's bytes; damaged shards refused and named."""

import gzip
import hashlib
import io
import json
import os
import tarfile

import pytest

import wdsmp as wds
from tests.conftest import tar_bytes
from wdsmp.cli import main
from wdsmp.shards.index import read_entries, shard_counts
from wdsmp.tariterators import base_plus_ext


def write_shard(path, n=3, prefix="k"):
    with wds.TarWriter(str(path)) as sink:
        for i in range(n):
            sink.write({"__key__": f"{prefix}{i:03d}", "cls": str(i).encode(), "txt": b"t" * (100 * i + 1)})
    return str(path)


def test_index_from_the_command_line(tmp_path, wdsmp_run):
    (tmp_path / "data").mkdir()
    shards = [write_shard(tmp_path / "data" / f"part-{i}.tar", n=i + 1, prefix=f"p{i}-") for i in range(3)]
    outside = write_shard(tmp_path / "elsewhere.tar")
    result = wdsmp_run("index", "-o", "data/index.json", "data/part-{0..2}.tar", outside)
    assert result.returncode == 0, result.stderr
    assert "wrote data/index.json: 4 shards, 9 samples" in result.stderr
    written = json.loads((tmp_path / "data" / "index.json").read_text())
    assert written == {"shards": [
        {"url": url, "samples": n, "size": len(open(path, "rb").read()),
         "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}
        for url, n, path in [("part-0.tar", 1, shards[0]), ("part-1.tar", 2, shards[1]),
                             ("part-2.tar", 3, shards[2]), (outside, 3, outside)]]}  # relative where below it
    # what the loaders read: absolute URLs, the reader's counts
    assert shard_counts(str(tmp_path / "data" / "index.json")) == list(zip(shards + [outside], [1, 2, 3, 3]))


def test_wdsmp_index_writes_index_json_beside_local_shards(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    urls = [write_shard(tmp_path / "data" / f"train-{i}.tar", n) for i, n in enumerate((2, 3))]
    assert main(["index", "-q", str(tmp_path / "data" / "train-*.tar")]) == 0
    assert json.loads((tmp_path / "data" / "index.json").read_text())["shards"][1]["samples"] == 3
    other = write_shard(tmp_path / "other.tar", 1)
    assert main(["index", "-q", urls[0], other]) == 2
    assert "give -o: the shards are not local files in one directory" in capsys.readouterr().err


def test_no_clobbering_without_force_and_the_json_summary(tmp_path, capsys):
    shard = write_shard(tmp_path / "a.tar")
    index = tmp_path / "index.json"
    index.write_text("old")
    assert main(["index", "-o", str(index), shard]) == 2
    assert f"{index} exists; remove it or pass --force" in capsys.readouterr().err
    assert main(["index", "-q", "--force", "--json", "-o", str(index), shard]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "format": "json", "written": [str(index)], "shards": 1, "samples": 3,
        "bytes": len(open(shard, "rb").read()), "failed": []}
    assert [entry["samples"] for entry in read_entries(str(index))] == [3]


def test_a_gzip_shard_is_counted_and_hashed_as_stored(tmp_path, capsys):
    plain = open(write_shard(tmp_path / "a.tar"), "rb").read()
    (tmp_path / "a.tgz").write_bytes(gzip.compress(plain))
    assert main(["index", "-q", "-o", str(tmp_path / "index.json"), str(tmp_path / "a.tgz")]) == 0
    [entry] = read_entries(str(tmp_path / "index.json"))
    assert (entry["samples"], entry["size"]) == (3, len((tmp_path / "a.tgz").read_bytes()))


def test_damaged_shards_are_named_and_no_index_is_written(tmp_path, capsys):
    good = write_shard(tmp_path / "good.tar")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(open(good, "rb").read()[:1024 + 512 + 10])  # inside k000.txt's data
    (tmp_path / "empty.tar").write_bytes(b"")
    status = main(["index", "-q", "-o", str(tmp_path / "index.json"), good, str(cut), str(tmp_path / "empty.tar")])
    err = capsys.readouterr().err.splitlines()
    assert status == 1 and not (tmp_path / "index.json").exists()
    assert err == [
        f"wdsmp index: {cut}, member 'k000.txt', offset 1024: truncated tar archive: member ended after 10 of 512 "
        "bytes (data and padding)",
        f"wdsmp index: {tmp_path / 'empty.tar'}, offset 0: empty file (0 bytes): not a tar archive",
        "wdsmp index: 2 shards with problems; " + str(tmp_path / "index.json") + " not written"]


def test_shards_outside_the_manifests_directory_are_listed_by_absolute_path(tmp_path, monkeypatch, capsys):
    """A relative -o and relative shard names: the manifest must name the shards for whoever reads it
    from wherever, not for the working directory it was written in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "idxt").mkdir()
    shards = [write_shard(tmp_path / "idxt" / f"pets-{i:06d}.tar") for i in range(2)]
    assert main(["index", "-q", "-o", "other/index.json", "idxt/pets-{000000..000001}.tar"]) == 0  # other/ is made
    assert main(["index", "-q", "-o", "idxt/index.json", "./idxt/pets-{000000..000001}.tar"]) == 0
    listed = {name: [entry["url"] for entry in json.loads((tmp_path / name / "index.json").read_text())["shards"]]
              for name in ("other", "idxt")}
    assert listed == {"other": [os.path.abspath(shard) for shard in shards],
                      "idxt": ["pets-000000.tar", "pets-000001.tar"]}
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for name in ("other", "idxt"):
        table = shard_counts(str(tmp_path / name / "index.json"))
        assert [os.path.samefile(url, shard) for (url, _), shard in zip(table, shards)] == [True, True]
        assert [count for _, count in table] == [3, 3]
        assert main(["verify", "-q", "--index", str(tmp_path / name / "index.json")]) == 0


def test_the_last_line_says_wrote_only_when_written(tmp_path, capsys):
    good = write_shard(tmp_path / "all.tar", n=1)
    (tmp_path / "cut.tar").write_bytes(open(good, "rb").read()[:700])
    index = str(tmp_path / "index.json")
    assert main(["index", "-o", index, good, str(tmp_path / "cut.tar")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"wdsmp index: 1 shard with problems; {index} not written"
    assert "index: wrote" not in err
    assert main(["index", "-o", index, good]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"wdsmp index: wrote {index}: 1 shard, 1 sample"
    assert main(["index", "--format", "dali", "-o", str(tmp_path / "idx"), str(tmp_path / "cut.tar")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "wdsmp index: 1 shard with problems; they got no index file"
    assert "index: wrote" not in err


@pytest.mark.parametrize("fmt", ["json", "dali"])
def test_a_shard_given_twice_is_refused(tmp_path, monkeypatch, capsys, fmt):
    monkeypatch.chdir(tmp_path)
    write_shard(tmp_path / "all.tar")
    write_shard(tmp_path / "other.tar")
    os.symlink("all.tar", tmp_path / "link.tar")
    output = "dup.json" if fmt == "json" else "idx"
    assert main(["index", "-q", "--format", fmt, "-o", output, "all.tar", "other.tar", "all.tar", "./all.tar",
                 "link.tar", str(tmp_path / "other.tar")]) == 2
    assert capsys.readouterr().err == (
        "wdsmp index: the same shard given more than once (all.tar and all.tar and ./all.tar and link.tar; "
        f"other.tar and {tmp_path / 'other.tar'}): an index lists each shard once, or the loaders would count "
        "its samples again\n")
    assert not (tmp_path / output).exists()


# DALI


def read_dali(path):
    """The lines of a DALI index file: the header's (version, count) and per sample the
    components as (ext, offset, size, name)."""
    lines = open(path).read().splitlines()
    version, count = lines[0].split(" ")
    samples = []
    for line in lines[1:]:
        words = line.split(" ")
        samples.append([(words[i], int(words[i + 1]), int(words[i + 2]), words[i + 3])
                        for i in range(0, len(words), 4)])
    return version, int(count), samples


def tricky_tar(fmt):
    """Members whose data does not start one block after their header: a GNU long name or a pax
    header in front, a directory between, sizes around a block's."""
    def extra(tar):
        info = tarfile.TarInfo("dir")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, data in [("s2.bin", b"\1" * 512), ("s2.cls", b"2")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    long_key = "d/" + "x" * 120
    return tar_bytes([("s0.cls", b"0"), ("s0.bin", b"\0" * 511), (f"{long_key}.cls", b"1"),
                      (f"{long_key}.txt", "ünïcode".encode() * 100)], format=fmt, extra=extra)


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_dali_offsets_point_at_each_members_bytes(tmp_path, capsys, impl, fmt):
    data = tricky_tar(fmt)
    (tmp_path / "tricky.tar").write_bytes(data)
    shard = write_shard(tmp_path / "plain.tar")
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "idx"), str(tmp_path / "tricky.tar"),
                 shard]) == 0
    for path in (tmp_path / "tricky.tar", tmp_path / "plain.tar"):
        blob = path.read_bytes()
        version, count, samples = read_dali(tmp_path / "idx" / path.name.replace(".tar", ".idx"))
        assert (version, count) == ("v1.2", len(samples))
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            files = {info.name: info for info in tar.getmembers() if info.isfile()}
            components = [component for sample in samples for component in sample]
            assert [name for *_, name in components] == list(files)
            for ext, offset, size, name in components:
                assert (offset, size) == (files[name].offset_data, files[name].size)
                assert blob[offset:offset + size] == tar.extractfile(files[name]).read()
        for sample in samples:  # one key per line, each component named key.ext
            key = base_plus_ext(sample[0][3])[0]
            assert [name for *_, name in sample] == [f"{key}.{ext}" for ext, *_ in sample]
    assert [[c[3] for c in s] for s in read_dali(tmp_path / "idx" / "tricky.idx")[2]] == [
        ["s0.cls", "s0.bin"], [f"d/{'x' * 120}.cls", f"d/{'x' * 120}.txt"], ["s2.bin", "s2.cls"]]


def test_dali_names_and_patterns(tmp_path, capsys):
    shards = [write_shard(tmp_path / f"train-{i:04d}.tar") for i in range(2)]
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "i" / "{name}.wds.idx"), *shards]) == 0
    assert sorted(p.name for p in (tmp_path / "i").iterdir()) == ["train-0000.wds.idx", "train-0001.wds.idx"]
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "i" / "{name}.wds.idx"), *shards]) == 2
    assert "exists; remove it or pass --force" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    twin = write_shard(tmp_path / "other" / "train-0000.tar")
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "j"), shards[0], twin]) == 2
    assert "would both write" in capsys.readouterr().err


def test_what_dali_cannot_read_is_refused_and_the_rest_written(tmp_path, capsys):
    good = write_shard(tmp_path / "good.tar")
    (tmp_path / "zipped.tar.gz").write_bytes(gzip.compress(open(good, "rb").read()))
    (tmp_path / "nothing.tar").write_bytes(tar_bytes([]))
    (tmp_path / "spaced.tar").write_bytes(tar_bytes([("a b.cls", b"1")]))
    shards = [good] + [str(tmp_path / name) for name in ("zipped.tar.gz", "nothing.tar", "spaced.tar")]
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "idx"), *shards]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"wdsmp index: {shards[1]}: gzip-compressed: DALI's reader needs an uncompressed tar",
        f"wdsmp index: {shards[2]}: no samples: DALI refuses an index of none",
        f"wdsmp index: {shards[3]}, member 'a b.cls', offset 0: whitespace in the member name, which DALI's "
        "index format cannot hold",
        "wdsmp index: 3 shards with problems; they got no index file"]
    assert [p.name for p in (tmp_path / "idx").iterdir()] == ["good.idx"]
