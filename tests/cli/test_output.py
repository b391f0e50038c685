"""The output side shared by create, cat and split: --maxsize sizes and an earlier run's series."""

import argparse

import pytest

from wdsmp.cli import main
from wdsmp.cli.output import existing_series, parse_size


def test_parse_size(capsys):
    assert [parse_size(s) for s in ("3e9", "500M", "1G", "1.5k", "1.1k", "512Mi", "10", "2KB", "0.5k", "1e19")] == [
        3 * 10**9, 500 * 10**6, 10**9, 1500, 1100, 512 * 2**20, 10, 2000, 500, 10**19]
    for bad in ("", "0", "-1", "1X", "G", "0.5", "1.0001k", "1e400", "1e99999999", "2e19", "0.1Ti"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a whole number of bytes from 1 to 1e19"):
            parse_size(bad)
    with pytest.raises(SystemExit) as exit:  # a usage error, not the 3 GB default
        main(["create", "--maxsize", "0.5", "-o", "x-%d.tar", "src"])
    assert exit.value.code == 2
    assert "--maxsize: not a whole number of bytes from 1 to 1e19: '0.5'" in capsys.readouterr().err


def test_existing_series(tmp_path):
    for name in ("s-000.tar", "s-002.tar", "s-2.tar", "s-abc.tar", "s-.tar", ".partial-s-001.tar",
                 "p%-a.tar", "p%-10.tar", "p%-0x1.tar", "d-1/x.tar"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    series = {0: str(tmp_path / "s-000.tar"), 2: str(tmp_path / "s-002.tar")}
    assert existing_series(str(tmp_path / "s-%03d.tar")) == series
    assert existing_series(f"file://{tmp_path}/s-%03d.tar") == series
    assert existing_series(str(tmp_path / "p%%-%x.tar")) == {10: str(tmp_path / "p%-a.tar"),
                                                             16: str(tmp_path / "p%-10.tar")}
    assert existing_series(str(tmp_path / "d-%d/x.tar")) == {1: str(tmp_path / "d-1/x.tar")}
    assert existing_series("pipe:cat > s-%03d.tar") == {}
