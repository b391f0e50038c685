"""``wdsmp ls`` and ``wdsmp info``: members, counts and sizes; damaged shards named, status 1."""

import io
import json
import shlex
import subprocess
import tarfile

import pytest

import wdsmp as wds
from wdsmp.shards.index import write_index
from wdsmp.cli import main
from wdsmp.cli.listing import human

from .conftest import _command


def write_shard(path, samples, extra=()):
    """A shard of ``{key: {ext: bytes}}`` by wdsmp's writer, then ``extra`` (name, bytes) members."""
    with wds.TarWriter(str(path), encoder=False) as writer:
        for key, fields in samples.items():
            writer.write({"__key__": key, **fields})
    if extra:
        with tarfile.open(path, "a") as archive:
            for name, data in extra:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


def damaged(path, how):
    """Damage a shard: cut it inside its second member, or break its second header's checksum."""
    data = path.read_bytes()
    with tarfile.open(path) as archive:
        second = archive.getmembers()[1].offset
    if how == "truncated":
        path.write_bytes(data[:second + 600])
    else:
        path.write_bytes(data[:second + 10] + b"\xff" + data[second + 11:])
    return path


SAMPLES = {"a": {"jpg": b"j" * 700, "cls": b"1"}, "b": {"jpg": b"j" * 300, "cls": b"2", "Seg.PNG": b"png"}}


def test_ls_end_to_end(tmp_path, wdsmp_run):
    good = write_shard(tmp_path / "good.tar", SAMPLES)
    damaged(write_shard(tmp_path / "bad.tar", SAMPLES), "checksum")
    result = wdsmp_run("ls", "good.tar", "bad.tar")
    assert result.returncode == 1
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    listed = subprocess.run(["tar", "tf", good], capture_output=True, text=True, check=True).stdout.split()
    assert [name for shard, name, _ in lines if shard == "good.tar"] == listed
    assert lines[:2] == [["good.tar", "a.cls", "1"], ["good.tar", "a.jpg", "700"]]
    assert lines[5:] == [["bad.tar", "a.cls", "1"]]  # what could be read before the damage
    assert "wdsmp ls: error: bad tar header checksum: corrupt archive (shard 'bad.tar', offset 1024)" in result.stderr


def test_ls_into_a_closed_pipe_stops_quietly(tmp_path):
    """``wdsmp ls | head -1``: the rest of the listing goes nowhere, and nothing is said about it."""
    write_shard(tmp_path / "many.tar", {f"k{i:05d}": {"txt": b"x"} for i in range(3000)})
    command = " ".join(map(shlex.quote, _command())) + " ls many.tar | head -1"
    result = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.stdout == "many.tar\tk00000.txt\t1\n" and result.stderr == ""


def test_info_end_to_end(tmp_path, wdsmp_run):
    write_shard(tmp_path / "good.tar", SAMPLES)
    damaged(write_shard(tmp_path / "cut.tar", SAMPLES), "truncated")
    result = wdsmp_run("info", "-q", "good.tar", "cut.tar")
    assert result.returncode == 1
    assert "wdsmp info: error: truncated tar archive: member ended after" in result.stderr
    assert "(shard 'cut.tar', member 'a.jpg', offset 1024)" in result.stderr
    assert result.stdout.splitlines()[:4] == ["shards    2 (1 damaged)", "samples   2", "members   6",
                                              "data      1.0 kB total, 502 B mean per sample"]
    assert result.stdout.splitlines()[-2:] == ["good.tar        2  1.0 kB",
                                               "cut.tar         0     0 B  DAMAGED"]


def test_ls_json_lists_every_member(tmp_path, capsys):
    shard = write_shard(tmp_path / "s.tar", SAMPLES, extra=[("__meta__.json", b"{}"), ("README", b"hi")])
    assert main(["ls", "--json", str(shard)]) == 0
    listing = json.loads(capsys.readouterr().out)
    with tarfile.open(shard) as archive:
        expected = [dict(shard=str(shard), member=m.name, size=m.size, offset=m.offset) for m in archive]
    assert listing == expected
    assert [entry["member"] for entry in listing][-2:] == ["__meta__.json", "README"]


def test_info_json(tmp_path, capsys):
    one = write_shard(tmp_path / "1.tar", SAMPLES, extra=[("README", b"hi")])
    two = write_shard(tmp_path / "2.tar", {"c": {"jpg": b"j" * 2000}})
    assert main(["info", "-q", "--json", str(one), str(two)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["samples"], info["bytes"], info["mean_sample_bytes"]) == (3, 3005, 3005 / 3)
    assert (info["members"], info["outside"], info["damaged"]) == (7, 1, 0)
    assert info["extensions"] == {
        "Seg.PNG": dict(samples=1, bytes=3, mean_bytes=3.0),
        "cls": dict(samples=2, bytes=2, mean_bytes=1.0),
        "jpg": dict(samples=3, bytes=3000, mean_bytes=1000.0),
    }
    assert info["shards"] == [dict(url=str(one), samples=2, bytes=1005, members=6, outside=1, links=0),
                              dict(url=str(two), samples=1, bytes=2000, members=1, outside=0, links=0)]
    assert info["links"] == 0


def test_info_text(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_shard(tmp_path / "s.tar", SAMPLES, extra=[("README", b"hi")])
    assert main(["info", "-q", "s.tar"]) == 0
    assert capsys.readouterr().out == (
        "shards    1\n"
        "samples   2\n"
        "members   6 (1 outside any sample)\n"
        "data      1.0 kB total, 502 B mean per sample\n"
        "\n"
        "extension  samples   bytes   mean\n"
        "Seg.PNG          1     3 B    3 B\n"
        "cls              2     2 B    1 B\n"
        "jpg              2  1.0 kB  500 B\n"
        "\n"
        "shard  samples   bytes\n"
        "s.tar        2  1.0 kB\n")


@pytest.mark.parametrize("command", ["ls", "info"])
def test_missing_and_unreadable_inputs(tmp_path, capsys, command):
    assert main([command, str(tmp_path / "missing.tar")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty.tar").write_bytes(b"")
    assert main([command, "-q", str(tmp_path / "empty.tar")]) == 1
    assert "empty file (0 bytes): not a tar archive" in capsys.readouterr().err


def test_human():
    assert [human(n) for n in (0, 999, 1000, 1_234_567, 5e12, 7e15)] == [
        "0 B", "999 B", "1.0 kB", "1.2 MB", "5.0 TB", "7000.0 TB"]


def test_ls_and_info_read_the_shards_of_an_index(tmp_path, capsys):
    for name in ("a", "b"):
        write_shard(tmp_path / f"{name}.tar", SAMPLES)
    write_index(str(tmp_path / "index.json"), [("a.tar", 2), ("b.tar", 2)])
    assert main(["ls", str(tmp_path / "index.json")]) == 0
    shards = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert shards == [str(tmp_path / "a.tar")] * 5 + [str(tmp_path / "b.tar")] * 5  # relative to the index
    assert main(["info", "-q", "--json", str(tmp_path / "index.json")]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 4
    assert main(["info", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the shard index" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["ls", "info"])
def test_an_unknown_url_scheme_is_a_usage_error_not_a_damaged_shard(command, capsys):
    assert main([command, "nosuch://host/a.tar"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"wdsmp {command}: nosuch://host/a.tar: no opener for its URL scheme")
