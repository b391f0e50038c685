"""Shard indexes: written by ShardWriter or write_index, read locally or over HTTP, errors named."""

import json
import os

import pytest

import wdsmp
from wdsmp.shards.index import (INDEX_NAME, is_index, read_index, relative_url, resolve_url, shard_counts,
                              write_atomic, write_index)


def test_shardwriter_writes_an_index_with_every_count(tmp_path):
    index = tmp_path / "index.json"
    with wdsmp.ShardWriter(str(tmp_path / "part-%03d.tar"), maxcount=4, index=str(index)) as sink:
        for i in range(10):
            sink.write({"__key__": f"{i:03d}", "txt": b"x"})
    assert sink.counts == [4, 4, 2]
    assert json.loads(index.read_text())["shards"] == [
        {"url": "part-000.tar", "samples": 4}, {"url": "part-001.tar", "samples": 4},
        {"url": "part-002.tar", "samples": 2}]
    table = read_index(str(index))
    assert table == [(str(tmp_path / f"part-00{i}.tar"), n) for i, n in enumerate([4, 4, 2])]
    samples = list(wdsmp.DataPipeline(wdsmp.SimpleShardList([url for url, _ in table]), wdsmp.tarfile_to_samples()))
    assert len(samples) == 10


def test_shardwriter_writes_index_json_beside_local_and_remote_shards(tmp_path, http_server):
    with wdsmp.ShardWriter(str(tmp_path / "part-%03d.tar"), maxcount=3, index=True) as sink:
        for i in range(7):
            sink.write({"__key__": f"{i:03d}", "txt": b"x"})
    assert read_index(str(tmp_path / INDEX_NAME)) == [(str(tmp_path / f"part-00{i}.tar"), n)
                                                      for i, n in enumerate((3, 3, 1))]
    with wdsmp.ShardWriter(http_server.url("up/part-%03d.tar"), maxcount=4, index=True) as sink:
        for i in range(5):
            sink.write({"__key__": f"{i:03d}", "txt": b"x"})
    assert read_index(http_server.url(f"up/{INDEX_NAME}")) == [(http_server.url(f"up/part-00{i}.tar"), n)
                                                              for i, n in enumerate((4, 1))]
    with pytest.raises(ValueError, match="index must be True, a path or URL, or None"):
        wdsmp.ShardWriter(str(tmp_path / "x-%03d.tar"), index=1)


def test_an_index_url_with_a_query_string_is_an_index(http_server):
    http_server.put_file("/d/index.json", json.dumps({"shards": [{"url": "a.tar", "samples": 3}]}).encode())
    signed = http_server.url("/d/index.json") + "?X-Amz-Signature=abc&X-Amz-Expires=60"
    assert is_index(signed) and not is_index(http_server.url("/d/a.tar?name=x.json"))
    assert shard_counts(signed) == [(http_server.url("/d/a.tar"), 3)]
    assert http_server.requests("/d/index.json")[0].path == "/d/index.json?X-Amz-Signature=abc&X-Amz-Expires=60"


def test_urls_are_relative_to_the_index(tmp_path):
    assert resolve_url("/data/index.json", "a.tar") == "/data/a.tar"
    assert resolve_url("/data/index.json", "sub/a.tar") == "/data/sub/a.tar"
    assert resolve_url("http://host:8/x/index.json?sig=1", "a.tar") == "http://host:8/x/a.tar"
    assert resolve_url("s3://bucket/x/index.json", "a.tar") == "s3://bucket/x/a.tar"
    for absolute in ("/elsewhere/a.tar", "http://h/a.tar", "pipe:cat a.tar"):
        assert resolve_url("/data/index.json", absolute) == absolute
    assert relative_url("/data/index.json", "/data/sub/a.tar") == "sub/a.tar"
    assert relative_url("/data/index.json", "/other/a.tar") == "/other/a.tar"
    assert relative_url("/data/index.json", "http://h/a.tar") == "http://h/a.tar"


def test_what_relative_url_writes_resolves_to_the_shard_from_anywhere(tmp_path, monkeypatch):
    """Relative below the manifest's directory, absolute outside it (a relative path would be read
    against the manifest's directory), whatever the working directory and however it was named."""
    monkeypatch.chdir(tmp_path)
    cases = [("other/index.json", "idxt/a.tar"), ("idxt/index.json", "idxt/a.tar"),
             ("idxt/index.json", "idxt/sub/a.tar"), ("idxt/sub/index.json", "idxt/a.tar"),
             ("index.json", "../up.tar"), ("./idxt/index.json", "file:idxt/b.tar"),
             (str(tmp_path / "other" / "index.json"), "idxt/a.tar"), ("idxt/index.json", str(tmp_path / "x.tar")),
             ("idxt/index.json", "idxt/..x.tar"), ("idxt/index.json", "idxt/../x.tar")]
    for index, shard in cases:
        written = relative_url(index, shard)
        assert os.path.isabs(written) or not written.startswith("../"), (index, shard, written)
        shard_path = shard[len("file:"):] if shard.startswith("file:") else shard
        assert os.path.abspath(resolve_url(index, written)) == os.path.abspath(shard_path), (index, shard)
    assert relative_url("other/index.json", "idxt/a.tar") == str(tmp_path / "idxt" / "a.tar")
    assert relative_url("idxt/index.json", "idxt/sub/a.tar") == os.path.join("sub", "a.tar")
    assert relative_url("/data/index.json", "/data/..x.tar") == "..x.tar"  # a name, not the parent
    assert relative_url("/data/index.json", "/data/../x.tar") == "/x.tar"
    assert relative_url("http://h/d/index.json", "idxt/a.tar") == str(tmp_path / "idxt" / "a.tar")
    assert relative_url("/data/index.json", "-") == "-"


def test_an_index_over_http(http_server):
    http_server.put_file("/d/index.json", json.dumps({"shards": [{"url": "a.tar", "samples": 3}]}).encode())
    assert read_index(http_server.url("/d/index.json")) == [(http_server.url("/d/a.tar"), 3)]


@pytest.mark.parametrize("text, match", [
    ("not json", "is not JSON"),
    ("[]", "no non-empty 'shards' list"),
    ('{"shards": []}', "no non-empty 'shards' list"),
    ('{"shards": [{"url": "a.tar"}]}', r"entry 0 .* needs a 'url' string and a 'samples' count"),
    ('{"shards": [{"url": "a.tar", "samples": -1}]}', "entry 0"),
    ('{"shards": [{"url": 3, "samples": 1}]}', "entry 0"),
])
def test_bad_indexes_are_named(tmp_path, text, match):
    path = tmp_path / "index.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        read_index(str(path))
    assert str(path) in str(info.value)


def test_write_index_keeps_extra_keys_and_is_atomic(tmp_path):
    path = tmp_path / "index.json"
    write_index(str(path), [{"url": "a.tar", "samples": 2, "sha256": "00"}], classes=10)
    assert json.loads(path.read_text()) == {"classes": 10, "shards": [{"url": "a.tar", "samples": 2, "sha256": "00"}]}
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]
    write_index(str(tmp_path / "new" / "index.json"), [("a.tar", 1)])  # its directory made
    assert read_index(str(tmp_path / "new" / "index.json")) == [(str(tmp_path / "new" / "a.tar"), 1)]


def test_write_atomic_leaves_no_temp_when_it_fails(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(str(tmp_path / "taken"), "text")  # the rename over a directory fails
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
