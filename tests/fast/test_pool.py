"""The worker pool (NOTE [worker processes] in ``wdsmp/fast/pool.py``): spawned workers are fresh
interpreters with the parent's sys.path and sys.argv that import the user's script only when told
to; pipes both ways; exits seen; stop() ends them for sure."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch  # noqa: F401  (what a training script has, and a spawned worker must not)

from wdsmp.fast import pool

from .workerfns import exit_with, report_environment


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_workers_get_the_parents_path_and_arguments_and_talk_both_ways(start_method):
    workers = pool.WorkerPool(report_environment, [("a",), ("b",)], start_method)
    try:
        first = [report for _, report in _receive_all(workers, [0, 1])]
        assert sorted(report["tag"] for report in first) == ["a", "b"]
        assert all(report["sys.path"] == sys.path and report["sys.argv"] == sys.argv for report in first)
        if start_method == "spawn":  # a fresh interpreter: not torch, which the test process has
            assert "torch" in sys.modules and not any(report["torch"] for report in first)
        assert workers.send(1, {"echo": 7})
        assert _receive_all(workers, [1]) == [(1, {"echo": 7})]
    finally:
        workers.stop(5.0)
    assert [code for _, code in workers.dead()] == [0, 0]  # EOF on their pipes: they returned
    assert not workers.send(0, "too late")


def _receive_all(workers, expected, timeout=60.0):
    """One message from each worker of ``expected``, in any order."""
    got, waiting = [], set(expected)
    while waiting:
        for worker, message in workers.receive(sorted(waiting), timeout):
            got.append((worker, message))
            waiting.discard(worker)
    return sorted(got, key=lambda entry: entry[0])


def test_an_exited_worker_says_its_last_words_then_eof_and_its_exit_code():
    workers = pool.WorkerPool(exit_with, [(3,)], "spawn")
    try:
        assert _receive_all(workers, [0]) == [(0, "goodbye")]
        assert _receive_all(workers, [0]) == [(0, pool.EOF)]
        workers.join(0, 10.0)
        assert workers.dead() == [(0, 3)]
        assert workers.receive([0], 0.0) == []  # not listened to again
    finally:
        workers.stop(0.0)


_SCRIPT = textwrap.dedent("""
    import sys
    from wdsmp.fast import pool
    from wdsmp.fast.pool import WorkerPool

    SCRIPT_FLAG = "imported as " + __name__


    def target(inbox, outbox):
        outbox.send((SCRIPT_FLAG, pool.starting_a_worker()))


    if __name__ == "__main__":
        print(pool.main_module()[0], pool.refers_to_main(target), pool.refers_to_main(len))
        workers = WorkerPool(target, [()], "spawn", main=True)
        message = workers.receive([0], 60)[0][1]
        workers.stop()
        print(*message)
""")


@pytest.mark.processes
def test_a_spawned_worker_imports_the_script_as_spawn_does_where_told_to(tmp_path):
    """A function defined in the script: the worker imports the script as ``__mp_main__``, under
    its main guard; ``starting_a_worker`` is true only while it does."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["path True False", "imported as __mp_main__ False"]


def test_the_script_to_import_is_a_module_under_python_m_and_none_under_python_c(tmp_path):
    code = "from wdsmp.fast import pool; print(pool.main_module())"
    (tmp_path / "job.py").write_text(code)
    for args, expected in ((["-c", code], "None"), (["-m", "job"], "('name', 'job')")):
        result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert result.stdout.strip() == expected, result.stderr[-3000:]


_ISOLATION_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from wdsmp.fast.pool import WorkerPool
    from tests.fast.workerfns import report_environment

    workers = WorkerPool(report_environment, [("a",)], "spawn")
    report = workers.receive([0], 60)[0][1]
    workers.stop(5.0)
    mine = [sys.flags.isolated, sys.flags.ignore_environment, sys.flags.no_user_site, sys.flags.optimize]
    print(report["flags"] == mine, report["sys.path"] == sys.path)
""")


@pytest.mark.processes
@pytest.mark.parametrize("flags, planted", [([], "cwd"), (["-E"], "PYTHONPATH"), (["-I"], "cwd"),
                                            (["-I"], "PYTHONPATH"), (["-s", "-OO"], "cwd")])
def test_spawned_workers_keep_the_parents_isolation(tmp_path, flags, planted):
    """A ``multiprocessing.py`` in the working directory or on ``PYTHONPATH`` (which ``-E`` and
    ``-I`` tell the interpreter to ignore) never runs in a worker, as it never runs in
    multiprocessing's own spawned workers; the workers run with the parent's flags."""
    root = str(Path(__file__).resolve().parents[2])
    work, elsewhere, marker = tmp_path / "work", tmp_path / "path", tmp_path / "planted-code-ran"
    for directory in (work, elsewhere):
        directory.mkdir()
    (work if planted == "cwd" else elsewhere).joinpath("multiprocessing.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    script = tmp_path / "train.py"
    script.write_text(_ISOLATION_SCRIPT.format(root=root))
    env = dict(os.environ, PYTHONPATH=str(elsewhere)) if planted == "PYTHONPATH" else dict(os.environ)
    result = subprocess.run([sys.executable, *flags, str(script)], capture_output=True, text=True, timeout=120,
                            cwd=work, env=env)
    assert not marker.exists(), "a planted multiprocessing.py ran in a worker"
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"]


def test_an_unknown_start_method_is_refused():
    with pytest.raises(ValueError, match="start_method must be one of"):
        pool.WorkerPool(exit_with, [(0,)], "threads")
