"""Brace patterns: the one expansion that shard specs, globs and fnmatch patterns share."""

import pytest

from wdsmp._internal.braces import expand_braces, fnmatch_with_braces, glob_with_braces


def test_expand_braces():
    assert expand_braces("a-{00..02}.{tar,tgz}") == ["a-00.tar", "a-00.tgz", "a-01.tar", "a-01.tgz",
                                                     "a-02.tar", "a-02.tgz"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match=r"unbalanced braces in shard spec 'a\{0\.\.1\.tar'"):
        expand_braces("a{0..1.tar", "shard spec")


def test_glob_with_braces(tmp_path):
    for name in ["b.tar", "a.tar", "c.tgz", "d.txt"]:
        (tmp_path / name).write_bytes(b"")
    found = glob_with_braces(str(tmp_path / "*.{tar,tgz}"))
    assert found == [str(tmp_path / n) for n in ["a.tar", "b.tar", "c.tgz"]]  # sorted per alternative
    assert glob_with_braces(str(tmp_path / "*.zip")) == []
    with pytest.raises(ValueError, match="unbalanced braces"):
        glob_with_braces(str(tmp_path / "*.{tar"))


@pytest.mark.parametrize("name, pattern, expected", [
    ("x.tar", "*.{tar,tgz}", True),
    ("x.tgz", "*.{tar,tgz}", True),
    ("x.zip", "*.{tar,tgz}", False),
    ("shard-07.tar", "shard-{00..09}.tar", True),
    ("shard-10.tar", "shard-{00..09}.tar", False),
    ("plain.tar", "*.tar", True),
])
def test_fnmatch_with_braces(name, pattern, expected):
    assert fnmatch_with_braces(name, pattern) is expected
