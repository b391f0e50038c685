"""make_seed: the same seed in every process, whatever its hash salt."""

import os
import subprocess
import sys

import pytest

from wdsmp._seeding import make_seed


def test_make_seed_is_stable_across_processes():
    code = "from wdsmp._seeding import make_seed; print(make_seed('shard', 3, b'x', 1.5, (1, 'a')))"
    outputs = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        outputs.add(int(out))
    assert outputs == {make_seed("shard", 3, b"x", 1.5, (1, "a"))}
    assert 0 <= make_seed("shard") < 2**31
    assert make_seed(1, 2) != make_seed(2, 1) and make_seed("1") != make_seed(1)
    with pytest.raises(TypeError, match="cannot hash"):
        make_seed(object())
