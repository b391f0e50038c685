"""``wdsmp create``: shards from directories, ImageFolder trees and recipes, checked with tar(1)."""

import argparse
import gzip
import json
import os
import signal
import subprocess
import tarfile

import pytest

from wdsmp.cli import create, listing, main, reshard


def members(path):
    """``[(name, bytes)]`` of a tar file, in archive order."""
    with tarfile.open(path) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive]


def tar_names(path):
    """Member names as the system tar lists them."""
    return subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True).stdout.split()


def make_tree(root, files):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


TREE = {
    "b/2.jpg": b"\xff\xd8jpeg-2",
    "b/2.json": b'{"n": 2}',
    "a/1.seg.png": b"\x89PNG-1",
    "a/1.txt": b"one",
    "a.b/3.TXT": b"three",
    ".hidden/4.txt": b"skipped",
    "a/.DS_Store": b"skipped",
}


def test_directory_to_series(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_tree(tmp_path / "src", TREE)
    assert main(["create", "--json", "--maxcount", "2", "-o", "out-%06d.tar", "src"]) == 0
    result = capsys.readouterr()
    summary = json.loads(result.out)
    assert summary["samples"] == 3
    assert summary["outputs"] == [{"url": "out-000000.tar", "samples": 2}, {"url": "out-000001.tar", "samples": 1}]
    assert tar_names(tmp_path / "out-000000.tar") == ["a.b/3.TXT", "a/1.seg.png", "a/1.txt"]  # keys sorted
    assert tar_names(tmp_path / "out-000001.tar") == ["b/2.jpg", "b/2.json"]
    assert members(tmp_path / "out-000001.tar") == [("b/2.jpg", TREE["b/2.jpg"]), ("b/2.json", TREE["b/2.json"])]
    assert "wdsmp create: 3/3 samples" in result.err


def test_clobber_refused_end_to_end(tmp_path, wdsmp_run):
    make_tree(tmp_path / "src", TREE)
    (tmp_path / "out.tar").write_bytes(b"precious")
    result = wdsmp_run("create", "-o", "out.tar", "src")
    assert result.returncode == 2
    assert "out.tar exists; remove it or pass --force" in result.stderr
    assert (tmp_path / "out.tar").read_bytes() == b"precious"


def test_force_overwrites_and_output_is_deterministic(tmp_path, capsys):
    src = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out.tar"
    assert main(["create", "-q", "-o", str(out), str(src)]) == 0
    first = out.read_bytes()
    os.utime(src / "a/1.txt", (1, 1))  # mtimes do not reach the archive
    assert main(["create", "-q", "--force", "-o", str(out), str(src)]) == 0
    assert out.read_bytes() == first
    assert capsys.readouterr().err == ""


def test_compression_follows_the_name(tmp_path):
    src = make_tree(tmp_path / "src", TREE)
    assert main(["create", "-q", "-o", str(tmp_path / "out.tar.gz"), str(src)]) == 0
    assert gzip.decompress((tmp_path / "out.tar.gz").read_bytes())[:5] == b"a.b/3"


def test_maxsize_cuts_shards(tmp_path, capsys):
    src = make_tree(tmp_path / "src", {f"{i}.bin": bytes(3000) for i in range(5)})
    assert main(["create", "-q", "--json", "--maxsize", "8k", "-o", str(tmp_path / "s-%d.tar"), str(src)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [o["samples"] for o in summary["outputs"]] == [2, 2, 1]  # 4096 tar bytes per sample


def test_imagefolder(tmp_path, capsys):
    src = make_tree(tmp_path / "train", {"dog/d1.jpg": b"d1", "cat/c1.jpg": b"c1", "cat/c2.JPEG": b"c2",
                                         "emu/.keep": b""})
    out = tmp_path / "shards" / "train.tar"
    out.parent.mkdir()
    assert main(["create", "-q", "--json", "--imagefolder", "-o", str(out), str(src)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["classes"] == 3 and summary["classes_file"] == str(tmp_path / "shards" / "classes.json")
    assert json.loads((tmp_path / "shards" / "classes.json").read_text()) == {"cat": 0, "dog": 1, "emu": 2}
    assert members(out) == [("cat/c1.cls", b"0"), ("cat/c1.jpg", b"c1"), ("cat/c2.JPEG", b"c2"),
                            ("cat/c2.cls", b"0"), ("dog/d1.cls", b"1"), ("dog/d1.jpg", b"d1")]
    # A second split with the same classes leaves the index alone; different classes need --force.
    assert main(["create", "-q", "--imagefolder", "-o", str(out.with_name("val.tar")), str(src)]) == 0
    (src / "fox").mkdir()
    assert main(["create", "-q", "--imagefolder", "-o", str(out.with_name("x.tar")), str(src)]) == 2
    assert "classes.json exists" in capsys.readouterr().err
    assert not out.with_name("x.tar").exists()


@pytest.mark.parametrize("argv, message", [
    (["--imagefolder", "-o", "-", "src"], "--imagefolder needs --classes FILE"),
    (["--recipe", "r", "-o", "x.tar", "src"], "give either a SOURCE"),
    (["-o", "x.tar"], "give either a SOURCE"),
    (["--recipe", "r", "--imagefolder", "-o", "x.tar"], "--imagefolder and --follow-links read a directory"),
    (["--classes", "c.json", "-o", "x.tar", "src"], "--classes goes with --imagefolder"),
    (["--maxcount", "3", "-o", "x.tar", "src"], "--maxcount and --maxsize cut a series"),
    (["--json", "-o", "-", "src"], "--json prints on stdout"),
    (["-o", "x.tar", "nowhere"], "nowhere: not a directory"),
    (["-o", "x.tar", "empty"], "no samples in empty"),
    (["-o", "src/cls/x-%d.tar", "src"], "lies inside SOURCE"),
    (["--imagefolder", "--classes", "src/classes.json", "-o", "x.tar", "src"], "lies inside SOURCE"),
    (["-o", "x.tar.xz", "src"], "wdsmp reads plain and gzip tars only, so it writes only those: name the "
     "output .tar, .tar.gz or .tgz"),
    (["--maxcount", "1", "-o", "x-%d.tar.bz2", "src"], "x-0.tar.bz2: wdsmp reads plain and gzip tars only"),
])
def test_usage_errors(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    make_tree(tmp_path / "src", {"cls/a.txt": b"a"})
    (tmp_path / "empty").mkdir()
    assert main(["create", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.tar").exists()


@pytest.mark.parametrize("files, message", [
    ({"README": b"x"}, "README: no extension"),
    ({"a.txt": b"x", "foo.": b"y"}, "foo.: no extension"),
    ({"a.txt": b"x", "a.TXT": b"y"}, "has fields"),
])
def test_files_that_would_not_read_back(tmp_path, capsys, files, message):
    src = make_tree(tmp_path / "src", files)
    assert main(["create", "-o", str(tmp_path / "x.tar"), str(src)]) == 2
    assert message in capsys.readouterr().err


def test_imagefolder_refuses_loose_files_and_cls_fields(tmp_path, capsys):
    src = make_tree(tmp_path / "src", {"top.jpg": b"x"})
    assert main(["create", "--imagefolder", "-o", str(tmp_path / "x.tar"), str(src)]) == 2
    assert "files belong in class directories" in capsys.readouterr().err
    src = make_tree(tmp_path / "src2", {"c/a.cls": b"7"})
    assert main(["create", "--imagefolder", "-o", str(tmp_path / "x.tar"), str(src)]) == 2
    assert "a .cls file" in capsys.readouterr().err


def test_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.bin").write_bytes(b"\x00\x01binary")
    (tmp_path / "recipe").write_text("# samples in order of first appearance\n\n"
                                     "z/9.txt text:hello, world\n"
                                     "a.bin data.bin\n"
                                     "z/9.out   pipe:printf 'from %s' pipe\n"
                                     "a.txt text:α\n", encoding="utf-8")
    assert main(["create", "-q", "--recipe", "recipe", "-o", "r.tar"]) == 0
    assert members(tmp_path / "r.tar") == [("z/9.out", b"from pipe"), ("z/9.txt", b"hello, world"),
                                           ("a.bin", b"\x00\x01binary"), ("a.txt", "α".encode())]


@pytest.mark.parametrize("recipe, status, message", [
    ("a.txt\n", 2, "line 1: expected 'archive-name source'"),
    ("# c\nnoext text:x\n", 2, "line 2: archive name 'noext' has no extension"),
    ("a.txt text:x\na.txt text:y\n", 2, "line 2: 'a.txt' appears twice"),
    ("a.txt text:x\nb.txt pipe:echo oops >&2; exit 3\n", 1, "exited with status 3: oops"),
    ("a.txt missing.bin\n", 1, "cannot open 'missing.bin'"),
    ("", 2, "no samples in recipe"),
    ("foo. text:x\n", 2, "line 1: archive name 'foo.' has no extension"),
])
def test_recipe_errors_leave_no_output(tmp_path, capsys, monkeypatch, recipe, status, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe").write_text(recipe)
    assert main(["create", "-q", "--recipe", "recipe", "-o", "out-%03d.tar", "--maxcount", "1"]) == status
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("out-*"))


def test_help_texts_format():
    """argparse %-formats help strings: a literal out-%06d.tar there must be escaped."""
    parser = argparse.ArgumentParser(prog="wdsmp")
    subparsers = parser.add_subparsers()
    for module in (create, reshard, listing):
        module.add_parser(subparsers)
    assert "out-%06d.tar" in parser.format_help()
    for subparser in subparsers.choices.values():
        subparser.format_help()


def test_outputs_appear_only_when_complete(tmp_path, monkeypatch):
    """Archives are written under hidden partial names and renamed together at the end; a partial
    file that a killed run left does not block the next run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".partial-x-1.tar").write_bytes(b"left by a killed run")
    (tmp_path / "recipe").write_text("a.txt text:x\nb.txt pipe:ls -A out\n")
    assert main(["create", "-q", "--recipe", "recipe", "--maxcount", "1", "-o", "out/x-%d.tar"]) == 0
    assert sorted(os.listdir("out")) == ["x-0.tar", "x-1.tar"]
    assert members(tmp_path / "out" / "x-1.tar") == [("b.txt", b".partial-x-0.tar\n.partial-x-1.tar\n")]


def test_sigterm_removes_partial_files(tmp_path, monkeypatch):
    """SIGTERM unwinds like Ctrl-C: no output under its name, no partial file; exit status 143."""
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        pytest.skip("SIGTERM is handled here already")  # wdsmp leaves such a handler alone
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe").write_text("a.txt text:x\nb.txt pipe:kill -TERM $PPID\nc.txt text:never\n")
    with pytest.raises(SystemExit) as exit:
        main(["create", "-q", "--recipe", "recipe", "-o", "out.tar"])
    assert exit.value.code == 128 + signal.SIGTERM
    assert sorted(os.listdir(tmp_path)) == ["recipe"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_sources_are_never_outputs(tmp_path, capsys, monkeypatch):
    """Not even with --force: the recipe, its local sources, the files of a tree (a link out of
    the tree is not read, so what it names is no input)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.tar").write_bytes(b"source")
    (tmp_path / "recipe").write_text("a.bin data.tar\nb.txt text:x\n")
    for output in ("data.tar", "recipe", "file:data.tar"):
        assert main(["create", "-q", "--force", "--recipe", "recipe", "-o", output]) == 2
        assert "is an input; it cannot be an output too" in capsys.readouterr().err
    make_tree(tmp_path / "src", {"a.txt": b"a"})
    (tmp_path / "src" / "b.bin").symlink_to(tmp_path / "data.tar")
    assert (tmp_path / "recipe").read_text() == "a.bin data.tar\nb.txt text:x\n"
    for follow in ([], ["--follow-links"]):
        assert main(["create", "-q", "--force", *follow, "-o", "data.tar", "src"]) == 0
        assert "skipping src/b.bin: a symbolic link to" in capsys.readouterr().err
        assert members(tmp_path / "data.tar") == [("a.txt", b"a")]


def test_class_index_is_part_of_the_output(tmp_path, capsys, monkeypatch):
    """Its directory is made; if it cannot be written, no shard is left either."""
    monkeypatch.chdir(tmp_path)
    make_tree(tmp_path / "photos", {"cat/c.jpg": b"c", "dog/d.jpg": b"d"})
    assert main(["create", "-q", "--imagefolder", "--classes", "nodir/cls.json", "-o", "ifx.tar", "photos"]) == 0
    assert json.loads((tmp_path / "nodir" / "cls.json").read_text()) == {"cat": 0, "dog": 1}
    (tmp_path / "afile").write_bytes(b"")
    assert main(["create", "-q", "--imagefolder", "--classes", "afile/cls.json", "--maxcount", "1",
                 "-o", "out/s-%d.tar", "photos"]) == 1
    assert "afile" in capsys.readouterr().err
    assert os.listdir(tmp_path / "out") == []


def test_symbolic_links_are_skipped_and_named_unless_followed_inside_the_tree(tmp_path, capsys):
    secret = tmp_path / "private"
    secret.mkdir()
    (secret / "id_rsa.key").write_bytes(b"PRIVATE KEY")
    root = tmp_path / "tree"
    make_tree(root, {"a/1.txt": b"one"})
    os.symlink(secret / "id_rsa.key", root / "a" / "2.txt")  # a file outside the tree
    os.symlink("1.txt", root / "a" / "3.txt")  # a file inside
    os.symlink(root / "a", root / "b")  # a directory inside
    os.symlink(secret, root / "c")  # a directory outside
    os.symlink(root, root / "a" / "loop")  # a directory above: a cycle
    os.symlink("gone.txt", root / "a" / "4.txt")  # dangling
    assert main(["create", "-q", "-o", str(tmp_path / "plain.tar"), str(root)]) == 0
    err = capsys.readouterr().err
    assert dict(members(tmp_path / "plain.tar")) == {"a/1.txt": b"one"}
    for name in ("a/2.txt", "a/3.txt", "b", "c", "a/loop", "a/4.txt"):
        assert f"skipping {root / name}: a symbolic link to" in err, (name, err)
    assert "not followed (--follow-links follows links that stay inside SOURCE)" in err
    assert main(["create", "-q", "--follow-links", "-o", str(tmp_path / "followed.tar"), str(root)]) == 0
    err = capsys.readouterr().err
    got = dict(members(tmp_path / "followed.tar"))
    assert got == {"a/1.txt": b"one", "a/3.txt": b"one", "b/1.txt": b"one", "b/3.txt": b"one"}
    assert b"PRIVATE KEY" not in (tmp_path / "followed.tar").read_bytes()
    assert f"skipping {root / 'a' / '2.txt'}: a symbolic link to {str(secret / 'id_rsa.key')!r}, outside SOURCE" in err
    assert f"skipping {root / 'c'}: a symbolic link to {str(secret)!r}, outside SOURCE" in err
    assert f"skipping {root / 'a' / 'loop'}: a symbolic link to {str(root)!r}, a directory above it" in err
    assert f"skipping {root / 'a' / '4.txt'}: a symbolic link to 'gone.txt', which does not exist" in err


def test_imagefolder_classes_follow_the_same_rule_for_links(tmp_path, capsys):
    root = tmp_path / "tree"
    make_tree(root, {"cat/1.jpg": b"c", "dog/1.jpg": b"d"})
    os.symlink(root / "cat", root / "kitten")
    assert main(["create", "-q", "--imagefolder", "-o", str(tmp_path / "out" / "s.tar"), str(root)]) == 0
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == {"cat": 0, "dog": 1}
    assert main(["create", "-q", "--imagefolder", "--follow-links", "--force",
                 "-o", str(tmp_path / "out" / "s.tar"), str(root)]) == 0
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == {"cat": 0, "dog": 1, "kitten": 2}
    assert dict(members(tmp_path / "out" / "s.tar"))["kitten/1.cls"] == b"2"
