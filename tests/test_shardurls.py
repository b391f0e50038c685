"""Shard specs to URL lists: braces, ``::`` lists, ``${name}`` variables, globs."""

import re

import pytest

from wdsmp.shardlists import envlookup, expand_urls


def test_braces():
    assert expand_urls("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert expand_urls("pipe:curl -s http://h/x-{0,1}.tar") == [
        "pipe:curl -s http://h/x-0.tar", "pipe:curl -s http://h/x-1.tar"]


def test_double_colon_lists():
    assert expand_urls("a{0..1}.tar::b{2..3}.tar::c.tar") == [
        "a0.tar", "a1.tar", "b2.tar", "b3.tar", "c.tar"]
    assert expand_urls("http://[::1]:8080/x{0,1}.tar") == [
        "http://[::1]:8080/x0.tar", "http://[::1]:8080/x1.tar"]


def test_list_elements_are_brace_expanded_not_split():
    assert expand_urls(["x{1,2}.tar", "y.tar"]) == ["x1.tar", "x2.tar", "y.tar"]
    assert expand_urls(("a::b",)) == ["a::b"]


def test_unbalanced_braces_and_bad_types():
    with pytest.raises(ValueError, match="unbalanced braces"):
        expand_urls("a{0..1.tar")
    with pytest.raises(TypeError, match="must be strings"):
        expand_urls([1, 2])


def test_wds_variables(monkeypatch):
    monkeypatch.setenv("WDS_BUCKET", "/data/b")
    assert expand_urls("${BUCKET}/s-{0,1}.tar") == ["/data/b/s-0.tar", "/data/b/s-1.tar"]
    monkeypatch.delenv("WDS_BUCKET")
    with pytest.raises(ValueError, match="WDS_BUCKET is not set"):
        expand_urls("${BUCKET}/s.tar")


def test_globs(tmp_path):
    for name in ["b.tar", "a.tar", "c.tgz", "x[1].tar"]:
        (tmp_path / name).write_bytes(b"")
    assert expand_urls(str(tmp_path / "*.tar")) == [
        str(tmp_path / n) for n in ["a.tar", "b.tar", "x[1].tar"]]
    assert expand_urls([str(tmp_path / "?.tgz")]) == [str(tmp_path / "c.tgz")]
    # an existing file whose name looks like a pattern is itself
    assert expand_urls([str(tmp_path / "x[1].tar")]) == [str(tmp_path / "x[1].tar")]
    # braces first, then each result globbed
    assert expand_urls(str(tmp_path / "{a,c}.t*")) == [
        str(tmp_path / "a.tar"), str(tmp_path / "c.tgz")]


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(ValueError, match="matches no files"):
        expand_urls(str(tmp_path / "*.nothing"))


def test_no_glob_with_a_scheme_or_escaped_brace():
    assert expand_urls("pipe:cat /no/such/*.tar") == ["pipe:cat /no/such/*.tar"]
    assert expand_urls("http://h/a?b=*") == ["http://h/a?b=*"]
    assert expand_urls(r"/no/such/\{x\}*.tar") == ["/no/such/{x}*.tar"]


def test_envlookup(monkeypatch):
    match = re.match(r"\$\{(\w+)\}", "${SPLIT}")
    monkeypatch.setenv("WDS_SPLIT", "train")
    assert envlookup(match) == "train"
    monkeypatch.delenv("WDS_SPLIT")
    with pytest.raises(ValueError, match="WDS_SPLIT is not set"):
        envlookup(match)
