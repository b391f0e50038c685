"""``wdsmp cat`` and ``wdsmp split``: every sample copied byte for byte, shuffles repeatable."""

import io
import json
import os
import random
import subprocess
import sys
import tarfile

import pytest

import wdsmp as wds
from wdsmp.cli import main


def read_tar(source):
    """``[(key, {extension: bytes})]`` of a tar (path or bytes), grouped here by hand, not by wdsmp;
    a key that comes back after its sample ended fails the test."""
    archive = tarfile.open(fileobj=io.BytesIO(source)) if isinstance(source, bytes) else tarfile.open(source)
    samples = []
    with archive:
        for member in archive:
            slash = member.name.rfind("/") + 1
            key, ext = member.name[:member.name.index(".", slash)], member.name[member.name.index(".", slash) + 1:]
            if not samples or samples[-1][0] != key:
                assert key not in [k for k, _ in samples], f"{key} is not contiguous"
                samples.append((key, {}))
            samples[-1][1][ext] = archive.extractfile(member).read()
    return samples


def write_shards(directory, samples, per_shard, name="in"):
    """Shards of ``per_shard`` samples written with wdsmp's writer; their paths."""
    paths = []
    for start in range(0, len(samples), per_shard):
        paths.append(directory / f"{name}-{len(paths):02d}.tar")
        with wds.TarWriter(str(paths[-1]), encoder=False, keep_meta=True) as writer:
            for key, fields in samples[start:start + per_shard]:
                writer.write({"__key__": key, **fields})
    return paths


def make_samples(n, seed=0):
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        fields = {"jpg": rng.randbytes(rng.randrange(0, 3000)), "cls": str(i % 7).encode()}
        if i % 3 == 0:
            fields["Seg.PNG"] = rng.randbytes(100)
        if i % 4 == 0:
            fields["_meta"] = b"kept"
        samples.append((f"dir{i % 3}/sample{i:04d}", fields))
    return samples


def test_create_cat_split_round_trip(tmp_path, wdsmp_run):
    """Through stdout and stdin, shuffled: every sample arrives whole, byte for byte."""
    tree = {f"d{i % 3}/s{i:03d}": {"jpg": random.Random(i).randbytes(i * 97), "Seg.PNG": b"m" * i, "json": b"{}"}
            for i in range(20)}
    tree["d0/" + "long" * 40] = {"txt": b""}  # a pax header for the long name; an empty field
    for key, fields in tree.items():
        for ext, data in fields.items():
            (tmp_path / "src" / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "src" / f"{key}.{ext}").write_bytes(data)

    created = wdsmp_run("create", "-q", "--maxcount", "6", "-o", "src-%06d.tar", "src")
    assert created.returncode == 0, created.stderr
    cat = wdsmp_run("cat", "-q", "--shuffle", "--seed", "7", "-o", "-", "src-{000000..000003}.tar", text=False)
    assert cat.returncode == 0, cat.stderr
    split = wdsmp_run("split", "--json", "--maxcount", "8", "-o", "out-%06d.tar", "-", input=cat.stdout, text=False)
    assert split.returncode == 0, split.stderr

    shuffled = read_tar(cat.stdout)
    assert [key for key, _ in shuffled] != sorted(tree)
    assert dict(shuffled) == tree
    outputs = json.loads(split.stdout.decode())["outputs"]
    assert [o["samples"] for o in outputs] == [8, 8, 5]
    got = []
    for output in outputs:
        listed = subprocess.run(["tar", "tf", tmp_path / output["url"]], capture_output=True, text=True, check=True)
        got += read_tar(tmp_path / output["url"])
        assert listed.stdout.split() == [f"{key}.{ext}" for key, fields in read_tar(tmp_path / output["url"])
                                         for ext in fields]
    assert got == shuffled
    # The same command in-process gives the same bytes: the shuffle depends on the seed only.
    assert main(["cat", "-q", "--shuffle", "--seed", "7", "-o", str(tmp_path / "again.tar"),
                 *sorted(str(p) for p in tmp_path.glob("src-*.tar"))]) == 0
    assert (tmp_path / "again.tar").read_bytes() == cat.stdout


def test_missing_input_end_to_end(tmp_path, wdsmp_run):
    result = wdsmp_run("cat", "-o", "out.tar", "missing.tar")
    assert result.returncode == 2
    assert "no such file: missing.tar" in result.stderr
    assert not (tmp_path / "out.tar").exists()


def test_cat_keeps_order_case_and_metadata_fields(tmp_path):
    samples = make_samples(10)
    paths = write_shards(tmp_path, samples, 4)
    with wds.TarWriter(str(tmp_path / "in.tar.gz"), encoder=False) as writer:  # gzip inputs too
        writer.write({"__key__": "zz", "TXT": b"upper"})
    assert main(["cat", "-q", "-o", str(tmp_path / "all.tar"), *map(str, paths), str(tmp_path / "in.tar.gz")]) == 0
    assert read_tar(tmp_path / "all.tar") == samples + [("zz", {"TXT": b"upper"})]


def test_shuffle_is_seeded(tmp_path):
    samples = make_samples(40)
    paths = [str(p) for p in write_shards(tmp_path, samples, 8)]

    def shuffled(name, *options):
        assert main(["cat", "-q", "--shuffle", *options, "-o", str(tmp_path / name), *paths]) == 0
        return read_tar(tmp_path / name)

    first, again, other = shuffled("1.tar"), shuffled("2.tar"), shuffled("3.tar", "--seed", "1")
    assert first == again != other
    assert sorted(first) == sorted(other) == sorted(samples)
    # With a buffer of one, only the shard order changes.
    blocks = shuffled("4.tar", "--seed", "3", "--buffer", "1")
    starts = [blocks[i] for i in range(0, 40, 8)]
    assert blocks == [s for start in starts for s in samples[samples.index(start):samples.index(start) + 8]]
    assert starts != [samples[i] for i in range(0, 40, 8)]


def test_split_limits(tmp_path, capsys):
    paths = [str(p) for p in write_shards(tmp_path, make_samples(10), 10)]
    assert main(["split", "-q", "--json", "--maxcount", "3", "-o", str(tmp_path / "c-%d.tar"), *paths]) == 0
    assert [o["samples"] for o in json.loads(capsys.readouterr().out)["outputs"]] == [3, 3, 3, 1]
    sized = [("k%d" % i, {"bin": bytes(1000)}) for i in range(5)]
    paths = [str(p) for p in write_shards(tmp_path, sized, 5, name="sized")]
    assert main(["split", "-q", "--json", "--maxsize", "4.5k", "-o", str(tmp_path / "s-%d.tar"), *paths]) == 0
    assert [o["samples"] for o in json.loads(capsys.readouterr().out)["outputs"]] == [2, 2, 1]


def test_members_outside_samples_are_counted(tmp_path, capsys):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("README", "a.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    (tmp_path / "in.tar").write_bytes(buffer.getvalue())
    assert main(["cat", "-q", "--json", "-o", str(tmp_path / "out.tar"), str(tmp_path / "in.tar")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["skipped_members"] == 1
    assert "warning: 1 members outside any sample (no extension) were not copied" in err
    assert read_tar(tmp_path / "out.tar") == [("a", {"txt": b"x"})]


@pytest.mark.parametrize("command, damage, message", [
    ("cat", "truncate", "truncated tar archive"),
    ("split", "checksum", "bad tar header checksum"),
    ("cat", "duplicate", "key 'dir0/sample0000' occurs twice in output"),
])
def test_failures_leave_no_output(tmp_path, capsys, command, damage, message):
    paths = write_shards(tmp_path, make_samples(12), 4)
    data = paths[2].read_bytes()
    if damage == "truncate":
        paths[2].write_bytes(data[:len(data) // 2])
    elif damage == "checksum":
        with tarfile.open(paths[2]) as archive:
            offset = archive.getmembers()[4].offset
        paths[2].write_bytes(data[:offset + 5] + b"X" + data[offset + 6:])
    else:
        paths[2].write_bytes(paths[0].read_bytes())
    out = "out-%d.tar" if command == "split" else "out.tar"
    argv = [command, "-q", "-o", str(tmp_path / out), *map(str, paths)]
    assert main(argv + (["--maxcount", "3"] if command == "split" else [])) == 1
    err = capsys.readouterr().err
    assert message in err
    if damage != "duplicate":
        assert repr(str(paths[2])) in err  # the message names the damaged shard
    assert not list(tmp_path.glob("out*"))


@pytest.mark.parametrize("argv, status, message", [
    (["cat", "-o", "x-%03d.tar", "in-00.tar"], 2, "cat writes one archive"),
    (["split", "-o", "x.tar", "in-00.tar"], 2, "split writes a series"),
    (["cat", "-o", "x.tar", "--seed", "1", "in-00.tar"], 2, "--seed, --buffer and --memory go with --shuffle"),
    (["cat", "-o", "in-00.tar", "--force", "in-00.tar"], 2, "is an input; it cannot be an output too"),
    (["split", "-o", "in-%02d.tar", "--force", "in-00.tar"], 2, "is an input; it cannot be an output too"),
    (["cat", "-o", "x.tar", "missing-*.tar"], 2, "shard pattern 'missing-*.tar' matches no files"),
    (["cat", "-o", "x.tar.bz2", "in-00.tar"], 2, "x.tar.bz2: wdsmp reads plain and gzip tars only"),
    (["split", "-o", "x-%d.tar.xz", "in-00.tar"], 2, "x-0.tar.xz: wdsmp reads plain and gzip tars only"),
])
def test_usage_errors(tmp_path, capsys, monkeypatch, argv, status, message):
    monkeypatch.chdir(tmp_path)
    before = write_shards(tmp_path, make_samples(3), 3)[0].read_bytes()
    assert main(argv) == status
    assert message in capsys.readouterr().err
    assert (tmp_path / "in-00.tar").read_bytes() == before
    assert not list(tmp_path.glob("x*"))


def test_keys_are_checked_per_output_shard(tmp_path, capsys, monkeypatch):
    """The same keys in two inputs are fine when they land in different shards."""
    monkeypatch.chdir(tmp_path)
    samples = make_samples(3)
    first, second = write_shards(tmp_path, samples, 3, name="a") + write_shards(tmp_path, samples, 3, name="b")
    argv = ["split", "-q", "--shuffle", "--seed", "0", "-o", "dupk/x-%02d.tar", str(first), str(second)]
    assert main(argv + ["--maxcount", "1"]) == 0
    assert sorted(os.listdir("dupk")) == [f"x-{i:02d}.tar" for i in range(6)]
    assert main(argv + ["--maxcount", "6", "-o", "one/x-%02d.tar"]) == 1
    assert "occurs twice in output 'one/x-00.tar'" in capsys.readouterr().err
    assert os.listdir("one") == []


def test_force_replaces_the_whole_series(tmp_path, capsys, monkeypatch):
    """An existing series is refused, whichever of its shards exist; --force replaces it and
    removes the shards of the earlier run that this one did not write, never an input's."""
    monkeypatch.chdir(tmp_path)
    shard = str(write_shards(tmp_path, make_samples(4), 4)[0])
    assert main(["split", "-q", "--maxcount", "1", "-o", "c-%d.tar", shard]) == 0
    (tmp_path / "c-extra.tar").write_bytes(b"not in the series")
    os.remove("c-0.tar")
    assert main(["split", "-q", "--maxcount", "2", "-o", "c-%d.tar", shard]) == 2
    assert "c-1.tar exists; remove it or pass --force" in capsys.readouterr().err
    assert main(["split", "-q", "--force", "--maxcount", "2", "-o", "c-%d.tar", shard]) == 0
    assert "removed 2 shards left by an earlier run of the series: c-2.tar ... c-3.tar" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.glob("c-*.tar")) == ["c-0.tar", "c-1.tar", "c-extra.tar"]
    assert [key for path in ("c-0.tar", "c-1.tar") for key, _ in read_tar(path)] == [
        key for key, _ in read_tar(shard)]
    os.rename(shard, "c-5.tar")
    assert main(["split", "-q", "--force", "-o", "c-%d.tar", "c-5.tar"]) == 2
    assert "c-5.tar is an input; it cannot be an output too" in capsys.readouterr().err


def test_cat_to_a_device(tmp_path):
    """What cannot be renamed over is written in place."""
    paths = write_shards(tmp_path, make_samples(3), 3)
    assert main(["cat", "-q", "--force", "-o", os.devnull, str(paths[0])]) == 0


_PEAK = """import re, sys
from wdsmp.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as status:  # this process's own peak (ru_maxrss counts the parent's at fork)
    print(int(re.search(r"VmHWM:\\s*(\\d+) kB", status.read()).group(1)) * 1024)
sys.exit(code)
"""


def _peak_bytes(tmp_path, *args):
    """Run ``wdsmp args`` in a fresh interpreter; the process's peak resident memory in bytes."""
    result = subprocess.run([sys.executable, "-c", _PEAK, *map(str, args)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])


def test_split_shuffle_in_bounded_memory(tmp_path):
    """~80 MB written in label order, reshuffled holding 16 MB: every member byte for byte, the label runs
    broken up, and the process's memory grows by about the budget, not by the data."""
    rng = random.Random(3)
    samples = [(f"s{i:05d}", {"bin": rng.randbytes(100_000), "cls": str(i // 40).encode()}) for i in range(800)]
    inputs = write_shards(tmp_path, samples, 100)
    assert sum(os.path.getsize(p) for p in inputs) > 80e6
    tiny = write_shards(tmp_path, samples[:3], 3, name="tiny")
    baseline = _peak_bytes(tmp_path, "cat", "-q", "--shuffle", "-o", "base.tar", *tiny)
    peak = _peak_bytes(tmp_path, "split", "-q", "--shuffle", "--memory", "16M", "--seed", "4", "-o", "out-%02d.tar",
                       "--maxcount", "200", *inputs)
    assert peak - baseline < 2 * 16e6, (peak, baseline)
    out = sorted(tmp_path.glob("out-*.tar"))
    assert len(out) == 4 and not list(tmp_path.glob(".wdsmp-shuffle-*"))  # temporaries gone
    shuffled = [sample for path in out for sample in read_tar(str(path))]
    assert sorted(shuffled) == sorted(samples)  # every member, byte for byte
    labels = [fields["cls"] for _, fields in shuffled]
    runs = 1 + sum(a != b for a, b in zip(labels, labels[1:]))
    assert runs > 0.9 * len(labels)  # in label order there were 20 runs; a uniform order has ~780
    whole = _peak_bytes(tmp_path, "cat", "-q", "-f", "--shuffle", "--buffer", "1000", "-o", "all.tar", *inputs)
    assert whole - baseline > 70e6  # the in-memory shuffle holds everything: the measure can fail


def test_memory_goes_with_shuffle_and_not_with_buffer(tmp_path, wdsmp_run):
    inputs = write_shards(tmp_path, make_samples(5), 5)
    result = wdsmp_run("cat", "--memory", "1M", "-o", "x.tar", *inputs)
    assert result.returncode != 0 and "--memory go with --shuffle" in result.stderr
    result = wdsmp_run("cat", "--shuffle", "--memory", "1M", "--buffer", "9", "-o", "x.tar", *inputs)
    assert result.returncode != 0 and "takes no --buffer" in result.stderr


def test_memory_shuffle_of_shards_that_repeat_keys(tmp_path):
    """Shards that each number their samples from 0 (the same keys in every one): the temporary
    shards hold them apart, and every sample comes out with its own key and bytes."""
    samples = make_samples(12)
    inputs = [write_shards(tmp_path, [(f"{i:06d}", fields) for i, (_, fields) in enumerate(samples[s:s + 4])], 4,
                           name=f"part{s}")[0] for s in (0, 4, 8)]
    assert main(["split", "-q", "--shuffle", "--memory", "2000", "--maxcount", "1", "-o", str(tmp_path / "o-%03d.tar"),
                 *map(str, inputs)]) == 0
    out = [sample for path in sorted(tmp_path.glob("o-*.tar")) for sample in read_tar(str(path))]
    expected = [(f"{i:06d}", fields) for s in (0, 4, 8) for i, (_, fields) in enumerate(samples[s:s + 4])]
    def canonical(items):
        return sorted((key, sorted(fields.items())) for key, fields in items)

    assert canonical(out) == canonical(expected)
    assert not list(tmp_path.glob(".wdsmp-shuffle-*"))
