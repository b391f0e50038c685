"""``wdsmp verify``: every kind of damage the reader knows is reported with shard, member and
offset, checking goes on past it, images are decoded strictly, shards are held against a manifest."""

import hashlib
import io
import json
import re
import tarfile

import numpy as np
import PIL.Image
import pytest

import wdsmp as wds
from tests.conftest import tar_bytes
from wdsmp.cli import main
from wdsmp.shards.index import read_entries


def image(seed=0, fmt="JPEG"):
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    PIL.Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def write_shard(path, n=4, prefix="k", fields=None):
    """A shard of ``n`` samples (``cls``, ``jpg``) written by wdsmp's TarWriter; ``fields``
    replaces the fields of sample ``i`` with ``fields(i)`` where it returns a dict."""
    with wds.TarWriter(str(path)) as sink:
        for i in range(n):
            sample = (fields and fields(i)) or {"cls": str(i).encode(), "jpg": image(i)}
            sink.write({"__key__": f"{prefix}{i:03d}", **sample})
    return str(path)


def offsets(path):
    """Member name -> offset of its header, by Python's tarfile (an independent reading)."""
    with tarfile.open(path) as tar:
        return {info.name: info.offset for info in tar.getmembers()}


def verify(capsys, *args):
    """``wdsmp verify -q ARGS`` in this process: (status, stdout)."""
    status = main(["verify", "-q", *map(str, args)])
    return status, capsys.readouterr().out


def damaged(tmp_path, kind):
    """A damaged shard of kind ``kind``: (path, member, offset, message pattern)."""
    path = tmp_path / f"{kind}.tar"
    good = write_shard(tmp_path / "template.tar")
    data, at = open(good, "rb").read(), offsets(good)
    if kind == "truncated-mid-member":
        path.write_bytes(data[:at["k002.jpg"] + 512 + 100])
        return path, "k002.jpg", at["k002.jpg"], r"truncated tar archive: member ended after 100 of \d+ bytes"
    if kind == "truncated-at-boundary":
        path.write_bytes(data[:at["k002.cls"]])
        return path, None, at["k002.cls"], "stream ended at a member boundary without the end-of-archive marker"
    if kind == "truncated-in-header":
        path.write_bytes(data[:at["k002.cls"] + 100])
        return path, None, at["k002.cls"], r"stream ended inside a header block \(100 of 512 bytes\)"
    if kind == "bad-checksum":
        flipped = bytearray(data)
        flipped[at["k001.jpg"] + 3] ^= 0x20
        path.write_bytes(bytes(flipped))
        return path, None, at["k001.jpg"], "bad tar header checksum"
    if kind == "not-a-tar":
        path.write_bytes(b"<!DOCTYPE html><html><body>403 Forbidden</body></html>\n" * 20)
        return path, None, 0, r"not a tar archive \(starts with b'<!DOCTYPE"
    if kind == "zero-bytes":
        path.write_bytes(b"")
        return path, None, 0, r"empty file \(0 bytes\)"
    if kind == "split-apart":
        path.write_bytes(tar_bytes([("a.cls", b"1"), ("b.cls", b"2"), ("a.jpg", image())]))
        return path, "a.jpg", 2048, "key 'a' reappears after its sample ended"
    assert kind == "duplicated"
    path.write_bytes(tar_bytes([("a.cls", b"1"), ("a.jpg", image()), ("a.cls", b"2")]))
    return path, "a.cls", offsets(path)["a.cls"], "duplicate field 'cls' in sample 'a'"  # the second a.cls


DAMAGE = ["truncated-mid-member", "truncated-at-boundary", "truncated-in-header", "bad-checksum", "not-a-tar",
          "zero-bytes", "split-apart", "duplicated"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_kind_of_damage_is_named_and_checking_goes_on(tmp_path, capsys, kind):
    path, member, offset, message = damaged(tmp_path, kind)
    first, last = write_shard(tmp_path / "first.tar", prefix="f"), write_shard(tmp_path / "last.tar", prefix="l")
    status, out = verify(capsys, "--json", first, path, last)
    assert status == 1
    summary = json.loads(out)
    assert summary["shards"] == 3 and summary["bad_shards"] == 1
    assert summary["samples"] >= 8  # the shards around the damaged one were read whole
    [problem] = summary["problems"]
    assert (problem["shard"], problem["member"], problem["offset"]) == (str(path), member, offset)
    assert problem["kind"] == ("sample" if kind in ("split-apart", "duplicated") else "tar")
    assert re.search(message, problem["message"])
    status, out = verify(capsys, first, path, last)
    where = f"{path}" + (f", member '{member}'" if member else "") + f", offset {offset}: "
    assert status == 1 and out.splitlines()[0].startswith(where)
    assert out.splitlines()[-1].endswith("1 problem in 1 shard")


def test_every_sample_problem_of_a_shard_is_reported(tmp_path, capsys):
    path = tmp_path / "mixed.tar"
    path.write_bytes(tar_bytes([("a.cls", b"1"), ("a.cls", b"1"), ("b.cls", b"2"), ("a.txt", b"x"),
                                ("c.cls", b"3"), ("c.txt", b"y")]))
    status, out = verify(capsys, "--json", path)
    summary = json.loads(out)
    assert status == 1 and summary["samples"] == 2  # b and c; both a's are dropped
    assert [(p["member"], p["offset"]) for p in summary["problems"]] == [("a.cls", 1024), ("a.txt", 3072)]


def test_good_shards_pass(tmp_path, capsys):
    shards = [write_shard(tmp_path / f"s{i}.tar", prefix=f"s{i}-") for i in range(2)]
    status, out = verify(capsys, "--decode", *shards)
    assert (status, out) == (0, f"verified 2 shards, 8 samples, {2 * len(open(shards[0], 'rb').read()):,} bytes: "
                                "no problems\n")


def flip_entropy_data(data):
    """Bytes flipped in the middle of the entropy-coded data: Pillow decodes it into wrong pixels
    without a word; libjpeg-turbo notices."""
    at = (data.index(b"\xff\xda") + len(data)) // 2
    return data[:at] + bytes(b ^ 0x5A for b in data[at:at + 8]) + data[at + 8:]


BAD_IMAGES = {
    "truncated-jpeg": (lambda: image(7)[:900], "jpg", "image file is truncated"),
    "zeroed-jpeg": (lambda: bytes(len(image(7))), "jpg",
                    r"cannot decode the image: not an image format Pillow knows \(it starts b'\\x00\\x00"),
    "garbage-jpeg": (lambda: b"definitely not a JPEG" * 40, "jpg", "cannot decode the image"),
    "corrupt-jpeg-entropy-data": (lambda: flip_entropy_data(image(7)), "jpg",
                                  r"damaged JPEG data \(libjpeg-turbo: Corrupt JPEG data"),
    "truncated-png": (lambda: image(7, "PNG")[:500], "png", "cannot decode the image"),
}


@pytest.mark.parametrize("kind", BAD_IMAGES)
def test_decode_catches_bad_images(tmp_path, capsys, kind):
    make, ext, message = BAD_IMAGES[kind]
    path = write_shard(tmp_path / "images.tar", fields=lambda i: {"cls": b"2", ext: make()} if i == 2 else
                       {"cls": b"1", "jpg": image(i), "png": image(i, "PNG")})
    status, out = verify(capsys, path)
    assert (status, out.splitlines()[-1]) == (0, f"verified 1 shard, 4 samples, {len(open(path, 'rb').read()):,} "
                                                 "bytes: no problems")  # structure alone is fine
    status, out = verify(capsys, "--json", "--decode", path)
    [problem] = json.loads(out)["problems"]
    assert status == 1
    assert (problem["kind"], problem["member"], problem["offset"]) == ("decode", f"k002.{ext}",
                                                                      offsets(path)[f"k002.{ext}"])
    assert re.search(message, problem["message"])


@pytest.fixture
def indexed(tmp_path):
    """Three shards and their manifest, made by ``wdsmp index``."""
    shards = [write_shard(tmp_path / f"part-{i}.tar", prefix=f"p{i}-") for i in range(3)]
    assert main(["index", "-q", "-o", str(tmp_path / "index.json"), *shards]) == 0
    return shards, str(tmp_path / "index.json")


def test_verify_against_the_index(tmp_path, capsys, indexed):
    shards, index = indexed
    assert verify(capsys, "--index", index)[0] == 0  # no shards named: those the index lists
    data = bytearray(open(shards[0], "rb").read())
    data[offsets(shards[0])["p0-001.cls"] + 512] ^= 1  # one byte of member data: same size, same count
    open(shards[0], "wb").write(bytes(data))
    write_shard(shards[1], n=3, prefix="p1-")  # one sample fewer
    extra = write_shard(tmp_path / "extra.tar")
    status, out = verify(capsys, "--json", "--index", index, *shards, extra)
    problems = [(p["shard"], p["kind"], p["message"]) for p in json.loads(out)["problems"]]
    sha256 = hashlib.sha256(open(shards[1], "rb").read()).hexdigest()
    assert status == 1
    assert problems[0][:2] == (shards[0], "index") and problems[0][2].startswith("sha256 ")
    assert problems[1:4] == [(shards[1], "index", "3 samples, the index says 4"),
                             (shards[1], "index", f"{len(open(shards[1], 'rb').read())} bytes, the index says "
                                                  f"{len(open(shards[2], 'rb').read())}"),
                             (shards[1], "index", f"sha256 {sha256}, the index says "
                                                  f"{read_entries(index)[1]['sha256']}")]
    assert problems[4:] == [(extra, "index", f"not listed in the index {index}")]


def test_a_shard_missing_from_disk_is_reported_and_the_rest_checked(tmp_path, capsys, indexed):
    shards, index = indexed
    (tmp_path / "part-1.tar").unlink()
    status, out = verify(capsys, "--index", index)
    lines = out.splitlines()
    assert status == 1 and len(lines) == 2
    assert lines[0].startswith(f"{shards[1]}: cannot open") and "No such file" in lines[0]
    assert lines[1].startswith("verified 3 shards, 8 samples")


def test_usage_errors(tmp_path, capsys):
    assert main(["verify"]) == 2
    assert "give the shards to check, or --index" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "nothing-*.tar")]) == 2
    assert f"shard pattern '{tmp_path / 'nothing-*.tar'}' matches no files" in capsys.readouterr().err


def test_missing_local_shards_are_reported_and_the_others_checked(tmp_path, monkeypatch, capsys):
    """As a missing remote shard is: a "read" problem of that shard; a shard named twice is read once."""
    monkeypatch.chdir(tmp_path)
    for i in (0, 1, 3):
        write_shard(tmp_path / f"x-{i:03d}.tar", prefix=f"x{i}-")
    status, out = verify(capsys, "--json", "x-{000..003}.tar", "./x-001.tar", "gone.tar", str(tmp_path / "x-000.tar"))
    summary = json.loads(out)
    assert status == 1
    assert (summary["shards"], summary["samples"], summary["bad_shards"]) == (5, 12, 2)
    assert [(p["shard"], p["kind"]) for p in summary["problems"]] == [("x-002.tar", "read"), ("gone.tar", "read")]
    assert all("No such file" in p["message"] for p in summary["problems"])
    status, out = verify(capsys, "gone.tar")
    assert (status, out.splitlines()[-1]) == (1, "verified 1 shard, 0 samples, 0 bytes: 1 problem in 1 shard")


def test_verify_from_the_command_line(tmp_path, wdsmp_run):
    good = write_shard(tmp_path / "good.tar", prefix="g")
    cut, member, offset, _ = damaged(tmp_path, "truncated-mid-member")
    dup, dmember, doffset, _ = damaged(tmp_path, "duplicated")
    jpeg = write_shard(tmp_path / "jpeg.tar", prefix="j", fields=lambda i: {"jpg": image(9)[:700]} if i == 1 else None)
    result = wdsmp_run("verify", "--decode", good, cut.name, dup.name, jpeg)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [
        f"{cut.name}, member '{member}', offset {offset}: truncated tar archive: member ended after 100 of "
        f"{-(-len(image(2)) // 512) * 512} bytes (data and padding)",
        f"{dup.name}, member '{dmember}', offset {doffset}: duplicate field 'cls' in sample 'a'"]
    assert lines[2].startswith(f"{jpeg}, member 'j001.jpg', offset {offsets(jpeg)['j001.jpg']}: cannot decode "
                               "the image: OSError: image file is truncated")
    nbytes = sum(len(open(tmp_path / p, "rb").read()) for p in (good, cut, dup, jpeg))
    assert lines[3:] == [f"verified 4 shards, 10 samples, {nbytes:,} bytes: 3 problems in 3 shards"]
    assert "wdsmp verify: 4/4 shards" in result.stderr  # the progress line


def test_remote_shards_against_a_remote_index(tmp_path, capsys, http_server, indexed):
    shards, index = indexed
    for path in shards + [index]:
        http_server.put_file(f"/d/{path.rpartition('/')[2]}", open(path, "rb").read())
    whole = open(shards[2], "rb").read()
    cut = whole[:offsets(shards[2])["p2-003.cls"]]  # the last sample and the end marker lost
    http_server.put_file("/d/part-2.tar", cut)
    status, out = verify(capsys, "--index", http_server.url("/d/index.json"))
    url = http_server.url("/d/part-2.tar")
    # No count compared: the shard was not read to its end. The loaders' count is 10 (not 11): the
    # sample before damage that names no member is dropped, as it may be incomplete.
    assert status == 1 and out.splitlines() == [
        f"{url}, offset {len(cut)}: truncated tar archive: stream ended at a member boundary without the "
        "end-of-archive marker",
        f"{url}: {len(cut)} bytes, the index says {len(whole)}",
        f"{url}: sha256 {hashlib.sha256(cut).hexdigest()}, the index says {hashlib.sha256(whole).hexdigest()}",
        f"verified 3 shards, 10 samples, {2 * len(whole) + len(cut):,} bytes: 3 problems in 1 shard"]


def linked_shard(tmp_path):
    """A shard as GNU tar writes it from a tree where b.jpg is a hard link of a.jpg."""
    import os
    import shutil
    import subprocess

    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.jpg").write_bytes(image(0))
    (tree / "a.cls").write_bytes(b"0")
    os.link(tree / "a.jpg", tree / "b.jpg")
    (tree / "b.cls").write_bytes(b"1")
    path = tmp_path / "linked.tar"
    subprocess.run(["tar", "cf", str(path), "-C", str(tree), "a.cls", "a.jpg", "b.cls", "b.jpg"], check=True)
    return path


def test_verify_info_and_index_tell_of_link_members(tmp_path, capsys):
    path = linked_shard(tmp_path)
    status, out = verify(capsys, path)
    assert status == 0
    assert re.search(r"note: .*linked.tar, member 'b.jpg', offset \d+: link member read as 'a.jpg'.*"
                     r"tar --hard-dereference", out)
    assert "verified 1 shard, 2 samples" in out and "(1 note)" in out
    assert main(["info", str(path)]) == 0
    captured = capsys.readouterr()
    assert "members   4 (1 links)" in captured.out
    assert "1 link member (hard or symbolic, e.g. 'b.jpg' -> 'a.jpg')" in captured.err
    assert main(["index", "-q", "-o", str(tmp_path / "index.json"), str(path)]) == 0
    assert "note:" in capsys.readouterr().err and read_entries(str(tmp_path / "index.json"))[0]["samples"] == 2
    assert main(["index", "-q", "--format", "dali", "-o", str(tmp_path / "dali"), str(path)]) == 1
    assert "a link member (to 'a.jpg')" in capsys.readouterr().err
    samples = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [sorted(s) for s in samples] == [["__key__", "__local_path__", "__url__", "cls", "jpg"]] * 2
    assert samples[1]["jpg"] == image(0)


def test_an_index_without_sizes_or_digests_says_what_it_could_not_check(tmp_path, capsys):
    with wds.ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=3, index=str(tmp_path / "index.json")) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": "hello"})
    path = tmp_path / "s-00.tar"
    data = bytearray(path.read_bytes())
    data[offsets(str(path))["k0.txt"] + 512] ^= 1  # a copy with one byte flipped: counts alike, bytes not
    path.write_bytes(bytes(data))
    status, out = verify(capsys, "--index", str(tmp_path / "index.json"))
    assert status == 0  # nothing the index holds disagrees ...
    assert out.splitlines()[-1] == ("note: the index has no sizes and no sha256 digests: those checks were not "
                                    "made, a changed byte would pass unseen (`wdsmp index` writes a manifest with "
                                    "both)")  # ... and it says so
    status, out = verify(capsys, "--json", "--index", str(tmp_path / "index.json"))
    assert json.loads(out)["unchecked"].startswith("the index has no sizes and no sha256 digests")


def test_an_index_with_sizes_and_digests_adds_no_note(capsys, indexed):
    shards, index = indexed
    status, out = verify(capsys, "--index", index)
    assert status == 0 and "note:" not in out
    assert json.loads(verify(capsys, "--json", "--index", index)[1])["unchecked"] is None


def test_an_unknown_url_scheme_is_a_usage_error(capsys):
    assert main(["verify", "nosuch://host/a.tar"]) == 2
    assert capsys.readouterr().err.startswith("wdsmp verify: nosuch://host/a.tar: no opener for its URL scheme "
                                              "(known schemes: file, pipe, http")


def test_json_inputs_say_what_they_are(tmp_path, capsys):
    """An index given as a shard gets the way out (``--index``); a glob over a shard directory
    that also holds ``classes.json`` and ``index.json`` (as ``create --imagefolder`` and
    ``wdsmp index`` leave it) takes the shards alone."""
    shards = [write_shard(tmp_path / f"s-{i}.tar", prefix=f"s{i}-") for i in range(2)]
    assert main(["index", "-q", "-o", str(tmp_path / "index.json"), *shards]) == 0
    (tmp_path / "classes.json").write_text('{"cat": 0}')
    capsys.readouterr()
    assert main(["verify", "-q", str(tmp_path / "index.json")]) == 2
    assert "index.json is a JSON file, not a shard; if it is a shard index, pass it with --index" in \
        capsys.readouterr().err
    assert main(["verify", "-q", "--json", str(tmp_path / "*")]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] == 2
    assert main(["index", "-q", "-f", "-o", str(tmp_path / "index.json"), str(tmp_path / "*")]) == 0  # -f, as elsewhere
    assert [entry["samples"] for entry in read_entries(str(tmp_path / "index.json"))] == [4, 4]
    assert main(["verify", "-q", str(tmp_path / "*.json")]) == 2
    assert "matches only JSON files, no shards" in capsys.readouterr().err
