"""``wdsmp convert``: a function over every sample, one output shard per input, on a local
process pool or a Dask cluster; complete outputs only, resumable, failures named."""

import contextlib
import json
import os
import signal
import sys
import time
from concurrent.futures import Future

import psutil
import pytest

import wdsmp
from wdsmp.cli import convert, main
from wdsmp.cli.convert import MapError, convert_shard

# The map function, written into tmp_path as a module: the workers import it by name.
MAPS = '''
import os
import sys


def relabel(sample):
    """Drops class 0, writes class 1 twice (a copy under a new key), upper-cases the text;
    fails on the key named by $FAIL_ON_KEY, calls sys.exit on $EXIT_ON_KEY's, dies on $DIE_ON_KEY's."""
    if sample["__key__"] == os.environ.get("FAIL_ON_KEY"):
        raise ValueError("cannot convert this one")
    if sample["__key__"] == os.environ.get("EXIT_ON_KEY"):
        sys.exit("leaving")
    if sample["__key__"] == os.environ.get("DIE_ON_KEY"):
        os._exit(9)
    label = int(sample["cls"])
    if label == 0:
        return None
    out = {"__key__": sample["__key__"], "txt": sample["txt"].upper(), "cls": label}
    return [out, dict(out, __key__=sample["__key__"] + "_copy")] if label == 1 else out


def stall(sample):
    """Never returns in time: a worker is busy with it when the run is killed."""
    import time

    time.sleep(600)
'''

SAMPLES = 7  # per shard: classes 0, 1, 2, 0, 1, 2, 0 -> 3 dropped, 2 doubled, 2 kept: 6 out


@pytest.fixture
def shards(tmp_path):
    """Three input shards in tmp_path/in, and the map module in tmp_path."""
    (tmp_path / "maps.py").write_text(MAPS)
    (tmp_path / "in").mkdir()
    for name in "abc":
        with wdsmp.TarWriter(str(tmp_path / "in" / f"{name}.tar")) as sink:
            for i in range(SAMPLES):
                sink.write({"__key__": f"{name}{i}", "txt": f"sample {i} of {name}", "cls": i % 3})
    return tmp_path


def _read(path):
    return [(s["__key__"], s["txt"], s["cls"]) for s in wdsmp.tarfile_samples([str(path)])]


def _check_relabelled(outdir):
    assert sorted(os.listdir(outdir)) == ["a.tar", "b.tar", "c.tar"]  # nothing partial left
    assert _read(outdir / "b.tar") == [
        ("b1", b"SAMPLE 1 OF B", b"1"), ("b1_copy", b"SAMPLE 1 OF B", b"1"), ("b2", b"SAMPLE 2 OF B", b"2"),
        ("b4", b"SAMPLE 4 OF B", b"1"), ("b4_copy", b"SAMPLE 4 OF B", b"1"), ("b5", b"SAMPLE 5 OF B", b"2")]


@pytest.mark.processes
def test_local_pool_failure_named_then_a_rerun_resumes(shards, wdsmp_run):
    """One scenario, for time: a failing sample (an exception, or sys.exit) fails its shard alone
    and is named; once fixed, a rerun converts those shards only, replacing a partial file a
    killed run left."""
    command = ["convert", "--map", "maps:relabel", "-o", "out", "--workers", "2", "in/a.tar", "in/{b,c}.tar"]
    result = wdsmp_run(*command, env={"FAIL_ON_KEY": "b3", "EXIT_ON_KEY": "c2"})
    assert result.returncode == 1
    assert f"--map maps:relabel raised ValueError: cannot convert this one (shard '{shards}/in/b.tar', " \
           "sample 'b3')" in result.stderr
    assert 'maps.py", line 10, in relabel\n    raise ValueError' in result.stderr  # the function's traceback
    assert f"--map maps:relabel raised SystemExit: leaving (shard '{shards}/in/c.tar', sample 'c2')" in result.stderr
    assert "1 shard converted, 0 skipped (already complete), 2 failed; 7 samples in, 6 out" in result.stdout
    assert sorted(os.listdir(shards / "out")) == ["a.tar"]  # the others' outputs stay, b's and c's are gone
    before = os.stat(shards / "out" / "a.tar")

    (shards / "out" / ".partial-b.tar").write_bytes(b"left by a killed run")
    result = wdsmp_run(*command, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in ("shards", "done", "skipped", "failed", "samples_in", "samples_out")} == {
        "shards": 3, "done": 2, "skipped": 1, "failed": 0, "samples_in": 2 * SAMPLES, "samples_out": 12}
    _check_relabelled(shards / "out")
    assert os.stat(shards / "out" / "a.tar").st_mtime_ns == before.st_mtime_ns  # skipped, not rewritten


@pytest.mark.processes
def test_a_worker_that_dies_fails_its_shard_and_starts_nothing_more(shards, wdsmp_run):
    result = wdsmp_run("convert", "--map", "maps:relabel", "-o", "out", "--workers", "1", "--json",
                       "in/{a,b,c}.tar", env={"DIE_ON_KEY": "b2"})
    assert result.returncode == 1
    assert f"a worker process died (killed, out of memory, a crash) while shard '{shards}/in/b.tar' was " \
        "converting" in result.stderr
    summary = json.loads(result.stdout)
    assert (summary["done"], summary["failed"], summary["not_started"]) == (1, 1, 1)
    assert sorted(os.listdir(shards / "out")) == [".partial-b.tar", "a.tar"]  # a rerun overwrites the partial


@pytest.mark.processes
def test_killing_the_command_leaves_no_process_behind(shards, wdsmp_start):
    """SIGKILL to the command (nothing runs a clean-up): its pool workers exit, busy or idle,
    and then the fork server and the resource tracker, which they kept open."""
    command = wdsmp_start("convert", "--map", "maps:stall", "-o", "out", "--workers", "2", "in/{a,b,c}.tar")
    helpers = []
    try:
        deadline = time.monotonic() + 60
        while not ((shards / "out").is_dir() and len(os.listdir(shards / "out")) == 2):
            assert time.monotonic() < deadline and command.poll() is None, "the workers did not start"
            time.sleep(0.1)  # each worker has opened its shard's partial output: both are busy
        helpers = psutil.Process(command.pid).children(recursive=True)
        assert len(helpers) >= 4  # fork server, resource tracker, two workers
        command.send_signal(signal.SIGKILL)
        assert command.wait(10) == -signal.SIGKILL
        _, alive = psutil.wait_procs(helpers, timeout=15)
        assert alive == [], f"left running: {[' '.join(p.cmdline())[:120] for p in alive]}"
    finally:
        for process in helpers:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        if command.poll() is None:
            command.kill()
            command.wait()


@pytest.fixture
def dask_scheduler(shards, monkeypatch):
    """The address of a local Dask cluster of two worker processes, closed after the test."""
    from dask.distributed import LocalCluster

    monkeypatch.syspath_prepend(str(shards))  # spawned workers start with this sys.path: maps imports
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None, local_directory=str(shards / "dask"))
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


@pytest.mark.processes
def test_dask_cluster(shards, dask_scheduler, wdsmp_run):
    result = wdsmp_run("convert", "--map", "maps:relabel", "-o", "out", "--scheduler", dask_scheduler, "--json",
                       "in/{a..c}.tar")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["done"], summary["samples_in"], summary["samples_out"]) == (3, 21, 18)
    _check_relabelled(shards / "out")


@pytest.mark.parametrize("args, message", [
    (["--map", "json"], "--map json: ValueError: 'json' is not module:function"),
    (["--map", "json:nothing"], "--map json:nothing: AttributeError"),
    (["--map", "no_such_module:f"], "No module named 'no_such_module'"),
    (["--map", "json:dumps", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "a Dask cluster has its own"),
    (["--map", "json:dumps", "-o", "in"], "in/a.tar is in the output directory"),
    (["--map", "json:dumps", "x/a.tar"], "in/a.tar would both be written to"),
    (["--map", "exiting:f"], "--map exiting:f: SystemExit: 4"),  # sys.exit when imported
])
def test_usage_errors(shards, monkeypatch, capsys, args, message):
    monkeypatch.chdir(shards)
    monkeypatch.syspath_prepend(str(shards))  # restores sys.path, where convert puts the working directory
    (shards / "exiting.py").write_text("import sys\n\nsys.exit(4)\n")
    (shards / "x").mkdir()
    (shards / "x" / "a.tar").write_bytes((shards / "in" / "a.tar").read_bytes())
    assert main(["convert", "-o", "out", *args, "in/a.tar"]) == 2
    assert message in capsys.readouterr().err


def test_scheduler_without_dask_says_what_to_install(shards, monkeypatch, capsys):
    monkeypatch.chdir(shards)
    monkeypatch.syspath_prepend(str(shards))
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails, as where it is not installed
    assert main(["convert", "--map", "json:dumps", "-o", "out", "--scheduler", "tcp://127.0.0.1:1", "in/a.tar"]) == 2
    assert "pip install 'wdsmp[dask]'" in capsys.readouterr().err
    assert not (shards / "out").exists()


def test_a_scheduler_out_of_reach_leaves_no_output_directory(shards, monkeypatch, capsys):
    import dask.distributed

    class Unreachable:  # as Client fails after its timeout (10 s: not waited for here)
        def __init__(self, address, timeout):
            raise OSError(f"Timed out trying to connect to {address} after {timeout}")

    monkeypatch.chdir(shards)
    monkeypatch.syspath_prepend(str(shards))
    monkeypatch.setattr(dask.distributed, "Client", Unreachable)
    assert main(["convert", "--map", "json:dumps", "-o", "out", "--scheduler", "tcp://127.0.0.1:1", "in/a.tar"]) == 2
    assert capsys.readouterr().err == ("wdsmp convert: cannot reach the Dask scheduler at tcp://127.0.0.1:1: Timed "
                                       "out trying to connect to tcp://127.0.0.1:1 after 10s\n")
    assert not (shards / "out").exists()


def test_sys_exit_in_the_function_fails_its_shard(shards, monkeypatch):
    monkeypatch.syspath_prepend(str(shards))
    monkeypatch.setenv("EXIT_ON_KEY", "a4")
    output = shards / "out" / "a.tar"
    output.parent.mkdir()
    with pytest.raises(MapError, match=r"^--map maps:relabel raised SystemExit: leaving \(shard '.*/a.tar', "
                                       r"sample 'a4'\)$") as info:
        convert_shard(str(shards / "in" / "a.tar"), str(output), "maps:relabel")
    assert 'in relabel\n    sys.exit("leaving")' in info.value.details
    assert os.listdir(output.parent) == []


class Stop(BaseException):
    """Not an Exception, as SystemExit is not."""


def _pool_of(outcomes):
    """A stand-in for convert._local_pool: each task's future ends with the next of ``outcomes``,
    an exception, or counts when None."""
    def pool(tasks, workers):
        for task, exn in zip(tasks, outcomes):
            future = Future()
            if exn is None:
                future.set_result({"shard": task[0], "samples_in": 1, "samples_out": 1, "bytes": 10})
            else:
                future.set_exception(exn)
            yield task, future

    return pool


def test_any_exception_a_task_ends_with_is_a_failed_shard_and_the_run_goes_on(shards, monkeypatch, capsys):
    """Even one that is not an Exception: the summary is printed, the status is 1."""
    monkeypatch.chdir(shards)
    monkeypatch.syspath_prepend(str(shards))
    monkeypatch.setattr(convert, "_local_pool", _pool_of([SystemExit(3), None, Stop()]))
    assert main(["convert", "-q", "--map", "maps:relabel", "-o", "out", "--json", "in/{a..c}.tar"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["done"], summary["failed"], summary["not_started"]) == (1, 2, 0)
    assert [failure["error"] for failure in summary["failures"]] == [
        f"SystemExit: 3 (shard '{shards}/in/a.tar')", f"Stop (shard '{shards}/in/c.tar')"]
    monkeypatch.setattr(convert, "_local_pool", _pool_of([KeyboardInterrupt()]))  # Ctrl-C: the run stops
    assert main(["convert", "-q", "--force", "--map", "maps:relabel", "-o", "out", "in/{a..c}.tar"]) == 130
    assert capsys.readouterr().err == "wdsmp: interrupted\n"
