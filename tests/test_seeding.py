"""make_seed: the same seed in every process, whatever its hash salt."""

import os
import subprocess
import sys

import pytest

from wdsmp._internal.seeding import make_seed


def test_make_seed_is_stable_across_processes():
    code = "from wdsmp._internal.seeding import make_seed; print(make_seed('shard', 3, b'x', 1.5, (1, 'a')))"
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


def test_sample_draws_are_fixed_by_seed_and_number_and_look_uniform():
    from wdsmp._internal.seeding import SampleDraws

    first = [SampleDraws(7, n).random() for n in range(20000)]
    assert first == [SampleDraws(7, n).random() for n in range(20000)]  # the same wherever made
    assert SampleDraws(8, 0).random() != first[0] and len(set(first)) == len(first)
    draws = SampleDraws(7, 3)
    sequence = [draws.random() for _ in range(20000)]
    for values in (first, sequence):  # across samples, and along one sample's draws
        assert all(0.0 <= v < 1.0 for v in values)
        counts = [0] * 10
        for v in values:
            counts[int(v * 10)] += 1
        assert all(1800 < c < 2200 for c in counts), counts  # 2000 expected, about 5 sigma either way
        assert abs(sum(values) / len(values) - 0.5) < 0.01
