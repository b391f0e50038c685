"""``wdsmp cache``: shards land in the cache the loaders read, once; failures are named and
leave nothing behind."""

import io
import json
import os
import warnings

import wdsmp as wds
from wdsmp.cache import FileCache
from wdsmp.cli import main


def shard(n=3, prefix="k"):
    stream = io.BytesIO()
    with wds.TarWriter(stream) as sink:
        for i in range(n):
            sink.write({"__key__": f"{prefix}{i:03d}", "cls": str(i).encode()})
    return stream.getvalue()


def test_prefetch_from_the_command_line_then_nothing_is_fetched_again(tmp_path, http_server, wdsmp_run,
                                                                       capsys):
    data = {name: shard(prefix=name) for name in ("a", "b")}
    urls = [http_server.put_file(f"/d/{name}.tar", blob) for name, blob in data.items()]
    cache_dir = tmp_path / "cache"
    result = wdsmp_run("cache", "--cache-dir", cache_dir, http_server.url("/d/{a,b}.tar"))
    assert result.returncode == 0, result.stderr
    sizes = [len(blob) for blob in data.values()]
    assert result.stdout.splitlines() == [f"fetched {url} ({size:,} bytes)" for url, size in zip(urls, sizes)] + [
        f"2 fetched ({sum(sizes):,} bytes), 0 already cached, 0 local, 0 failed"]
    assert len(http_server.requests(method="GET")) == 2
    cache = FileCache(str(cache_dir))
    assert [open(cache.entry_path(url), "rb").read() for url in urls] == list(data.values())

    assert main(["cache", "-q", "--cache-dir", str(cache_dir), *urls]) == 0  # again, in this process
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cached  {urls[0]} ({len(data['a']):,} bytes)"
    assert lines[-1] == "0 fetched (0 bytes), 2 already cached, 0 local, 0 failed"
    assert len(http_server.requests(method="GET")) == 2  # nothing fetched again
    # and a loader with the same cache_dir reads them without a request
    keys = [sample["__key__"] for sample in wds.WebDataset(urls, cache_dir=str(cache_dir), shardshuffle=False)]
    assert keys == ["a000", "a001", "a002", "b000", "b001", "b002"]
    assert len(http_server.requests(method="GET")) == 2


def test_failures_are_named_and_the_rest_fetched(tmp_path, http_server, capsys):
    good = http_server.put_file("/good.tar", shard())
    page = http_server.put_file("/page.tar", b"<!DOCTYPE html><html>sign in first</html>\n" * 30)
    cut = http_server.put_file("/cut.tar", shard()[:1500])
    local = tmp_path / "local.tar"
    local.write_bytes(shard())
    missing = http_server.url("/missing.tar")
    status = main(["cache", "-q", "--json", "--cache-dir", str(tmp_path / "cache"), page, missing, good, cut,
                   str(local)])
    summary = json.loads(capsys.readouterr().out)
    assert status == 1
    assert {key: summary[key] for key in ("fetched", "cached", "local", "failed")} == {
        "fetched": 1, "cached": 0, "local": 1, "failed": 3}
    results = {result["url"]: result for result in summary["shards"]}
    assert "not a tar archive (starts with b'<!DOCTYPE" in results[page]["error"]
    assert "404" in results[missing]["error"]
    assert "truncated tar archive" in results[cut]["error"] and "offset 1024" in results[cut]["error"]
    assert results[good]["status"] == "fetched" and results[str(local)]["status"] == "local"
    entry = FileCache(str(tmp_path / "cache")).entry_path(good)
    assert sorted(str(p) for p in (tmp_path / "cache").rglob("*") if p.is_file()) == [entry, f"{entry}.lock"]


def test_text_output_and_usage(tmp_path, http_server, capsys):
    url = http_server.put_file("/a.tar", shard())
    assert main(["cache", "-q", "--cache-dir", str(tmp_path / "c"), "--jobs", "0", url]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert main(["cache", "-q", "--cache-dir", str(tmp_path / "c"), url, url]) == 0  # each shard once
    assert capsys.readouterr().out.splitlines() == [
        f"fetched {url} ({len(shard()):,} bytes)", f"1 fetched ({len(shard()):,} bytes), 0 already cached, "
                                                   "0 local, 0 failed"]


def test_an_unusable_cache_directory_is_a_usage_error_before_any_fetch(tmp_path, http_server, capsys):
    url = http_server.put_file("/a.tar", shard())
    (tmp_path / "file").write_bytes(b"not a directory")
    assert main(["cache", "-q", "--cache-dir", str(tmp_path / "file"), url]) == 2
    assert capsys.readouterr().err == f"wdsmp cache: --cache-dir {tmp_path / 'file'} is not a directory\n"
    assert main(["cache", "-q", "--cache-dir", str(tmp_path / "file" / "sub"), url]) == 2
    assert capsys.readouterr().err == (f"wdsmp cache: --cache-dir {tmp_path / 'file' / 'sub'}: cannot make the "
                                       "directory: Not a directory\n")
    assert http_server.requests() == []
    assert main(["cache", "-q", "--cache-dir", str(tmp_path / "new" / "cache"), url]) == 0  # made, with parents
    assert (tmp_path / "new" / "cache").is_dir()


def test_a_damaged_cache_file_is_fetched_again_and_said_so(tmp_path, http_server, capsys):
    """A loader checks a cache file's first block only; `wdsmp cache` reads it whole, so that a copy
    cut short (or overwritten) is replaced now, not found by training later."""
    data = {name: shard(prefix=name) for name in ("a", "b", "c")}
    urls = {name: http_server.put_file(f"/{name}.tar", blob) for name, blob in data.items()}
    cache_dir = str(tmp_path / "cache")
    assert main(["cache", "-q", "--cache-dir", cache_dir, *urls.values()]) == 0
    capsys.readouterr()
    cache = FileCache(cache_dir)
    with open(cache.entry_path(urls["a"]), "r+b") as stream:
        stream.truncate(1024)  # the first member whole: its first block still says tar
    with open(cache.entry_path(urls["b"]), "wb") as stream:
        stream.write(b"\0" * 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["cache", "-q", "--jobs", "1", "--cache-dir", cache_dir, *urls.values()]) == 0
    assert [str(w.message) for w in caught] == []
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"fetched {urls['a']} ({len(data['a']):,} bytes); the cache file was damaged (truncated tar "
                        "archive: stream ended at a member boundary without the end-of-archive marker (shard "
                        f"'{urls['a']}', offset 1024)), so it was fetched again")
    assert lines[1].startswith(f"fetched {urls['b']} ({len(data['b']):,} bytes); the cache file was damaged (")
    assert lines[2:] == [f"cached  {urls['c']} ({len(data['c']):,} bytes)",
                         f"2 fetched ({len(data['a']) + len(data['b']):,} bytes), 1 already cached, 0 local, 0 failed"]
    assert [open(cache.entry_path(url), "rb").read() for url in urls.values()] == list(data.values())
    assert len(http_server.requests(method="GET")) == 5

    with open(cache.entry_path(urls["a"]), "r+b") as stream:
        stream.truncate(1024)
    http_server.put_file("/a.tar", b"<html>gone</html>" * 40)  # and the source went bad meanwhile
    assert main(["cache", "-q", "--json", "--cache-dir", cache_dir, urls["a"]]) == 1
    [result] = json.loads(capsys.readouterr().out)["shards"]
    assert result["status"] == "failed" and "not a tar archive" in result["error"]
    assert result["damaged"].startswith("truncated tar archive")
    assert not os.path.exists(cache.entry_path(urls["a"]))  # the damaged copy is gone either way
