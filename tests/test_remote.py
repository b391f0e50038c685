"""Remote URLs through gopen: http(s), s3, gs, ais, rewriting and secure mode, against real servers on 127.0.0.1."""

import base64
import io
import os
import socket
import sys
import time
from pathlib import Path

import pytest

import wdsmp as wds
from tests.servers import aws_environment
from wdsmp.errors import PipeError, ShardError
from wdsmp.gopen import Pipe, ais_object_url, gopen, gopen_curl, rewrite_url, set_options
from wdsmp.storage.remote import HTTPReader, RemoteOptions, refused_here

DATA = bytes(range(256)) * 4099  # ~1 MiB, not a multiple of any buffer size
BIG = bytes(range(251)) * 12289  # ~3 MiB: a fault after 1.5 MB comes after whole 1 MiB reads
FAST = dict(backoff=0.001, max_backoff=0.01)  # retry at once: the tests stay fast


def read_all(stream, size=1 << 16):
    """Read as the tar splitter does: readinto1 a reused buffer until it returns 0."""
    buf = memoryview(bytearray(size))
    out = bytearray()
    read = getattr(stream, "readinto1", stream.readinto)
    while n := read(buf):
        out += buf[:n]
    return bytes(out)


def ranges(server, path):
    return [r.range for r in server.requests(path, "GET")]


def make_samples(n=12):
    return [{"__key__": f"s{i:04d}", "txt": f"text {i}", "cls": str(i % 3), "bin": os.urandom(3000 + 97 * i)}
            for i in range(n)]


def read_samples(url):
    return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")}
            for s in wds.DataPipeline(wds.SimpleShardList(url), wds.tarfile_to_samples())]


# http: reading


def test_http_read(http_server):
    url = http_server.put_file("d/data.bin", DATA)
    with gopen(url) as stream:
        assert isinstance(stream, io.BufferedReader) and isinstance(stream.raw, HTTPReader)
        assert stream.read(10) == DATA[:10]
        assert read_all(stream) == DATA[10:]
        assert stream.raw.size == len(DATA) and stream.tell() == len(DATA)
        assert stream.read() == b""
    assert ranges(http_server, "d/data.bin") == [None]  # no Range on the first request


def test_http_read_empty_object(http_server):
    url = http_server.put_file("empty.bin", b"")
    with gopen(url) as stream:
        assert stream.read() == b""


@pytest.mark.parametrize("fault, kw", [
    ("status", dict(status=500, times=2)),
    ("status", dict(status=503, retry_after="0")),
    ("status", dict(status=429)),
    ("reset", dict(after=1_500_000, times=2)),
    ("short", dict(after=1_500_000)),
    ("stall", dict(after=1_500_000, seconds=3.0)),
])
def test_http_fault_then_resume(http_server, fault, kw):
    url = http_server.put_file("f.bin", BIG)
    http_server.fault("f.bin", fault, **kw)
    with gopen(url, retries=3, read_timeout=1.0, **FAST) as stream:
        assert read_all(stream) == BIG
    log = ranges(http_server, "f.bin")
    if fault == "status":
        assert log == [None] * len(log) and len(log) == kw.get("times", 1) + 1
    else:  # the body broke after some bytes: the next request asks for the rest
        assert log[0] is None and len(log) == kw.get("times", 1) + 1
        offsets = [int(r[len("bytes="):-1]) for r in log[1:]]
        assert all(0 < offset <= kw["after"] * (i + 1) for i, offset in enumerate(offsets))


def test_http_resume_from_server_ignoring_range(http_server):
    url = http_server.put_file("f.bin", BIG)
    http_server.fault("f.bin", "reset", after=1_500_000)
    http_server.fault("f.bin", "ignore_range")
    with gopen(url, retries=2, **FAST) as stream:
        assert read_all(stream) == BIG  # the 200 reply's first bytes are skipped
    assert ranges(http_server, "f.bin")[0] is None and ranges(http_server, "f.bin")[1].startswith("bytes=")


def test_http_redirect(http_server):
    http_server.put_file("real/f.bin", DATA)
    http_server.fault("alias/f.bin", "redirect", location="/real/f.bin")
    with gopen(http_server.url("alias/f.bin")) as stream:
        assert stream.read() == DATA
    assert [r.path for r in http_server.requests()] == ["/alias/f.bin", "/real/f.bin"]


def test_http_credentials_in_the_url_are_sent(http_server):
    # As curl (webdataset's opener) does: user:password@host is Basic authorization, %-decoded.
    http_server.put_file("private/f.bin", DATA)
    url = http_server.url("private/f.bin").replace("//", "//reader:p%40ss%20word@", 1)
    with gopen(url) as stream:
        assert stream.read() == DATA
    with gopen(url.replace("f.bin", "g.bin"), "wb") as stream:
        stream.write(b"uploaded")
    expected = "Basic " + base64.b64encode(b"reader:p@ss word").decode()
    assert [r.headers.get("Authorization") for r in http_server.requests()] == [expected, expected]
    given = {"Authorization": "Bearer token"}  # an Authorization header given stays
    with gopen(url, headers=given) as stream:
        assert stream.read() == DATA
    assert http_server.requests()[-1].headers.get("Authorization") == "Bearer token"


def test_messages_mask_the_password_of_a_url(http_server, tmp_path, capsys):
    url = http_server.url("private/missing.tar").replace("//", "//reader:hunter2@", 1)
    with pytest.raises(ShardError) as info:
        gopen(url).read()
    assert "reader:***@" in str(info.value) and "hunter2" not in str(info.value)
    assert info.value.url == url  # the attribute keeps what was given
    dataset = wds.WebDataset(url, cache_dir=str(tmp_path), verbose=True, shardshuffle=False)
    with pytest.raises(ShardError) as info:
        list(dataset)
    shown = str(info.value) + capsys.readouterr().err
    assert "reader:***@" in shown and "hunter2" not in shown
    with wds.FastLoader([(url, 4)], 2, num_workers=1, image_size=8) as loader:
        with pytest.raises(wds.WorkerError) as info:  # the worker's error, as the training loop meets it
            next(iter(loader))
    assert "reader:***@" in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.parametrize("given, shown", [
    ("https://u:p@ss@host/x.tar", "https://u:***@host/x.tar"),  # the user information ends at the last @
    ("https://TOKEN@host/x.tar", "https://***@host/x.tar"),  # a user name alone is often a token
    ("pipe:curl -s https://me:pw@host/a.tar | cat", "pipe:curl -s https://me:***@host/a.tar | cat"),
    ("http://host:8080/a@b.tar", "http://host:8080/a@b.tar"),  # an @ in the path is no credential
    ("s3://bucket/key", "s3://bucket/key"),
])
def test_what_messages_show_of_a_url(given, shown):
    from wdsmp._internal.redact import redacted

    assert redacted(given) == shown


def test_http_through_the_proxy_the_environment_names(http_server, http_proxy, monkeypatch):
    url = http_server.put_file("p/f.bin", DATA)
    monkeypatch.setenv("http_proxy", http_proxy.endpoint.removeprefix("http://"))  # no scheme: http, as in curl
    with gopen(url) as stream:
        assert stream.read() == DATA
    with gopen(url.replace("f.bin", "g.bin"), "wb") as stream:
        stream.write(b"uploaded")
    assert http_proxy.log == [url, url.replace("f.bin", "g.bin")]
    assert http_server.file("p/g.bin") == b"uploaded"
    assert http_proxy.authorizations == [None, None]
    monkeypatch.setenv("http_proxy", f"127.0.0.1:{_closed_port()}")  # nothing listens: said of the proxy
    with pytest.raises(ShardError, match=r"connection refused by 127\.0\.0\.1:\d+, .*start the proxy"):
        gopen(url, retries=5, backoff=30, max_backoff=30)  # not retried either
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")  # hosts that bypass it
    with gopen(url) as stream:
        assert stream.read() == DATA
    assert len(http_proxy.log) == 2


def test_http_through_a_socks_proxy_needs_pysocks(http_server, http_proxy, monkeypatch):
    url = http_server.put_file("p/f.bin", DATA)
    monkeypatch.setitem(sys.modules, "socks", None)  # PySocks absent
    monkeypatch.setenv("all_proxy", "socks5://127.0.0.1:1080")
    with pytest.raises(ImportError, match=r"the proxy socks5://127.0.0.1:1080 for .*f.bin is a SOCKS proxy, "
                                          r"which needs PySocks: pip install pysocks"):
        gopen(url)
    monkeypatch.setenv("http_proxy", "ftp://127.0.0.1:21")  # a scheme no proxy has
    with pytest.raises(ShardError, match=r"GET failed: .*ftp"):
        gopen(url)


def test_http_proxy_credentials_are_sent_to_the_proxy(http_server, http_proxy, monkeypatch):
    url = http_server.put_file("p/f.bin", DATA)
    monkeypatch.setenv("HTTP_PROXY", http_proxy.endpoint.replace("//", "//me:s%3Acret@"))
    with gopen(url) as stream:
        assert stream.read() == DATA
    assert http_proxy.log == [url]
    assert http_proxy.authorizations == ["Basic " + base64.b64encode(b"me:s:cret").decode()]
    assert http_server.requests()[0].headers.get("Authorization") is None  # for the proxy only


def test_http_not_found(http_server):
    url = http_server.url("missing.tar")
    with pytest.raises(ShardError, match=r"GET failed: HTTP 404 Not Found: no such file") as info:
        gopen(url, **FAST)
    assert info.value.url == url and url in str(info.value)
    assert len(http_server.requests()) == 1  # a 404 is not retried


@pytest.mark.parametrize("fault, kw, message", [
    ("status", dict(status=500), r"HTTP 500 .*injected failure; gave up after 2 retries"),
    ("status", dict(status=429), r"HTTP 429 .*gave up after 2 retries"),
    ("reset", dict(), r"GET failed: .*Connection (reset|broken).* at byte 0 of 1049344; gave up after 2 retries"),
    ("short", dict(), r"GET failed: .*IncompleteRead.*; gave up after 2 retries"),
    ("stall", dict(seconds=1.0), r"GET failed: .*[Rr]ead timed out.*gave up after 2 retries"),
])
def test_http_fault_forever(http_server, fault, kw, message):
    url = http_server.put_file("f.bin", DATA)
    http_server.fault("f.bin", fault, times=None, **kw)
    with pytest.raises(ShardError, match=message) as info:
        with gopen(url, retries=2, read_timeout=0.2, **FAST) as stream:
            read_all(stream)
    assert info.value.url == url
    assert len(http_server.requests("f.bin")) == 3


def test_http_trickle_fails_naming_the_url_and_the_rate(http_server):
    """One byte every 0.2 s resets every read timeout; the minimum rate ends it."""
    url = http_server.put_file("t.bin", DATA)
    http_server.fault("t.bin", "trickle", times=None, seconds=0.2)
    started = time.monotonic()
    with pytest.raises(ShardError, match=r"GET too slow: \d+ bytes in 1\.\d s of waiting \([\d.]+ bytes/s\), less "
                                         r"than min_rate=100 bytes/s over rate_window=1 s at byte \d+ of 1049344; "
                                         r"gave up after 1 retries") as info:
        with gopen(url, retries=1, read_timeout=2, min_rate=100, rate_window=1, **FAST) as stream:
            read_all(stream)
    assert info.value.url == url and url in str(info.value)
    assert len(http_server.requests("t.bin")) == 2 and time.monotonic() - started < 30


def test_http_trickle_that_ignores_range_fails_while_the_bytes_already_read_are_skipped(http_server):
    """A resume whose server answers 200 with the whole object, one byte every 0.2 s: the bytes
    read again to skip to the resume point are judged by the minimum rate too (they kept a shard
    "reading" for minutes, with no sample and no error)."""
    url = http_server.put_file("t.bin", DATA)
    http_server.fault("t.bin", "reset", after=600_000)
    http_server.fault("t.bin", "trickle", times=None, seconds=0.2, after=1000, whole=True)
    started = time.monotonic()
    with pytest.raises(ShardError, match=r"GET too slow: \d+ bytes in 1\.\d s of waiting .* less than min_rate=100 "
                                         r"bytes/s over rate_window=1 s at byte \d+ of 1049344; "
                                         r"gave up after 1 retries"):
        with gopen(url, retries=1, read_timeout=2, min_rate=100, rate_window=1, **FAST) as stream:
            read_all(stream)
    assert time.monotonic() - started < 30
    assert [r.range is None for r in http_server.requests("t.bin")][:2] == [True, False]  # a resume was asked


def test_http_slow_consumer_is_not_a_slow_server(http_server):
    """Only time spent waiting in reads counts: a reader that pauses between reads is served."""
    url = http_server.put_file("f.bin", DATA)
    with gopen(url, retries=0, min_rate=1000, rate_window=1, **FAST) as stream:
        chunks = []
        for _ in range(3):  # 300 bytes in 2.4 s, but the server sends all it is asked for at once
            chunks.append(stream.raw.read(100))
            time.sleep(1.2)
        chunks.append(read_all(stream))
    assert b"".join(chunks) == DATA and len(http_server.requests("f.bin")) == 1


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when the block ends: nobody listens there


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_http_connection_refused_here_is_not_retried(host):
    """Nothing listens on a port of this machine: retrying with backoff would only delay the error."""
    port = _closed_port()
    url = f"http://{host}:{port}/x.tar"
    with pytest.raises(ShardError, match=rf"GET failed: connection refused by {host}:{port}, on this machine: "
                                         r"nothing listens there \(not retried") as info:
        gopen(url, retries=5, backoff=30, max_backoff=30)  # a retry would wait 15 s or more
    assert info.value.url == url


def test_s3_connection_refused_here_is_not_retried(monkeypatch, tmp_path):
    port = _closed_port()
    aws_environment(monkeypatch, tmp_path, f"http://127.0.0.1:{port}")
    with pytest.raises(ShardError, match=rf"GET failed: connection refused by 127.0.0.1:{port}, on this machine: "
                                         r"nothing listens there \(not retried.*AWS_ENDPOINT_URL"):
        gopen("s3://bucket/x.tar", retries=5, backoff=30, max_backoff=30)


def test_refused_here_is_only_this_machine():
    refused = ConnectionRefusedError(111, "Connection refused")
    assert refused_here(refused, "127.0.0.2") and refused_here(refused, "[::1]") and refused_here(refused, "LOCALHOST")
    assert not refused_here(refused, "10.0.0.1") and not refused_here(refused, "example.com")
    assert not refused_here(ConnectionResetError(), "127.0.0.1")


def test_http_object_changed_while_reading(http_server):
    url = http_server.put_file("f.bin", DATA)
    http_server.fault("f.bin", "reset", after=50_000)
    stream = gopen(url, retries=2, **FAST)
    raw = stream.raw
    got = raw.readinto(bytearray(1000))  # small reads: the bytes before the reset are delivered
    assert got == 1000
    http_server.put_file("f.bin", DATA[:-10])  # replaced by a smaller object before the resume
    with pytest.raises(ShardError, match=rf"object changed while being read: size was {len(DATA)}, "
                                         rf"now {len(DATA) - 10}.*{url}"):
        read_all(raw, 1000)
    stream.close()


def test_remote_options_validated():
    with pytest.raises(ValueError, match="retries must be a number >= 0"):
        RemoteOptions(retries=-1)
    with pytest.raises(ValueError, match="must be > 0"):
        RemoteOptions(read_timeout=0)
    with pytest.raises(ValueError, match="rate_window must be > 0"):
        RemoteOptions(rate_window=0)
    with pytest.raises(ValueError, match="min_rate must be a number >= 0"):
        RemoteOptions(min_rate=-1)
    assert RemoteOptions.from_kw(dict(retries=1, ignore_status=[3])) == RemoteOptions(retries=1)


# http: writing


def test_http_write(http_server):
    url = http_server.url("up/out.bin")
    with gopen(url, "wb") as stream:
        stream.write(DATA[:1000])
        stream.write(memoryview(DATA)[1000:])
    assert http_server.file("up/out.bin") == DATA
    puts = http_server.requests("up/out.bin", "PUT")
    assert len(puts) == 1 and puts[0].size == len(DATA)


def test_http_write_retried(http_server):
    http_server.fault("out.bin", "status", method="PUT", status=503, times=2)
    with gopen(http_server.url("out.bin"), "wb", retries=2, **FAST) as stream:
        stream.write(DATA)
    assert http_server.file("out.bin") == DATA
    assert len(http_server.requests("out.bin", "PUT")) == 3


def test_http_write_refused(http_server):
    url = http_server.url("out.bin")
    http_server.fault("out.bin", "status", method="PUT", status=403)
    stream = gopen(url, "wb", **FAST)
    stream.write(b"data")
    with pytest.raises(ShardError, match=r"PUT failed: HTTP 403 Forbidden: injected failure") as info:
        stream.close()
    assert info.value.url == url
    stream.close()  # idempotent


def test_http_write_aborted_by_exception(http_server):
    with pytest.raises(RuntimeError, match="boom"):
        with gopen(http_server.url("out.bin"), "wb") as stream:
            stream.write(b"half a shard")
            raise RuntimeError("boom")
    assert http_server.requests() == []  # nothing half-written was uploaded


# shards over http and s3


def test_http_shard_pipeline(http_server, tmp_path):
    samples = make_samples()
    local = str(tmp_path / "local.tar")
    with wds.TarWriter(local) as sink:
        for sample in samples:
            sink.write(sample)
    url = http_server.put_file("shards/shard-000000.tar", Path(local).read_bytes())
    remote = read_samples(url)
    assert remote == read_samples(local)
    assert len(remote) == len(samples)


def test_http_shardwriter_roundtrip(http_server):
    samples = make_samples(10)
    pattern = http_server.url("out/shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=4) as sink:
        for sample in samples:
            sink.write(sample)
    assert sink.shards == [pattern % i for i in range(3)]
    back = read_samples(http_server.url("out/shard-{000000..000002}.tar"))
    assert [s["__key__"] for s in back] == [s["__key__"] for s in samples]
    assert [s["bin"] for s in back] == [s["bin"] for s in samples]


def test_s3_read_write(s3_server):
    s3_server.create_bucket("bucket")
    url = s3_server.put("bucket", "dir/data.bin", DATA)
    with gopen(url) as stream:
        assert read_all(stream) == DATA
    with gopen("s3://bucket/copy.bin", "wb") as stream:
        stream.write(DATA)
    assert s3_server.get("bucket", "copy.bin") == DATA


def test_s3_missing(s3_server):
    s3_server.create_bucket("bucket")
    with pytest.raises(ShardError, match=r"GET failed: HTTP 404 NoSuchKey") as info:
        gopen("s3://bucket/missing.tar", **FAST)
    assert info.value.url == "s3://bucket/missing.tar"
    with pytest.raises(ShardError, match=r"HTTP 404 NoSuchBucket.*s3://nobucket/x.tar"):
        with gopen("s3://nobucket/x.tar", "wb", **FAST) as stream:
            stream.write(b"x")


def test_s3_bad_url():
    with pytest.raises(ShardError, match="needs a bucket and a key"):
        gopen("s3://bucket-only")


@pytest.mark.parametrize("variable, value, message", [
    ("AWS_PROFILE", "no-such-profile", r"The config profile \(no-such-profile\) could not be found"),
    ("AWS_ENDPOINT_URL", "not a url", r"Invalid endpoint: not a url"),
])
@pytest.mark.parametrize("mode", ["rb", "wb"])
def test_s3_bad_aws_settings_name_the_url(s3_server, monkeypatch, variable, value, message, mode):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ShardError, match=rf"cannot make an S3 client from the AWS settings: {message}") as info:
        gopen("s3://bucket/x.tar", mode)
    assert info.value.url == "s3://bucket/x.tar"


def test_s3_shards_roundtrip(s3_server, tmp_path):
    s3_server.create_bucket("shards")
    samples = make_samples(9)
    with wds.ShardWriter("s3://shards/train-%04d.tar", maxcount=5) as sink:
        for sample in samples:
            sink.write(sample)
    local = str(tmp_path / "local.tar")
    with wds.TarWriter(local) as sink:
        for sample in samples[:5]:
            sink.write(sample)
    assert read_samples("s3://shards/train-0000.tar") == read_samples(local)
    back = read_samples("s3://shards/train-{0000..0001}.tar")
    assert [s["bin"] for s in back] == [s["bin"] for s in samples]


@pytest.fixture
def s3_on_http_server(http_server, monkeypatch, tmp_path):
    """S3 requests sent to the fault-injecting HTTP server (path style: /bucket/key)."""
    aws_environment(monkeypatch, tmp_path, http_server.endpoint)
    return http_server


def test_s3_resume_after_faults(s3_on_http_server):
    server = s3_on_http_server
    server.put_file("bucket/f.bin", BIG)
    server.fault("bucket/f.bin", "status", status=500)
    server.fault("bucket/f.bin", "reset", after=1_500_000)
    server.fault("bucket/f.bin", "short", after=1_200_000)
    with gopen("s3://bucket/f.bin", retries=2, **FAST) as stream:
        assert read_all(stream) == BIG
    log = ranges(server, "bucket/f.bin")
    assert log[:2] == [None, None] and len(log) == 4
    assert all(r.startswith("bytes=") for r in log[2:])


def test_s3_gives_up(s3_on_http_server):
    server = s3_on_http_server
    server.put_file("bucket/f.bin", DATA)
    server.fault("bucket/f.bin", "reset", after=1000, times=None)
    with pytest.raises(ShardError, match=r"GET failed.*gave up after 1 retries") as info:
        with gopen("s3://bucket/f.bin", retries=1, **FAST) as stream:
            read_all(stream)
    assert info.value.url == "s3://bucket/f.bin"


def test_s3_stall_once_then_resume(s3_on_http_server):
    server = s3_on_http_server
    server.put_file("bucket/f.bin", BIG)
    server.fault("bucket/f.bin", "stall", after=1_500_000, seconds=3.0)
    start = time.monotonic()
    with gopen("s3://bucket/f.bin", retries=2, read_timeout=0.5, **FAST) as stream:
        assert read_all(stream) == BIG
    assert time.monotonic() - start < 2.5  # the timeout ended the stall, not the server
    log = ranges(server, "bucket/f.bin")
    assert log[0] is None and len(log) == 2
    assert 0 < int(log[1][len("bytes="):-1]) <= 1_500_000  # the rest, from where the stall began


def test_s3_stall_forever_gives_up(s3_on_http_server):
    server = s3_on_http_server
    server.put_file("bucket/f.bin", DATA)
    server.fault("bucket/f.bin", "stall", after=1000, seconds=1.0, times=None)
    start = time.monotonic()
    with pytest.raises(ShardError, match=r"GET failed: .*[Rr]ead time(d )?out.*gave up after 2 retries") as info:
        with gopen("s3://bucket/f.bin", retries=2, read_timeout=0.2, **FAST) as stream:
            read_all(stream)
    assert time.monotonic() - start < 5
    assert info.value.url == "s3://bucket/f.bin"
    assert len(server.requests("bucket/f.bin", "GET")) == 3

def test_s3_without_boto3(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "nowhere-without-boto3")  # not a cached client
    with pytest.raises(ImportError, match="pip install boto3"):
        gopen("s3://bucket/key.tar")


# rewriting and AIStore


def test_rewrite_rules(monkeypatch):
    monkeypatch.setenv("GOPEN_REWRITE", "gs://bucket/=http://mirror/b/;gs://=http://other/")
    monkeypatch.setenv("WDS_REWRITE", "s3://([a-z]+)/=/data/\\1/;")
    assert rewrite_url("gs://bucket/a.tar") == "http://mirror/b/a.tar"  # the first match wins
    assert rewrite_url("gs://x/a.tar") == "http://other/x/a.tar"
    assert rewrite_url("s3://abc/a.tar") == "/data/abc/a.tar"
    assert rewrite_url("http://gs://") == "http://gs://"  # anchored at the start
    monkeypatch.setenv("WDS_REWRITE", "no-equals-sign")
    with pytest.raises(ValueError, match="WDS_REWRITE.*not regex=replacement"):
        rewrite_url("x")
    monkeypatch.setenv("WDS_REWRITE", "(=x")
    with pytest.raises(ValueError, match="WDS_REWRITE: bad rule"):
        rewrite_url("x")


def test_rewrite_to_local_and_http(http_server, tmp_path, monkeypatch):
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "a.bin").write_bytes(DATA)
    monkeypatch.setenv("WDS_REWRITE", f"gs://bucket/={tmp_path}/mirror/")
    with gopen("gs://bucket/a.bin") as stream:
        assert stream.read() == DATA
    http_server.put_file("m/b.bin", DATA)
    monkeypatch.setenv("GOPEN_REWRITE", f"gs://bucket/={http_server.endpoint}/m/")
    with gopen("gs://bucket/b.bin") as stream:
        assert stream.read() == DATA


def test_rewrite_errors_name_both_urls(http_server, tmp_path, monkeypatch):
    monkeypatch.setenv("GOPEN_REWRITE", f"gs://=http://127.0.0.1:{http_server.port}/m/")
    with pytest.raises(ShardError, match=r"HTTP 404.*URL rewritten from 'gs://b/missing.tar'.*"
                                         r"http://127.0.0.1:\d+/m/b/missing.tar"):
        gopen("gs://b/missing.tar")
    http_server.put_file("m/b/f.bin", DATA)
    http_server.fault("m/b/f.bin", "reset", times=None)
    with pytest.raises(ShardError, match=r"gave up.*/m/b/f.bin \(from gs://b/f.bin\)"):
        with gopen("gs://b/f.bin", retries=1, **FAST) as stream:
            read_all(stream)
    monkeypatch.setenv("GOPEN_REWRITE", f"gs://=pipe:cat {tmp_path}/nothing/")
    with pytest.raises(PipeError, match=r"cat .*/nothing/b/x.tar \(for gs://b/x.tar\)"):
        with gopen("gs://b/x.tar") as stream:
            stream.read()


def test_ais_http_routing(http_server, monkeypatch):
    http_server.put_file("v1/objects/bucket/dir/a b.tar", DATA)
    monkeypatch.setenv("USE_AIS_FOR", "gs:s3")
    monkeypatch.setenv("AIS_ENDPOINT", http_server.endpoint + "/")
    with gopen("gs://bucket/dir/a b.tar") as stream:
        assert stream.read() == DATA
    assert [r.path for r in http_server.requests()] == ["/v1/objects/bucket/dir/a%20b.tar?provider=gcp"]
    with pytest.raises(ShardError, match=r"HTTP 404.*/v1/objects/b/x.tar\?provider=aws \(from s3://b/x.tar\)"):
        gopen("s3://b/x.tar", **FAST)


def test_ais_gateway_redirects_to_target(http_server, monkeypatch):
    monkeypatch.setenv("AIS_ENDPOINT", http_server.endpoint)
    obj = "v1/objects/bucket/a.tar"
    http_server.fault(obj, "redirect", method="PUT", location="/target/a.tar")
    with gopen("ais://bucket/a.tar", "wb") as stream:  # ais:// goes to AIS_ENDPOINT without USE_AIS_FOR
        stream.write(DATA)
    assert http_server.file("target/a.tar") == DATA  # the body was sent again to the target
    http_server.fault(obj, "redirect", location="/target/a.tar")
    with gopen("ais://bucket/a.tar") as stream:
        assert stream.read() == DATA
    assert [(r.method, r.path) for r in http_server.requests()] == [
        ("PUT", "/v1/objects/bucket/a.tar?provider=ais"), ("PUT", "/target/a.tar"),
        ("GET", "/v1/objects/bucket/a.tar?provider=ais"), ("GET", "/target/a.tar")]


def test_ais_object_url():
    assert ais_object_url("http://gw:51080", "gs://b/x/y z.tar") == "http://gw:51080/v1/objects/b/x/y%20z.tar?provider=gcp"
    with pytest.raises(ShardError, match="needs a bucket and an object"):
        ais_object_url("http://gw", "ais://bucket")


# command-line tools: gs and ais


def fake_tool(tmp_path, monkeypatch, name, script):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    return store


GSUTIL = """
case "$1" in
  cat) exec cat "{store}/${{2#gs://}}" ;;
  cp) [ "$2" = "-" ] || exit 64; exec cat > "{store}/${{3#gs://}}" ;;
esac
exit 64
"""


def test_gs_with_gsutil(tmp_path, monkeypatch):
    store = tmp_path / "store"
    fake_tool(tmp_path, monkeypatch, "gsutil", GSUTIL.format(store=store))
    (store / "b").mkdir()
    with gopen("gs://b/out.tar", "wb") as stream:
        assert isinstance(stream, Pipe) and stream.command == "gsutil cp - gs://b/out.tar"
        stream.write(DATA)
    assert (store / "b" / "out.tar").read_bytes() == DATA
    with gopen("gs://b/out.tar") as stream:
        assert read_all(stream) == DATA
    with pytest.raises(PipeError, match=r"gsutil cat gs://b/missing.tar.*status 1.*missing.tar"):
        with gopen("gs://b/missing.tar") as stream:
            stream.read()


def test_gs_without_gsutil(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ShardError, match=r"'gsutil' or 'gcloud' not found on PATH.*gs://b/x.tar"):
        gopen("gs://b/x.tar")


def test_ais_with_cli(tmp_path, monkeypatch):
    store = fake_tool(tmp_path, monkeypatch, "ais", f"""
[ "$1" = get ] && [ "$3" = "-" ] && exec cat "{tmp_path}/store/$(echo "$2" | tr / _)"
exit 64
""")
    monkeypatch.delenv("AIS_ENDPOINT", raising=False)
    monkeypatch.setenv("USE_AIS_FOR", "gs")
    (store / "gs:__b_x.tar").write_bytes(DATA)
    with gopen("gs://b/x.tar") as stream:  # USE_AIS_FOR without AIS_ENDPOINT: the ais command
        assert stream.command == "ais get gs://b/x.tar -"
        assert read_all(stream) == DATA


def test_pipe_argv_is_not_a_shell_line(tmp_path):
    path = tmp_path / "a b;$(touch pwned).bin"
    path.write_bytes(DATA)
    with Pipe(["cat", str(path)]) as stream:
        assert read_all(stream) == DATA
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    with pytest.raises(ShardError, match="cannot start command.*no-such-tool-xyz"):
        Pipe(["no-such-tool-xyz"])


# secure mode


@pytest.mark.parametrize("url, what", [
    ("local.tar", "local files"),
    ("file:///etc/passwd", "local files"),
    ("pipe:cat /etc/passwd", "pipe: URLs"),
    ("-", "standard input and output"),
])
def test_secure_mode_refusals(url, what, monkeypatch):
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(ShardError, match=rf"{what} .*refused in secure mode \(set by WDS_SECURE=1\)"):
        gopen(url)
    monkeypatch.delenv("WDS_SECURE")
    with pytest.raises(ShardError, match=r"refused in secure mode \(set by secure=True\)"):
        gopen(url, "wb", secure=True)


def test_secure_mode_allows_remote_and_checks_rewrites(http_server, monkeypatch):
    url = http_server.put_file("f.bin", DATA)
    monkeypatch.setenv("WDS_SECURE", "1")
    with gopen(url) as stream:
        assert stream.read() == DATA
    monkeypatch.setenv("WDS_REWRITE", "gs://=/data/")
    with pytest.raises(ShardError, match=r"local files are refused.*rewritten from 'gs://b/x.tar'"):
        gopen("gs://b/x.tar")
    with pytest.raises(ShardError, match="WDS_SECURE=1"):
        gopen("/etc/passwd", secure=False)  # an argument cannot turn the variable off


def test_s3_upload_retried(s3_on_http_server):
    server = s3_on_http_server
    server.fault("bucket/up.bin", "status", method="PUT", status=503)
    with gopen("s3://bucket/up.bin", "wb", retries=1, **FAST) as stream:
        stream.write(DATA)
    assert server.file("bucket/up.bin") == DATA
    assert len(server.requests("bucket/up.bin", "PUT")) == 2


def test_s3_multipart_upload(s3_server):
    s3_server.create_bucket("bucket")
    data = os.urandom(1 << 20) * 9  # above boto3's 8 MiB multipart threshold
    with gopen("s3://bucket/big.bin", "wb") as stream:
        for start in range(0, len(data), 1 << 20):
            stream.write(data[start:start + (1 << 20)])
    assert s3_server.get("bucket", "big.bin") == data
    with gopen("s3://bucket/big.bin") as stream:
        assert read_all(stream, 1 << 20) == data


def test_http_writer_dropped_unclosed_uploads_nothing(http_server):
    stream = gopen(http_server.url("out.bin"), "wb")
    stream.write(b"abandoned")
    del stream
    assert http_server.requests() == []


def test_http_redirect_loop(http_server):
    http_server.fault("loop", "redirect", times=None, location="/loop")
    with pytest.raises(ShardError, match=r"more than 10 redirects"):
        gopen(http_server.url("loop"))


def test_gopen_verbose(http_server, monkeypatch, capsys):
    http_server.put_file("m/x.bin", b"x")
    monkeypatch.setenv("GOPEN_VERBOSE", "1")
    monkeypatch.setenv("GOPEN_REWRITE", f"gs://={http_server.endpoint}/m/")
    with gopen("gs://x.bin") as stream:
        assert stream.read() == b"x"
    assert f"# gopen 'gs://x.bin' -> '{http_server.endpoint}/m/x.bin'" in capsys.readouterr().err
    http_server.put_file("v1/objects/bucket/y.bin", b"y")
    monkeypatch.delenv("GOPEN_REWRITE")
    monkeypatch.setenv("USE_AIS_FOR", "gs")
    monkeypatch.setenv("AIS_ENDPOINT", http_server.endpoint)
    with gopen("gs://bucket/y.bin") as stream:
        assert stream.read() == b"y"
    assert "# gopen 'gs://bucket/y.bin' through AIStore (USE_AIS_FOR)" in capsys.readouterr().err


# -- webdataset's other openers


def test_gopen_curl_reads_and_fails_loudly(http_server):
    url = http_server.put_file("c.bin", bytes(range(256)) * 100)
    with gopen_curl(url) as stream:
        assert stream.read() == bytes(range(256)) * 100
    with pytest.raises(PipeError, match="status 22"):
        with gopen_curl(http_server.url("missing.bin")) as stream:
            stream.read()


def test_set_options_reaches_pipes_only(tmp_path):
    stream = gopen("pipe:exit 3")
    assert set_options(stream, ignore_status=[3], timeout=5.0)
    assert stream.read() == b""  # status 3 now counts as success
    stream.close()
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with gopen(str(path)) as plain:
        assert set_options(plain, timeout=1.0) is False


def test_read_only_schemes_refuse_writing():
    with pytest.raises(ValueError, match="read-only"):
        gopen("htgs://bucket/shard.tar", "wb")


def test_hf_without_huggingface_hub_names_the_package():
    try:
        import huggingface_hub  # noqa: F401
        pytest.skip("huggingface_hub is installed")
    except ImportError:
        pass
    with pytest.raises(ShardError, match="pip install huggingface_hub"):
        gopen("hf://datasets/org/name/shard.tar")
