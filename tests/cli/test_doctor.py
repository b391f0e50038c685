"""``wdsmp doctor``: which native parts are in use, and what is missing."""

import json
import os
import subprocess
import sys

from wdsmp.native import core as native
from wdsmp.cli import main


def test_doctor_names_every_native_part_in_use(capsys, monkeypatch):
    monkeypatch.delenv("WDSMP_PUREPYTHON", raising=False)
    status = main(["doctor"])
    lines = capsys.readouterr().out.splitlines()
    parts = {line[11:].split(":")[0]: line[:9].strip() for line in lines if line[11:].startswith("wdsmp.native._")}
    region = next(part.state for part in native.parts() if part.name == "wdsmp.native._jpegregion")
    assert parts == {"wdsmp.native._tarsplit": "in use", "wdsmp.native._imgops": "in use",
                     "wdsmp.native._pilimage": "in use", "wdsmp.native._jpegregion": region}
    assert status == (1 if region == "not built" else 0)
    assert any(line.startswith("versions: torch ") for line in lines)
    assert any("matplotlib: the picture of `wdsmp bench`" in line for line in lines)


def test_doctor_says_the_twins_are_in_use_and_why(capsys, monkeypatch):
    monkeypatch.setenv("WDSMP_PUREPYTHON", "1")
    assert main(["doctor", "--json"]) == 0  # off by choice, not missing
    parts = json.loads(capsys.readouterr().out)["parts"]
    assert [part["state"] for part in parts] == ["off"] * 4
    assert parts[0]["detail"].startswith("WDSMP_PUREPYTHON=1: the pure-Python twin splits tar files")
    assert "FastLoader decodes whole JPEGs" in parts[3]["detail"]


def test_doctor_says_what_a_build_without_libjpeg_turbo_lacks():
    """The region decoder failing to import, as it does where wdsmp was built without libjpeg-turbo's headers."""
    script = ("import sys; sys.modules['wdsmp.native._jpegregion'] = None; from wdsmp.cli import main; "
              "sys.exit(main(['doctor']))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "WDSMP_PUREPYTHON"}, timeout=300)
    assert result.returncode == 1, result.stderr
    line = next(line for line in result.stdout.splitlines() if "wdsmp.native._jpegregion" in line)
    assert line.startswith("not built  wdsmp.native._jpegregion: FastLoader's JPEG region decoder (libjpeg-turbo); "
                           "import of wdsmp.native._jpegregion halted")
    assert "FastLoader decodes whole JPEGs with simplejpeg instead" in line


def test_version_is_the_packages():
    done = subprocess.run([sys.executable, "-m", "wdsmp.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    import wdsmp

    assert done.returncode == 0 and done.stdout.strip() == f"wdsmp {wdsmp.__version__}"
