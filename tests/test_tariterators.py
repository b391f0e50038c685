"""Shards to samples: WebDataset's grouping rules, shard boundaries, gzip, handlers."""

import gzip
import io
import os
import pickle
import random
import re
import tarfile
import warnings
import zlib

import pytest

import wdsmp
from wdsmp.tariterators import (
    SHARD_END,
    SHARD_FAILED,
    ShardFailed,
    base_plus_ext,
    group_by_keys,
    tar_file_expander,
    tar_file_iterator,
    tarfile_samples,
    tarfile_to_samples,
    url_opener,
)

from .conftest import tar_bytes, write_tar


def samples(urls, **kw):
    return list(tarfile_samples([{"url": u} for u in urls], **kw))


@pytest.mark.parametrize("path, expected", [
    ("a/b/img.jpg", ("a/b/img", "jpg")),
    ("dir.v2/img.seg.PNG", ("dir.v2/img", "seg.PNG")),
    ("img.", ("img", "")),
    ("noext", (None, None)),
    ("dir.x/noext", (None, None)),
    (".hidden", (None, None)),
])
def test_base_plus_ext(path, expected):
    assert base_plus_ext(path) == expected


def test_samples_from_a_local_shard(impl, tmp_path):
    url = write_tar(tmp_path / "s.tar", [
        ("d/a.JPG", b"jpeg-a"), ("d/a.cls", b"1"),
        ("d/b.jpg", b"jpeg-b"), ("d/b.seg.png", b"png-b"),
        ("README", b"no extension: not part of a sample"),
        ("__meta__/info.json", b"{}"),  # meta directories are skipped
    ])
    got = samples([url])
    assert got == [  # no __local_path__ here, as in webdataset (its WebDataset adds one)
        {"__key__": "d/a", "__url__": url, "jpg": b"jpeg-a", "cls": b"1"},
        {"__key__": "d/b", "__url__": url, "jpg": b"jpeg-b", "seg.png": b"png-b"},
    ]


def test_shard_boundary_ends_a_sample(impl, tmp_path):
    # Both shards hold key "k": they are two samples, never one merged sample.
    a = write_tar(tmp_path / "a.tar", [("k.txt", b"from a")])
    b = write_tar(tmp_path / "b.tar", [("k.cls", b"7")])
    got = samples([a, b])
    assert [(s["__key__"], s["__url__"]) for s in got] == [("k", a), ("k", b)]
    assert "cls" not in got[0] and "txt" not in got[1]


def test_gzip_detected_by_magic(impl, tmp_path):
    data = gzip.compress(tar_bytes([("x.txt", b"zipped"), ("x.cls", b"2")]))
    for name in ["s.tgz", "s.tar.gz", "misnamed.tar"]:
        (tmp_path / name).write_bytes(data)
        got = samples([str(tmp_path / name)])
        assert got[0]["txt"] == b"zipped" and got[0]["cls"] == b"2"


def test_truncated_gzip_is_an_error(impl, tmp_path):
    data = gzip.compress(tar_bytes([("x.bin", bytes(range(256)) * 100)]))
    (tmp_path / "cut.tgz").write_bytes(data[: len(data) // 2])
    with pytest.raises(wdsmp.TarFormatError, match="corrupt gzip stream.*cut.tgz"):
        samples([str(tmp_path / "cut.tgz")])


def test_duplicate_field_is_an_error(impl, tmp_path):
    url = write_tar(tmp_path / "dup.tar", [("k.txt", b"1"), ("k.txt", b"2")])
    with pytest.raises(wdsmp.SampleError,
                       match=r"duplicate field 'txt' in sample 'k'.*dup.tar.*member 'k.txt', offset 1024"):
        samples([url])


def test_interleaved_members_are_an_error(impl, tmp_path):
    url = write_tar(tmp_path / "mixed.tar", [("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3")])
    with pytest.raises(wdsmp.SampleError,
                       match=r"key 'a' reappears.*mixed.tar.*member 'a.cls', offset 2048"):
        samples([url])


def test_bad_samples_dropped_whole_when_handler_continues(impl, tmp_path):
    url = write_tar(tmp_path / "dup.tar", [("a.txt", b"1"), ("k.txt", b"1"), ("k.txt", b"2"),
                                           ("k.cls", b"x"), ("z.txt", b"3")])
    with pytest.warns(UserWarning, match="duplicate field"):
        got = samples([url], handler=wdsmp.warn_and_continue)
    assert [s["__key__"] for s in got] == ["a", "z"]


def test_damaged_shard_goes_through_the_handler(impl, tmp_path):
    good = tar_bytes([("a.txt", b"a"), ("b.txt", b"b"), ("c.txt", b"c" * 2000), ("c.cls", b"1")])
    write_tar(tmp_path / "ok.tar", [("d.txt", b"d")])
    (tmp_path / "cut.tar").write_bytes(good[:3072 + 700])  # cut inside c.txt
    urls = [str(tmp_path / "cut.tar"), str(tmp_path / "ok.tar")]
    with pytest.raises(wdsmp.TarFormatError, match=r"member 'c.txt', offset 2048"):
        samples(urls)
    # Going on: "b" is whole (the damage is in "c"), "c" is dropped, never half-built.
    got = samples(urls, handler=wdsmp.ignore_and_continue)
    assert [s["__key__"] for s in got] == ["a", "b", "d"]
    got = samples(urls, handler=wdsmp.ignore_and_stop)
    assert [s["__key__"] for s in got] == ["a", "b"]


def test_sample_in_progress_dropped_when_damage_is_in_its_own_member(impl, tmp_path):
    good = tar_bytes([("a.txt", b"a"), ("b.txt", b"b"), ("b.cls", b"1" * 2000)])
    (tmp_path / "cut.tar").write_bytes(good[:3072 + 700])  # cut inside b.cls
    got = samples([str(tmp_path / "cut.tar")], handler=wdsmp.ignore_and_continue)
    assert [s["__key__"] for s in got] == ["a"]


def test_sample_in_progress_dropped_when_a_header_is_damaged(impl, tmp_path):
    bad = bytearray(tar_bytes([("a.txt", b"a"), ("b.txt", b"b"), ("c.txt", b"c")]))
    bad[2048 + 5] ^= 1  # c.txt's header: its name cannot be trusted
    (tmp_path / "bad.tar").write_bytes(bytes(bad))
    got = samples([str(tmp_path / "bad.tar")], handler=wdsmp.ignore_and_continue)
    assert [s["__key__"] for s in got] == ["a"]


def test_missing_end_marker_is_not_a_short_epoch(impl, tmp_path):
    good = tar_bytes([("a.txt", b"a"), ("b.txt", b"b")])
    (tmp_path / "s.tar").write_bytes(good[:2048])
    with pytest.raises(wdsmp.TarFormatError, match="end-of-archive marker.*offset 2048"):
        samples([str(tmp_path / "s.tar")])


def test_missing_shard(impl, tmp_path):
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(wdsmp.ShardError, match="nope.tar"):
        samples([missing])
    write_tar(tmp_path / "ok.tar", [("c.txt", b"c")])
    got = samples([missing, str(tmp_path / "ok.tar")], handler=wdsmp.ignore_and_continue)
    assert [s["__key__"] for s in got] == ["c"]


def test_pipe_urls(impl, tmp_path):
    path = write_tar(tmp_path / "s.tar", [("a.txt", b"a"), ("b.txt", b"b")])
    got = samples([f"pipe:cat {path}"])
    assert [s["txt"] for s in got] == [b"a", b"b"]
    assert "__local_path__" not in got[0]


def test_failing_pipe_is_an_error_not_an_empty_shard(impl, tmp_path):
    with pytest.raises(wdsmp.PipeError, match="status 1"):
        samples([f"pipe:cat {tmp_path}/missing.tar"])


def test_select_and_rename_files(impl, tmp_path):
    url = write_tar(tmp_path / "s.tar", [("a.jpg", b"j"), ("a.txt", b"t"), ("a.cls", b"1")])
    got = samples([url], select_files=lambda n: not n.endswith(".txt"),
                  rename_files=lambda n: n.replace(".jpg", ".png"))
    assert got[0]["png"] == b"j" and "txt" not in got[0] and got[0]["cls"] == b"1"


def test_tar_file_iterator_on_a_stream(impl):
    data = tar_bytes([("a.txt", b"a")])
    got = list(tar_file_iterator(io.BytesIO(data)))
    assert got == [{"fname": "a.txt", "data": b"a", "__offset__": 0}]


def test_group_by_keys_on_plain_members():
    members = [{"fname": "a.txt", "data": b"1", "__url__": "u1"},
               {"fname": "a.cls", "data": b"2", "__url__": "u1"},
               SHARD_END,
               {"fname": "a.txt", "data": b"3", "__url__": "u2"},
               {"fname": "b.TXT", "data": b"4", "__url__": "u2"},
               SHARD_FAILED,
               {"fname": "c.txt", "data": b"5", "__url__": "u3"},
               ShardFailed("d.txt")]
    got = list(group_by_keys(iter(members)))
    assert got == [{"__key__": "a", "__url__": "u1", "txt": b"1", "cls": b"2"},
                   {"__key__": "a", "__url__": "u2", "txt": b"3"},  # "b" fell with its shard
                   {"__key__": "c", "__url__": "u3", "txt": b"5"}]  # the damage was in "d"
    # Without markers, a change of URL still ends the sample.
    plain = [m for m in members if isinstance(m, dict)]
    assert len(list(group_by_keys(iter(plain)))) == 4


def test_stage_pickles():
    stage = tarfile_to_samples(handler=wdsmp.warn_and_continue)
    assert pickle.loads(pickle.dumps(stage)).kw == {"handler": wdsmp.warn_and_continue}
    assert pickle.loads(pickle.dumps(SHARD_END)) is SHARD_END


def test_curried_stage_runs(impl, tmp_path):
    url = write_tar(tmp_path / "s.tar", [("a.txt", b"a")])
    assert [s["txt"] for s in tarfile_to_samples()(iter([url]))] == [b"a"]


def test_native_selection(monkeypatch):
    monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    assert not wdsmp.native.core.native_available()
    monkeypatch.delenv("WDSMP_PUREPYTHON")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wdsmp.native.core.native_available()  # whatever the build, it answers without raising


def count_both(monkeypatch, urls, **kw):
    counts = {}
    for mode in ["native", "python"]:
        if mode == "python":
            monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
        else:
            monkeypatch.delenv("WDSMP_PUREPYTHON", raising=False)
        counts[mode] = [s["__key__"] for s in samples(urls, **kw)]
    return counts


def test_cut_gzip_shard_gives_the_same_samples_natively_and_in_python(monkeypatch, tmp_path):
    data = gzip.compress(tar_bytes([(f"s{i:04d}.bin", bytes([i % 256]) * 5000) for i in range(200)]))
    (tmp_path / "cut.tgz").write_bytes(data[: len(data) * 3 // 4])
    got = count_both(monkeypatch, [str(tmp_path / "cut.tgz")], handler=wdsmp.ignore_and_continue)
    assert got["native"] == got["python"]
    assert len(got["native"]) > 100


def test_status_of_a_pipe_checked_after_the_end_marker(impl, tmp_path):
    path = write_tar(tmp_path / "ok.tar", [("a.txt", b"a"), ("b.txt", b"b")])
    with pytest.raises(wdsmp.PipeError, match="status 3"):
        samples([f"pipe:cat {path}; exit 3"])
    with pytest.raises(wdsmp.PipeError, match="status 3"):
        samples([f"pipe:cat {path} {path}; exit 3"])


def test_gzip_crc_is_checked(impl, tmp_path):
    data = bytearray(gzip.compress(tar_bytes([("a.txt", b"a" * 1000)])))
    data[-6] ^= 0xFF  # a byte of the CRC trailer
    (tmp_path / "bad.tgz").write_bytes(bytes(data))
    with pytest.raises(wdsmp.TarFormatError, match="corrupt gzip stream.*CRC.*bad.tgz"):
        samples([str(tmp_path / "bad.tgz")])


def test_sample_cut_inside_a_long_name_header_is_dropped(impl, tmp_path):
    long_key = "k" * 150
    data = tar_bytes([("a.txt", b"a"), (long_key + ".jpg", b"j"), (long_key + ".cls", b"1")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        cls_offset = [m.offset for m in tar][2]  # where the .cls member's long-name header starts
    (tmp_path / "cut.tar").write_bytes(data[: cls_offset + 512 + 50])
    got = samples([str(tmp_path / "cut.tar")], handler=wdsmp.ignore_and_continue)
    assert [s["__key__"] for s in got] == ["a"]  # the long-key sample may lack its .cls


def test_expander_yields_only_member_dicts_by_default(impl, tmp_path):
    path = write_tar(tmp_path / "s.tar", [("a.txt", b"a")])
    members = list(tar_file_expander(url_opener([path])))
    assert all(isinstance(m, dict) for m in members) and len(members) == 1


def test_an_empty_tar_gives_no_samples_and_no_error(impl, tmp_path):
    empty = tar_bytes([])  # only the end-of-archive blocks
    assert set(empty) == {0}
    url = write_tar(tmp_path / "empty.tar", [])
    (tmp_path / "empty.tgz").write_bytes(gzip.compress(empty))
    assert samples([url]) == []
    assert samples([str(tmp_path / "empty.tgz")]) == []
    assert samples([f"pipe:cat {url}"]) == []
    # Between two shards it ends nothing and adds nothing.
    a = write_tar(tmp_path / "a.tar", [("a.txt", b"1")])
    b = write_tar(tmp_path / "b.tar", [("b.txt", b"2")])
    got = samples([a, url, b])
    assert [(s["__key__"], s["__url__"], s["txt"]) for s in got] == [("a", a, b"1"), ("b", b, b"2")]


def _tree(root):
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files)


def test_climbing_and_absolute_member_names_are_only_keys(impl, tmp_path, monkeypatch):
    """Members are read into memory, never extracted: a name that climbs out of the
    working directory or is absolute is a sample key like any other (split by
    base_plus_ext, as written), and no file is created anywhere."""
    names = ["../evil.txt", "../evil.cls", "/abs/x.txt", "a/../../b.txt", "a/../../b.cls"]
    (tmp_path / "shards").mkdir()
    url = write_tar(tmp_path / "shards" / "s.tar", [(name, name.encode()) for name in names])
    with tarfile.open(url) as tar:
        assert tar.getnames() == names  # the archive holds the names as they are
    cwd = tmp_path / "work" / "deeper"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)  # "../" and "a/../../" point into tmp_path/work
    before, absolute = _tree(tmp_path), os.path.exists("/abs/x.txt")
    assert [base_plus_ext(name) for name in names] == [
        ("../evil", "txt"), ("../evil", "cls"), ("/abs/x", "txt"), ("a/../../b", "txt"), ("a/../../b", "cls")]
    got = samples([url])
    assert [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in got] == [
        ("../evil", {"txt": b"../evil.txt", "cls": b"../evil.cls"}),
        ("/abs/x", {"txt": b"/abs/x.txt"}),
        ("a/../../b", {"txt": b"a/../../b.txt", "cls": b"a/../../b.cls"}),
    ]
    assert _tree(tmp_path) == before
    assert os.path.exists("/abs/x.txt") == absolute


def test_a_gzip_bomb_is_refused_at_its_member_header_under_a_memory_limit(tmp_path):
    """A 2 MB .tar.gz whose member expands to 1.5 GiB: refused, with the shard, the member and
    the cap named, in a process that could not hold it."""
    from .bombs import gzip_of_zeros, run_limited

    info = tarfile.TarInfo("z.bomb")
    info.size = 96 << 24  # 1.5 GiB of zeros
    head = tar_bytes([("k.txt", b"before")])[:1024] + info.tobuf(tarfile.GNU_FORMAT)
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(gzip_of_zeros(head, info.size, bytes(1024)))
    assert path.stat().st_size < 4 << 20
    status, out = run_limited(f"""
        try:
            for sample in wdsmp.WebDataset({str(path)!r}, shardshuffle=False):
                print("sample", sample["__key__"])
        except Exception as exn:
            print(type(exn).__name__, exn)
        """)
    assert status == 0, out
    assert "sample k\n" in out  # the sample before the bomb is delivered
    assert re.search(r"TarFormatError member of 1610612736 bytes, more than the 1073741824 bytes one member "
                     r"may hold \(max_member_size, or WDSMP_MAX_MEMBER_SIZE\).*shard '.*bomb.tar.gz', "
                     r"member 'z.bomb'", out), out


def test_max_member_size_reaches_the_reader(tmp_path):
    path = write_tar(tmp_path / "s.tar", [("a.txt", b"a"), ("b.bin", b"b" * 3000)])
    with pytest.raises(wdsmp.TarFormatError, match="member of 3000 bytes, more than the 2048 bytes"):
        list(tarfile_samples([path], max_member_size=2048))
    assert [s["__key__"] for s in tarfile_samples([path], max_member_size=3000)] == ["a", "b"]


def test_a_cut_gzip_shard_delivers_every_sample_before_the_cut(impl, tmp_path):
    """dd-style: the first 10 KiB of a .tgz, read as a pipe. Every sample whose members all
    lie before the cut comes (the one whose member was cut is named by the error, so the
    sample before it is known whole), then the error; with a skipping handler, the next shard."""
    rng = random.Random(0)
    members = [(f"s{i:03d}.{ext}", rng.randbytes(300) if ext == "bin" else b"%d" % i)
               for i in range(60) for ext in ("bin", "cls")]
    data = tar_bytes(members)
    packed = gzip.compress(data, mtime=0)
    (tmp_path / "s.tgz").write_bytes(packed)
    before_cut = len(zlib.decompressobj(31).decompress(packed[:10240]))
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        whole = [m.name for m in archive if m.offset_data + m.size <= before_cut]
    complete = [name.split(".")[0] for name in whole if name.endswith(".cls")]
    url = f"pipe:head -c 10240 {tmp_path / 's.tgz'}"  # dd aborts under the sanitizer preload
    got = []
    with pytest.raises(wdsmp.TarFormatError, match="corrupt gzip stream") as info:
        for sample in wdsmp.WebDataset(url, shardshuffle=False):
            got.append(sample["__key__"])
    assert len(complete) > 20 and got == complete
    assert info.value.member == f"{complete[-1][:1]}{int(complete[-1][1:]) + 1:03d}.bin"
    ok = write_tar(tmp_path / "ok.tar", [("z.txt", b"z")])
    skipped = [s["__key__"] for s in wdsmp.WebDataset([url, ok], shardshuffle=False,
                                                      handler=wdsmp.ignore_and_continue)]
    assert skipped == got + ["z"]
