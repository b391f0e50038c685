"""States of a few hundred bytes that name huge sizes: every field is bounded and checked
before any loop or allocation, with a ValueError naming the field, in FastLoader and in
ExactSamples alike. Each case runs in a child whose address space and time are limited, so a
state that allocates or spins fails the test instead of the machine."""

import json

import pytest

import wdsmp as wds
from wdsmp.shards.index import write_index

from tests.bombs import run_limited

_CHILD = """
import json, sys, warnings
import wdsmp as wds
from wdsmp import FastLoader
warnings.simplefilter("ignore")
index, kind, changes, removed = sys.argv[1:] if len(sys.argv) > 1 else ({args})
changes, removed = json.loads(changes), json.loads(removed)
if kind == "exact":
    target = wds.DataPipeline(wds.ExactSamples(index, batch_size=2, rank=0, world_size=1))
    state = target.state_dict()
else:
    target = FastLoader(index, batch_size=2, num_workers=1, image_size=8, label=None, image_keys="txt")
    state = target.state_dict()
state.update(changes)
for name in removed:
    del state[name]
try:
    target.load_state_dict(state)
except ValueError as exn:
    print("ValueError:", exn)
else:
    print("accepted")
if kind != "exact":
    target.close()
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hostile")
    for s in range(2):
        with wds.TarWriter(str(directory / f"part-{s}.tar")) as sink:
            for i in range(4):
                sink.write({"__key__": f"s{s}-{i}", "txt": f"{s} {i}"})
    path = str(directory / "index.json")
    write_index(path, [(f"part-{s}.tar", 4) for s in range(2)])
    return path


def _load(index, kind, changes=None, removed=()):
    args = ", ".join(repr(a) for a in (index, kind, json.dumps(changes or {}), json.dumps(list(removed))))
    status, out = run_limited(_CHILD.format(args=args), headroom=512 << 20, timeout=60)
    assert status == 0, out[-3000:]
    return out.strip().splitlines()[-1]


@pytest.mark.processes
@pytest.mark.parametrize("kind, changes, removed, match", [
    ("exact", {"streams": 10**12}, (), "state's streams must be an int from 1 to 65536"),
    ("exact", {"epoch": "seven"}, (), "state's epoch must be an int"),
    ("exact", {}, ("streams", "batches_done"), "state lacks batches_done, streams"),
    ("fast", {"world_size": 10**12}, (), "state's world_size must be an int from 1 to 1048576"),
    ("fast", {"origin": [10**12, 1, 1]}, (), "origin's world_size must be an int from 1 to 1048576"),
    ("fast", {"origin": [2, 1, 10**12]}, (), "origin's num_streams must be an int from 1 to 65536"),
    ("fast", {"worker_batches": "x" * 300}, (), "state's worker_batches must be a list of 1 to 65536 entries"),
    ("fast", {"worker_read": [0, 0, 0]}, (), "state's worker_read has 3 entries, worker_batches 1"),
    ("fast", {"worker_read": [-1]}, (), "state's worker_read entries must be an int >= 0"),
    ("fast", {}, ("origin", "worker_read"), "state lacks worker_read, origin"),
])
def test_a_hostile_state_is_refused_naming_the_field(index, kind, changes, removed, match):
    got = _load(index, kind, changes, removed)
    assert got.startswith(f"ValueError: {match}"), got


@pytest.mark.processes
def test_the_states_they_save_are_accepted(index):
    assert _load(index, "exact") == "accepted"
    assert _load(index, "fast") == "accepted"
