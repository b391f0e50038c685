"""Running the ``wdsmp`` command as users do: a subprocess, with its output and status."""

import os
import shutil
import subprocess
import sys

import pytest


def _command():
    """The installed console script, else ``python -m wdsmp.cli`` (a checkout not installed)."""
    script = shutil.which("wdsmp", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "wdsmp.cli"]


@pytest.fixture
def wdsmp_run(tmp_path):
    """``wdsmp_run(*args, input=None, cwd=tmp_path)`` runs ``wdsmp args...``; the CompletedProcess
    (``stdout``/``stderr`` as text, or bytes with ``text=False``)."""

    def run(*args, input=None, cwd=None, text=True, env=None, timeout=300):
        environment = dict(os.environ, **(env or {}))
        return subprocess.run(_command() + [str(a) for a in args], input=input, cwd=cwd or tmp_path,
                              capture_output=True, text=text, env=environment, timeout=timeout)

    return run


@pytest.fixture
def wdsmp_start(tmp_path):
    """``wdsmp_start(*args, cwd=tmp_path)`` starts ``wdsmp args...`` and returns its Popen at once
    (output discarded); the test must end it."""

    def start(*args, cwd=None):
        return subprocess.Popen(_command() + [str(a) for a in args], cwd=cwd or tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return start
