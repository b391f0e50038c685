"""FastLoader end to end: real shards, real JPEGs, real worker processes and shared memory."""

import collections
import functools
import gc
import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import simplejpeg
import torch
from PIL import Image

import wdsmp
from wdsmp.errors import WorkerError
from wdsmp.fast import resources as resources_module
from wdsmp.fast.loader import Batch, FastLoader
from wdsmp.fast.ring import SHM_DIR
from wdsmp.shards.index import write_index

from ..conftest import tar_bytes
from .workerfns import (add_double, below_forty, fail_in_the_second_epoch, keep_even, label_frozen,
                        label_noting_its_thread, label_plus_one, note_read, raise_at, without_key)

SHARDS, PER_SHARD = 3, 23  # 69 samples: batches of 4 leave remainders on purpose
SIZE = 24


def _photo(rng, height, width):
    """A smooth picture with some texture (JPEG-friendly, unlike noise)."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    return np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """``(urls, index path, {key: label})``: 3 shards of 23 JPEG samples of assorted sizes."""
    directory = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(7)
    urls, labels = [], {}
    for s in range(SHARDS):
        url = str(directory / f"part-{s}.tar")
        with wdsmp.TarWriter(url) as sink:
            for i in range(PER_SHARD):
                key, label = f"s{s}/{i:03d}", s * PER_SHARD + i
                pixels = _photo(rng, int(rng.integers(30, 70)), int(rng.integers(30, 70)))
                sink.write({"__key__": key, "jpg": simplejpeg.encode_jpeg(pixels, 95), "cls": str(label).encode(),
                            "vec.npy": _npy(np.array([label, -label], np.int32)), "txt": f"{label} 1.5".encode()})
                labels[key] = label
        urls.append(url)
    index = str(directory / "index.json")
    write_index(index, [(os.path.basename(u), PER_SHARD) for u in urls])
    return urls, index, labels


def _npy(array):
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _loader(urls, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("image_size", SIZE)
    return FastLoader(urls, kw.pop("batch_size", 4), **kw)


def _keys(loader):
    """Keys of one epoch, and the batch sizes."""
    keys, sizes = [], []
    for batch in loader:
        keys += batch.keys
        sizes.append(batch.count)
    return keys, sizes


def test_shapes_dtypes_and_labels(shards):
    urls, index, labels = shards
    with _loader(index, keys=True, image_size=(SIZE, SIZE + 8)) as loader:
        assert len(loader) == SHARDS * PER_SHARD // 4
        batches = 0
        for batch in loader:
            images, labels_ = batch
            assert isinstance(batch, Batch)
            assert images.shape == (4, SIZE, SIZE + 8, 3) and images.dtype == torch.uint8
            assert labels_.shape == (4,) and labels_.dtype == torch.int64
            assert [labels[k] for k in batch.keys] == labels_.tolist()
            assert images.float().std() > 10  # real pixels, not an empty slot
            batches += 1
        assert batches == len(loader)
    with _loader(index, channels_first=True) as loader:
        images, _ = next(iter(loader))
        assert images.shape == (4, 3, SIZE, SIZE)


def test_exactly_once_across_two_ranks_of_two_workers(shards):
    _, index, labels = shards
    for policy in ("drop", "pad"):
        per_rank = []
        for rank in range(2):
            with _loader(index, keys=True, rank=rank, world_size=2, policy=policy) as loader:
                keys, sizes = _keys(loader)
                assert len(sizes) == len(loader) and set(sizes) == {4}
                per_rank.append(keys)
        assert len(per_rank[0]) == len(per_rank[1])  # equal batches: DDP never waits
        seen = collections.Counter(per_rank[0] + per_rank[1])
        total = SHARDS * PER_SHARD
        if policy == "drop":
            assert max(seen.values()) == 1 and len(seen) == total // 2 // 4 * 4 * 2
        else:
            assert set(seen) == set(labels) and sum(seen.values()) == 2 * 36  # 69 -> 2 x 9 batches of 4
            assert sum(n - 1 for n in seen.values()) == 72 - total


def test_whole_shard_epochs_read_every_sample_once(shards):
    urls, _, labels = shards
    with _loader(urls, keys=True, num_workers=2, exact=False) as loader:
        with pytest.raises(TypeError, match="exact epochs"):
            len(loader)
        keys, sizes = _keys(loader)
    assert sorted(keys) == sorted(labels)
    assert sum(sizes) == len(labels) and all(size <= 4 for size in sizes)


def test_plain_local_urls_count_themselves_for_exact_epochs(shards):
    """No index, no counts given: the same exact epochs as with the index, on two ranks."""
    urls, index, _ = shards
    for rank in range(2):
        epochs = []
        for source in (urls, index):
            with _loader(source, keys=True, rank=rank, world_size=2, seed=3) as loader:
                epochs.append((len(loader), _keys(loader)))
        assert epochs[0] == epochs[1] and epochs[0][0] == SHARDS * PER_SHARD // 2 // 4


@pytest.mark.parametrize("policy, rank, what", [("drop", 0, "read by no rank"), ("pad", 1, "read twice by rank 1")])
def test_whole_shard_epochs_count_and_announce_what_they_leave_out(shards, policy, rank, what):
    urls, _, _ = shards
    with _loader(urls, keys=True, rank=rank, world_size=2, policy=policy, exact=False) as loader:
        for epoch in range(2):
            with pytest.warns(UserWarning, match=rf"epoch {epoch} deals out whole shards .*: 1 shard "
                                                 rf"\(23 samples\) {what}, by policy='{policy}'"):
                keys, _ = _keys(loader)
        counted = {"drop": ("dropped", "dropped_shards"), "pad": ("repeated", "repeated_shards")}[policy]
        assert [loader.stats[name] for name in counted] == [2 * PER_SHARD, 2]
    assert len(keys) == (1 if policy == "drop" else 2) * PER_SHARD


def test_remote_shards_without_counts_are_refused_on_more_than_one_rank(shards, http_server, monkeypatch):
    urls, _, _ = shards
    for url in urls:
        http_server.put_file(os.path.basename(url), Path(url).read_bytes())
    remote = [http_server.url(os.path.basename(url)) for url in urls]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets them
    with pytest.raises(ValueError, match=r"FastLoader on 2 ranks needs the sample count of every shard(.|\n)*"
                                         r"wdsmp index -o index.json(.|\n)*or pass exact=False"):
        _loader(remote)
    for options in ({"exact": False}, {"world_size": 1, "rank": 0}, {"resampled": True, "epoch_batches": 2}):
        _loader(remote, **options).close()


def test_a_shard_gone_after_construction_is_named_alone(shards, tmp_path):
    """The error names the shard that failed to open, not the last member of the one before it."""
    urls, _, _ = shards
    copies = []
    for url in urls:
        copies.append(str(tmp_path / os.path.basename(url)))
        with open(url, "rb") as source, open(copies[-1], "wb") as target:
            target.write(source.read())
    with _loader(copies, num_workers=1, shuffle=False, batch_size=5, keys=True) as loader:
        os.remove(copies[2])
        with pytest.raises(WorkerError) as info:
            _keys(loader)
    assert (info.value.shard, info.value.member) == (copies[2], None)
    assert str(info.value).startswith(f"loader worker 0 failed, shard {copies[2]!r}: wdsmp.errors.ShardNotFoundError")


def test_deterministic_under_a_seed(shards):
    _, index, _ = shards

    def run(seed, epoch):
        with _loader(index, keys=True, seed=seed) as loader:
            loader.set_epoch(epoch)
            batch = next(iter(loader))
            return list(batch.keys), batch.images.clone()

    keys, pixels = run(3, 0)
    again_keys, again_pixels = run(3, 0)
    assert keys == again_keys and torch.equal(pixels, again_pixels)
    assert run(4, 0)[0] != keys
    assert run(3, 1)[0] != keys


@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_every_start_method_gives_the_same_epoch_from_workers_that_froze_what_they_inherited(shards, start_method):
    _, index, _ = shards
    with _loader(index, keys=True, seed=3) as loader:
        expected = [(list(b.keys), b.images.clone()) for b in loader]
    with _loader(index, keys=True, seed=3, start_method=start_method) as loader:
        got = [(list(b.keys), b.images.clone()) for b in loader]
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(torch.equal(p, q) for (_, p), (_, q) in zip(got, expected))
    with _loader(index, label=label_frozen, start_method=start_method) as loader:  # NOTE [inherited objects]
        assert {int(x) for b in loader for x in b.labels} == {1}


def test_epochs_advance_and_eval_order_is_stable(shards):
    _, index, _ = shards
    with _loader(index, keys=True) as loader:
        first, second = _keys(loader)[0], _keys(loader)[0]
        assert first != second and loader.epoch == 2
    with _loader(index, keys=True, train=False) as loader:
        assert _keys(loader)[0] == _keys(loader)[0][: len(_keys(loader)[0])]


def _reference_eval(jpeg, size):
    """torchvision's Resize(int(size / 0.875)) + CenterCrop(size), in PIL."""
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    short = int(size / 0.875)
    w, h = image.size
    new = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    image = image.resize(new, Image.BILINEAR, reducing_gap=None)
    left, top = int(round((new[0] - size) / 2)), int(round((new[1] - size) / 2))
    return np.asarray(image.crop((left, top, left + size, top + size)))


def test_eval_pixels_match_a_pil_reference(shards):
    urls, _, _ = shards
    members = {s["__key__"]: s["jpg"] for s in wdsmp.DataPipeline(wdsmp.SimpleShardList(urls[:1]),
                                                                  wdsmp.tarfile_to_samples())}
    with _loader(urls[:1], keys=True, train=False, dct_scaling=False) as loader:
        for batch in loader:
            for key, image in zip(batch.keys, batch.images.numpy()):
                reference = _reference_eval(members[key], SIZE)
                assert np.abs(image.astype(int) - reference).mean() < 2.0, key


def _damage(path, key):
    """A copy of the shard at ``path`` whose JPEG of ``key`` is garbage."""
    samples = list(wdsmp.DataPipeline(wdsmp.SimpleShardList([path]), wdsmp.tarfile_to_samples()))
    damaged = path.replace(".tar", "-damaged.tar")
    with wdsmp.TarWriter(damaged) as sink:
        for sample in samples:
            sample = {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}
            if sample["__key__"] == key:
                sample["jpg"] = b"\xff\xd8\xff\xe0 not a jpeg at all"
            sink.write(sample)
    return damaged


def test_bad_sample_names_worker_shard_and_member(shards):
    urls, _, _ = shards
    damaged = _damage(urls[0], "s0/005")
    with _loader([damaged], num_workers=1, policy="pad") as loader:  # pad: every sample is read, in any order
        with pytest.raises(WorkerError, match=r"worker 0 failed, shard '.*-damaged.tar', member 's0/005.jpg'") as info:
            list(loader)
        assert info.value.exc_type == "wdsmp.errors.DecodeError"
        with pytest.raises(WorkerError, match="s0/005"):  # fresh workers, same bad sample
            list(loader)
    with pytest.raises(WorkerError, match="s0/005"):
        with _loader([(damaged, PER_SHARD)], num_workers=1, policy="pad") as loader:
            list(loader)
    with _loader([damaged], num_workers=1, stages=[without_key], policy="pad") as loader:  # a stage dropped the key
        with pytest.raises(WorkerError, match=r"shard '.*-damaged.tar', member 'jpg'"):
            list(loader)


def test_handler_skips_and_pads_to_full_batches(shards):
    urls, _, _ = shards
    damaged = _damage(urls[0], "s0/005")
    with pytest.warns(UserWarning, match=r"in loader worker 0: DecodeError.*member 's0/005.jpg'"):
        with _loader([(damaged, PER_SHARD)], num_workers=1, keys=True, train=False,
                     handler=wdsmp.warn_and_continue) as loader:
            keys, sizes = _keys(loader)
            assert sizes == [4] * 5 and "s0/005" not in keys
            assert loader.stats["skipped"] == 1 and loader.stats["padded"] == 1
    assert keys[-1] == keys[-2]  # the padded row repeats the last good sample


def test_missing_image_field_is_named(shards):
    urls, _, _ = shards
    with _loader(urls[:1], num_workers=1, image_keys="png;webp") as loader:
        with pytest.raises(WorkerError, match=r"no image field \(one of png, webp\).*cls, jpg, txt, vec.npy"):
            next(iter(loader))


def _write_shard(path, keys, fields=("jpg", "cls")):
    """A shard at ``path`` of small JPEG samples, with only the fields named."""
    rng = np.random.default_rng(3)
    with wdsmp.TarWriter(str(path)) as sink:
        for label, key in enumerate(keys):
            sample = {"jpg": simplejpeg.encode_jpeg(_photo(rng, 40, 48), 90), "cls": str(label).encode(), "txt": b"t"}
            sink.write({"__key__": key, **{f: sample[f] for f in fields}})
    return str(path)


def test_missing_label_field_is_named(tmp_path):
    url = _write_shard(tmp_path / "unlabelled.tar", ["u/000", "u/001"], fields=("jpg", "txt"))
    with _loader([url], num_workers=1, label="cls", shuffle=False, exact=False) as loader:
        with pytest.raises(WorkerError, match=r"worker 0 failed.*no label field 'cls' in the sample; it has jpg, txt"
                                              r".*shard '.*unlabelled.tar', member 'u/000'") as info:
            next(iter(loader))
        assert info.value.exc_type == "wdsmp.errors.SampleError"
    with _loader([url], num_workers=1, label=None, keys=True, shuffle=False, exact=False) as loader:  # no error
        assert _keys(loader) == (["u/000", "u/001"], [2])


@pytest.mark.parametrize("num_workers", [1, 2])
def test_an_empty_shard_among_others_adds_nothing(shards, tmp_path, num_workers):
    urls, _, labels = shards
    empty = tmp_path / "empty.tar"
    empty.write_bytes(tar_bytes([]))  # a valid tar of no members
    with _loader([str(empty), urls[0]], keys=True, num_workers=num_workers, shuffle=False, train=False,
                 exact=False) as loader:
        keys, sizes = _keys(loader)
    assert sorted(keys) == sorted(k for k in labels if k.startswith("s0/"))
    assert sum(sizes) == PER_SHARD and all(size <= 4 for size in sizes)


def test_stages_fields_and_label_functions(shards):
    _, index, labels = shards
    with _loader(index, keys=True, num_workers=1, shuffle=False, policy="pad", label=label_plus_one,
                 stages=[wdsmp.select(keep_even), wdsmp.map(add_double)],
                 fields={"vec": ("vec.npy", (2,), "int32"), "double": ("double", (), "int64"),
                         "txt": ("txt", (2,), "float32")}) as loader:
        for batch in loader:
            for key, label, vec, double, txt in zip(batch.keys, batch.labels, batch.fields["vec"],
                                                    batch.fields["double"], batch.fields["txt"]):
                value = labels[key]
                assert value % 2 == 0 and int(label) == value + 1
                assert vec.tolist() == [value, -value] and int(double) == 2 * value
                assert txt.tolist() == [value, 1.5]
        assert loader.stats["padded"] > 0  # the select stage dropped half: rows repeat (NOTE [full batches])


def test_whole_batches_lost_to_a_stage_repeat_the_last_good_sample(shards):
    _, index, _ = shards
    with _loader(index, keys=True, num_workers=1, shuffle=False, train=False, copy=True,
                 stages=[wdsmp.select(below_forty)]) as loader:
        batches = [batch for batch in loader]
    assert len(batches) == 17 and all(batch.count == 4 for batch in batches)
    assert batches[-1].keys == [batches[9].keys[-1]] * 4  # the last full batch's last sample
    assert torch.equal(batches[-1].images[0], batches[9].images[-1])


def test_progress_reports_throughput(shards, capsys):
    _, index, _ = shards
    with _loader(index, progress=1e-6) as loader:
        list(loader)
        assert loader.stats["samples"] == 68 and loader.stats["images_per_s"] > 0
    assert "wdsmp FastLoader: epoch 0, 2 batches" in capsys.readouterr().err  # reports start after the first batch


def test_a_ring_too_big_for_dev_shm_is_a_clear_error(shards):
    _, index, _ = shards
    with pytest.raises(OSError, match=r"needs .* MiB .* but /dev/shm has only"):
        FastLoader(index, 1 << 16, image_size=2048, num_workers=64, policy="pad")


def test_bad_field_declarations_fail_at_construction(shards):
    urls, _, _ = shards
    with pytest.raises(ValueError, match="taken by the loader"):
        _loader(urls, fields={"images": ("x", (), "int32")})
    with pytest.raises(ValueError, match=r"\(source, shape, dtype\)"):
        _loader(urls, fields={"x": "x"})
    with pytest.raises(ValueError, match="batch_size"):
        FastLoader(urls, 0)
    with pytest.raises(ValueError, match="start_method"):
        _loader(urls, start_method="thread")
    with pytest.raises(ValueError, match="epoch_batches"):
        _loader(urls, resampled=True)


def test_copy_keeps_batches_and_views_are_recycled(shards):
    _, index, _ = shards
    with _loader(index, copy=True, train=False, shuffle=False, num_workers=1) as loader:
        kept = [images for images, _ in loader]
    with _loader(index, copy=True, train=False, shuffle=False, num_workers=1) as loader:
        again = [images for images, _ in loader]
    with _loader(index, train=False, shuffle=False, num_workers=1) as loader:
        views = [images for images, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(kept, again))
    assert not all(torch.equal(a, b) for a, b in zip(kept[:4], views[:4]))  # NOTE [batch lifetime]


def test_resume_gives_exactly_the_rest(shards):
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        whole = _keys(loader)[0]
    with _loader(index, keys=True, seed=5) as loader:
        iterator = iter(loader)
        head = [k for _ in range(5) for k in next(iterator).keys]
        state = loader.state_dict()
    assert state["batches_done"] == 5 and head == whole[:20]
    with _loader(index, keys=True, seed=5) as loader:
        loader.load_state_dict(state)
        rest = _keys(loader)[0]
    assert head + rest == whole


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("num_workers", [1, 3])
def test_resume_with_another_worker_count_gives_exactly_the_rest(shards, num_workers, exact):
    """The epoch's two streams are shared out whole, and the rest comes in the order it would
    have; a second resume, from a state saved by the resumed loader, is exact too."""
    urls, index, _ = shards
    with _loader(index, keys=True, seed=5, exact=exact) as loader:
        whole, sizes = _keys(loader)
        loader.set_epoch(0)
        iterator = iter(loader)
        head = [k for _ in range(3) for k in next(iterator).keys]
        state = loader.state_dict()
    with _loader(index, keys=True, seed=5, num_workers=num_workers, exact=exact) as loader:
        loader.load_state_dict(state)
        iterator = iter(loader)
        middle = [k for _ in range(4) for k in next(iterator).keys]
        state = loader.state_dict()
    assert state["batches_done"] == 7 and len(state["worker_batches"]) == 2
    with _loader(index, keys=True, seed=5, num_workers=2, exact=exact) as loader:
        loader.load_state_dict(state)
        rest, rest_sizes = _keys(loader)
    assert head + middle + rest == whole
    assert len(rest_sizes) == len(sizes) - 7


def test_a_state_of_whole_shard_epochs_is_refused_by_an_exact_loader(shards):
    _, index, _ = shards
    with _loader(index, exact=False, order="shards") as loader:
        state = loader.state_dict()
    with _loader(index, order="shards") as loader:
        with pytest.raises(ValueError, match="state was saved with exact=False, this loader has True"):
            loader.load_state_dict(state)
    with _loader(index, order="global") as loader:
        with pytest.raises(ValueError, match="saved with the samples in shards order.*order='shards'"):
            loader.load_state_dict(dict(state, exact=True))


def test_a_state_carries_its_format_version_and_another_or_a_partial_one_is_refused(shards):
    _, index, _ = shards
    with _loader(index) as loader:
        state = loader.state_dict()
        assert (state["format"], state["version"]) == ("wdsmp.FastLoader", 1)
        loader.load_state_dict(state)
        with pytest.raises(ValueError, match="state is wdsmp.FastLoader version 2; this wdsmp reads version 1"):
            loader.load_state_dict(dict(state, version=2))
        unversioned = {name: value for name, value in state.items() if name not in ("format", "version")}
        with pytest.raises(ValueError, match="state is not in a known version of wdsmp.FastLoader .*version=None"):
            loader.load_state_dict(unversioned)
        with pytest.raises(ValueError, match="known version of wdsmp.FastLoader .*format=.wdsmp.ExactSamples."):
            loader.load_state_dict(dict(state, format="wdsmp.ExactSamples"))
        with pytest.raises(ValueError, match="state lacks worker_batches, seed: it is not a whole state_dict"):
            loader.load_state_dict({name: value for name, value in state.items()
                                    if name not in ("worker_batches", "seed")})


def test_resampled_epochs_have_the_asked_length(shards):
    _, index, labels = shards
    with _loader(index, keys=True, resampled=True, epoch_batches=7) as loader:
        assert len(loader) == 7
        keys, sizes = _keys(loader)
        assert sizes == [4] * 7 and set(keys) <= set(labels)


def test_break_then_iterate_again_and_close_is_idempotent(shards):
    _, index, _ = shards
    loader = _loader(index)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert len(list(loader)) == len(loader)
    pids = _worker_pids(loader)
    loader.close()
    loader.close()
    assert loader.closed and _gone(pids, 5)
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


def _worker_pids(loader):
    return loader._resources.workers.pids()


def test_garbage_collection_stops_workers_and_frees_the_ring(shards):
    _, index, _ = shards
    loader = _loader(index)
    next(iter(loader))
    pids, name = _worker_pids(loader), loader._resources.ring.name
    del loader
    gc.collect()
    assert name not in os.listdir(SHM_DIR)
    psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=5)
    assert not any(_alive(p) for p in pids)


def test_dead_worker_is_reported_within_seconds(shards):
    _, index, _ = shards
    with _loader(index, num_workers=2, prefetch=1) as loader:
        iterator = iter(loader)
        next(iterator)
        os.kill(_worker_pids(loader)[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match="worker 1 .* died with signal SIGKILL"):
            for _ in iterator:
                pass
        assert time.monotonic() - start < 5
        assert len(list(loader)) == len(loader)  # the next epoch runs on fresh workers


_UNGUARDED = textwrap.dedent("""
    import sys
    import wdsmp
    {function}
    loader = wdsmp.FastLoader(sys.argv[1], 4, num_workers=2, image_size=24{label})
    print("batches", len(list(loader)), flush=True)
""")


@pytest.mark.processes
def test_a_script_without_main_guard_works(shards, tmp_path):
    """Workers do not import the user's script when nothing of it is needed (NOTE [worker processes]
    in ``wdsmp/fast/pool.py``)."""
    _, index, _ = shards
    path = tmp_path / "train.py"
    path.write_text(_UNGUARDED.format(function="", label=""))
    result = subprocess.run([sys.executable, str(path), index], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["batches", str(SHARDS * PER_SHARD // 4)]


@pytest.mark.processes
def test_a_script_without_main_guard_needing_its_own_function_is_told_why(shards, tmp_path):
    _, index, _ = shards
    path = tmp_path / "train.py"
    path.write_text(_UNGUARDED.format(function="def label(sample):\n    return 1", label=", label=label"))
    result = subprocess.run([sys.executable, str(path), index], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "put the script's code under if __name__ == '__main__':" in result.stderr
    assert re.search(r"WorkerError: loader worker \d failed to start: RuntimeError: a FastLoader was made",
                     result.stderr), result.stderr[-3000:]


_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from wdsmp.fast.loader import FastLoader
    if __name__ == "__main__":
        # Python's own Ctrl-C handling, also where the suite runs as a background job (which
        # starts with SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = FastLoader(sys.argv[1], 4, num_workers=2, image_size=24, start_method=sys.argv[3])
        iterator = iter(loader)
        next(iterator)
        print(loader._resources.ring.name, *loader._resources.workers.pids(), flush=True)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # epoch after epoch, until a signal ends it
            for _ in iterator:
                time.sleep(0.05)
            iterator = iter(loader)
""")


def _run_child(tmp_path, index, how, new_session=False, start_method="spawn"):
    """A child running a FastLoader; ``new_session=True`` starts it in a session (and process
    group) of its own, which its workers join."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), index, how, start_method], stdout=subprocess.PIPE,
                             text=True, start_new_session=new_session)
    words = child.stdout.readline().split()
    return child, words[0], [int(p) for p in words[1:]]


def _alive(pid):
    """Whether ``pid`` runs (a zombie does not; one that exits while it is asked about does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_stops_workers_and_unlinks_the_ring(shards, tmp_path):
    _, index, _ = shards
    child, ring, pids = _run_child(tmp_path, index, "interrupt")
    child.send_signal(signal.SIGINT)
    try:
        assert child.wait(10) != 0
    finally:
        child.kill()  # it loops for ever: never leave it behind
    assert _gone(pids, 5)
    assert ring not in os.listdir(SHM_DIR)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_workers_exit_when_the_main_process_is_killed(shards, tmp_path, start_method):
    """Under fork the later worker holds the parent's end of the earlier one's sentinel pipe: it
    exits first, and the earlier one then sees the parent gone."""
    _, index, _ = shards
    child, ring, pids = _run_child(tmp_path, index, "kill", start_method=start_method)
    assert child.wait(10) == -signal.SIGKILL
    assert _gone(pids, 5)  # parent watch
    from wdsmp.fast.ring import cleanup_stale

    # What a new FastLoader does first. Under fork the workers share the owner's lock on the
    # ring, and a worker seen gone may still be closing its files for a moment.
    deadline = time.monotonic() + 5
    while ring in os.listdir(SHM_DIR) and time.monotonic() < deadline:
        cleanup_stale()
        time.sleep(0.05)
    assert ring not in os.listdir(SHM_DIR)


@pytest.mark.processes
def test_killing_the_whole_process_group_leaves_a_ring_cleanup_removes(shards, tmp_path):
    """SIGKILL to the group (as a job scheduler does): nobody gets to clean up, so the ring stays
    until the next loader's cleanup_stale() (NOTE [ring ownership]); the workers' pipes hold no
    named semaphores, so nothing else of the loader is left in /dev/shm."""
    from wdsmp.fast.ring import cleanup_stale

    _, index, _ = shards
    child, ring, pids = _run_child(tmp_path, index, "run", new_session=True)
    try:
        assert os.getpgid(child.pid) == child.pid and pids
        assert all(os.getpgid(p) == child.pid for p in pids)  # the workers are in the group
        assert ring in os.listdir(SHM_DIR)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child is not reaped yet: the group is still its
        status = child.wait(10)
        child.stdout.close()
    assert status == -signal.SIGKILL
    assert _gone(pids, 5)
    cleanup_stale()  # what a new FastLoader does first
    assert not [name for name in os.listdir(SHM_DIR) if str(child.pid) in name]


def test_cuda_needs_a_gpu(shards):
    urls, _, _ = shards
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: tests/fast/test_transfer.py covers it")
    with _loader(urls) as loader:
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            loader.cuda()


def test_a_skipped_last_sample_does_not_lose_its_slot(shards):
    urls, _, _ = shards
    damaged = _damage(urls[0], "s0/022")  # the last sample, after two full batches of 11
    with _loader([damaged], batch_size=11, num_workers=1, prefetch=1, shuffle=False, timeout=10,
                 handler=wdsmp.ignore_and_continue) as loader:
        for _ in range(3):
            assert [batch.count for batch in loader] == [11, 11]


def test_a_failing_stage_ends_the_stream_loudly(shards):
    urls, _, _ = shards
    with pytest.warns(UserWarning,
                      match="a stage raised ValueError: stage failure; the rest of stream 0 of epoch 0 in worker 0"):
        with _loader([(urls[0], PER_SHARD)], num_workers=1, shuffle=False, train=False, keys=True,
                     stages=[functools.partial(raise_at, "007")], handler=wdsmp.ignore_and_continue) as loader:
            batches = list(loader)
    assert len(batches) == 5 and batches[1].keys == ["s0/004", "s0/005", "s0/006", "s0/006"]
    assert all(batch.keys == ["s0/006"] * 4 for batch in batches[2:])


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_stage_failing_in_the_first_batch_says_how_far_the_stream_got(shards, num_workers):
    """The warning counts the items read before the stage failed, also before any row of the
    first batch is done."""
    urls, _, _ = shards
    with pytest.warns(UserWarning,
                      match=r"the rest of stream 0 of epoch 0 in worker 0 is lost \(after 2 of its items\)"):
        with _loader([(urls[0], PER_SHARD)], num_workers=num_workers, shuffle=False, shuffle_buffer=0, keys=True,
                     stages=[functools.partial(raise_at, "002")], handler=wdsmp.ignore_and_continue) as loader:
            assert next(iter(loader)).keys == ["s0/000", "s0/001", "s0/001", "s0/001"]


def test_a_bad_sample_is_named_before_a_stage_failing_later_in_the_same_first_batch(shards):
    """Errors come out in the order the stream meets them: the bad JPEG of row 1, not the stage
    that fails at row 3."""
    urls, _, _ = shards
    damaged = _damage(urls[0], "s0/001")
    with _loader([(damaged, PER_SHARD)], num_workers=2, shuffle=False, shuffle_buffer=0,
                 stages=[functools.partial(raise_at, "003")]) as loader:
        with pytest.raises(WorkerError, match="member 's0/001.jpg'") as info:
            next(iter(loader))
    assert info.value.exc_type == "wdsmp.errors.DecodeError"


def test_state_after_an_error_and_set_epoch_keep_the_position(shards):
    urls, _, _ = shards
    damaged = _damage(urls[0], "s0/013")
    with _loader([(damaged, PER_SHARD)], num_workers=1, shuffle=False, train=False) as loader:
        iterator = iter(loader)
        for _ in range(2):
            next(iterator)
        with pytest.raises(WorkerError):
            next(iterator)
            next(iterator)
        state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 3)
    with _loader([(damaged, PER_SHARD)], num_workers=1, shuffle=False, train=False) as loader:
        loader.load_state_dict(state)
        loader.set_epoch(0)  # as a training loop does at the top of each epoch
        assert loader.state_dict()["batches_done"] == 3


def test_batches_copy_and_pickle(shards):
    import copy
    import pickle

    _, index, _ = shards
    with _loader(index, keys=True, copy=True) as loader:
        batch = next(iter(loader))
    for clone in (copy.copy(batch), pickle.loads(pickle.dumps(batch))):
        assert isinstance(clone, Batch) and clone.keys == batch.keys and torch.equal(clone.images, batch.images)


@pytest.mark.parametrize("shuffle_buffer", [0, 64])
def test_resume_is_exact_when_stages_and_the_handler_drop_samples(shards, shuffle_buffer):
    urls, _, _ = shards
    table = [(_damage(urls[0], "s0/004"), PER_SHARD)] + [(url, PER_SHARD) for url in urls[1:]]

    def make():
        return _loader(table, keys=True, seed=5, shuffle_buffer=shuffle_buffer, stages=[wdsmp.select(keep_even)],
                       handler=wdsmp.ignore_and_continue)

    with make() as loader:
        whole = _keys(loader)[0]
    with make() as loader:
        iterator = iter(loader)
        head = [k for _ in range(5) for k in next(iterator).keys]
        state = loader.state_dict()
    assert head == whole[:20] and state["worker_consumed"] != [10, 10]  # filtered items counted
    with make() as loader:
        loader.load_state_dict(state)
        rest = _keys(loader)[0]
    assert head + rest == whole


def _epoch(loader):
    """Keys and pixels (a copy) of one epoch, in order."""
    keys, images = [], []
    for batch in loader:
        keys += batch.keys
        images.append(batch.images.clone())
    return keys, torch.cat(images)


def test_label_and_field_functions_are_called_from_one_thread_in_each_worker(shards, tmp_path):
    """The user's functions may keep state or not be thread-safe: each worker calls them from one
    thread."""
    _, index, labels = shards
    calls = str(tmp_path / "calls")
    with _loader(index, keys=True, label=functools.partial(label_noting_its_thread, calls)) as loader:
        for batch in loader:
            assert [int(label) for label in batch.labels] == [labels[key] for key in batch.keys]
    with open(calls) as stream:
        threads = collections.defaultdict(set)
        for line in stream:
            pid, thread = line.split()
            threads[pid].add(thread)
    assert len(threads) == 2 and all(len(ids) == 1 for ids in threads.values())


@pytest.mark.parametrize("damaged", [False, True])
def test_one_worker_running_both_streams_of_an_epoch_makes_the_epoch_of_two(shards, damaged):
    """An epoch begun with two workers, resumed from its start on one worker that runs both
    streams: keys and pixels (crops drawn from each sample's own generator) are the same, also
    when a sample of the first batch is damaged and the handler skips it."""
    urls, _, _ = shards
    table = [(url, PER_SHARD) for url in urls]
    settings = dict(keys=True, seed=5, batch_size=8, handler=wdsmp.ignore_and_continue)
    if damaged:
        with _loader(table, **settings) as loader:
            key = next(iter(loader)).keys[1]
        shard = int(key[1:key.index("/")])
        table[shard] = (_damage(urls[shard], key), PER_SHARD)
    with _loader(table, **settings) as loader:
        start = loader.state_dict()
        keys, pixels = _epoch(loader)
        assert loader.stats["skipped"] == int(damaged)
    with _loader(table, num_workers=1, **settings) as loader:
        loader.load_state_dict(start)  # the same two streams, in one worker
        one_keys, one_pixels = _epoch(loader)
    assert keys == one_keys and torch.equal(pixels, one_pixels)
    if damaged:
        assert key not in keys[:8] and len(set(keys[:8])) == 8


def test_a_resumed_epoch_draws_the_crops_of_an_uninterrupted_one(shards):
    """Crops and flips come from each sample's own generator, so the batches after a resume are
    the uninterrupted epoch's, pixel for pixel (not only the same samples)."""
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        keys, pixels = _epoch(loader)
    with _loader(index, keys=True, seed=5) as loader:
        iterator = iter(loader)
        head = [next(iterator).images.clone() for _ in range(5)]
        state = loader.state_dict()
    with _loader(index, keys=True, seed=5) as loader:
        loader.load_state_dict(state)
        rest_keys, rest = _epoch(loader)
    assert rest_keys == keys[20:]
    assert torch.equal(torch.cat(head + [rest]), pixels)


def _lines(path):
    with open(path) as stream:
        return len(stream.readlines())


def test_the_next_epoch_goes_ahead_with_the_same_workers(shards, tmp_path):
    """NOTE [next epoch ahead]: the workers start epoch 1 once epoch 0 is made, before
    the next iter(), and keep going; epochs 1 and 2 are what fresh loaders give for them, pixels
    included."""
    _, index, _ = shards
    reads = str(tmp_path / "reads")
    open(reads, "w").close()
    with _loader(index, keys=True, seed=5, stages=[wdsmp.map(functools.partial(note_read, reads))]) as loader:
        first = _epoch(loader)[0]
        deadline = time.monotonic() + 60
        while _lines(reads) <= SHARDS * PER_SHARD and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(first) <= SHARDS * PER_SHARD < _lines(reads)  # epoch 1 is being read
        workers = _worker_pids(loader)
        epochs = [_epoch(loader), _epoch(loader)]
        assert _worker_pids(loader) == workers and loader.epoch == 3
    for epoch, (keys, pixels) in zip((1, 2), epochs):
        with _loader(index, keys=True, seed=5) as fresh:
            fresh.set_epoch(epoch)
            fresh_keys, fresh_pixels = _epoch(fresh)
        assert keys == fresh_keys and torch.equal(pixels, fresh_pixels)


def test_the_next_epoch_starts_while_the_last_batches_wait_to_be_taken(shards, tmp_path):
    """NOTE [next epoch ahead]: once the epoch is made, its last batch not yet taken, a slot handed
    back goes to epoch 1: a loop that trains on its last batches overlaps the next epoch's start."""
    _, index, _ = shards
    reads = str(tmp_path / "reads")
    open(reads, "w").close()
    with _loader(index, keys=True, seed=5, stages=[wdsmp.map(functools.partial(note_read, reads))]) as loader:
        iterator = iter(loader)
        for _ in range(len(loader) - 2):
            next(iterator)
        time.sleep(1.0)  # the workers make the epoch's last batches meanwhile, and say their streams ended
        next(iterator)  # the loader reads that now, and hands back a slot
        deadline = time.monotonic() + 60
        while _lines(reads) <= SHARDS * PER_SHARD and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _lines(reads) > SHARDS * PER_SHARD  # epoch 1 is read, with epoch 0's last batch untaken
        last = next(iterator)
        assert last.epoch == 0 and len(list(iterator)) == 0


@pytest.mark.parametrize("change", ["set_epoch", "load_state_dict"])
def test_another_epoch_than_the_one_gone_ahead_restarts_the_workers(shards, change):
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        iterator = iter(loader)
        head = [k for _ in range(3) for k in next(iterator).keys]
        state = loader.state_dict()
    with _loader(index, keys=True, seed=5) as loader:
        whole = _keys(loader)[0]
        loader.set_epoch(4)
        fourth = _keys(loader)[0]
    with _loader(index, keys=True, seed=5) as loader:
        _keys(loader)  # epoch 1 went ahead
        if change == "set_epoch":
            loader.set_epoch(4)
            assert _keys(loader)[0] == fourth
        else:
            loader.load_state_dict(state)
            assert head + _keys(loader)[0] == whole
        assert _keys(loader)[0] != whole  # and the epoch after that went ahead correctly


def test_an_epoch_left_after_its_last_batch_keeps_its_workers_and_the_epoch_gone_ahead(shards):
    """``zip(range(len(loader)), loader)`` takes every batch but never asks for the end: the next
    iter() ends the epoch as the end would have, and goes on with epoch 1, sent ahead to the
    same workers once epoch 0 was made; epochs 1 and 2 are exact."""
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        fresh = [_keys(loader)[0] for _ in range(3)]
    with _loader(index, keys=True, seed=5) as loader:
        epochs = []
        for _ in range(3):
            epochs.append([k for _, batch in zip(range(len(loader)), loader) for k in batch.keys])
            assert loader.state_dict()["epoch"] == len(epochs)  # as after the epoch's end
            if len(epochs) == 1:
                workers = _worker_pids(loader)
        assert epochs == fresh
        assert _worker_pids(loader) == workers


@pytest.mark.parametrize("left", ["after its last batch", "mid-epoch"])
def test_a_loader_dropped_with_its_iterator_goes_at_once_without_the_collector(shards, left):
    """No reference cycle holds a loader: when the last reference to it and its iterators goes,
    its workers stop and its ring is unlinked, with the cyclic collector switched off."""
    _, index, _ = shards
    gc.disable()
    try:
        loader = _loader(index)
        pids, name = _worker_pids(loader), loader._resources.ring.name
        batches = len(loader) if left == "after its last batch" else 2
        for _ in zip(range(batches), loader):
            pass
        del loader
        assert name not in os.listdir(SHM_DIR) and _gone(pids, 5)
    finally:
        gc.enable()


def test_an_epoch_left_before_its_last_batch_is_taken_restarts_the_workers(shards):
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        fresh = [_keys(loader)[0] for _ in range(2)]
    with _loader(index, keys=True, seed=5) as loader:
        first = [k for _, batch in zip(range(len(loader) - 1), loader) for k in batch.keys]
        workers = _worker_pids(loader)
        assert first == fresh[0][:len(first)]
        assert _keys(loader)[0] == fresh[1]  # as after a break: the next epoch, by new workers
        assert _worker_pids(loader) != workers


def test_a_worker_dead_after_its_part_of_an_epoch_fails_the_next(shards, tmp_path):
    """A worker killed after it made its last batch of epoch 0 (and went on with epoch 1) does not
    fail epoch 0, which is complete; epoch 1 reports it."""
    _, index, _ = shards
    reads = str(tmp_path / "reads")
    open(reads, "w").close()
    with _loader(index, keys=True, seed=5, stages=[wdsmp.map(functools.partial(note_read, reads))]) as loader:
        iterator = iter(loader)
        keys = []
        for _ in range(len(loader)):
            keys += next(iterator).keys
        # Worker 0 makes epoch 1's first batch: once it reads epoch 1, it has said epoch 0 is done
        # (in the global order an epoch reads exactly the samples it hands out).
        assert loader.order == "global"
        deadline = time.monotonic() + 60
        while _lines(reads) <= len(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(_worker_pids(loader)[0], signal.SIGKILL)
        with pytest.raises(StopIteration):
            next(iterator)
        assert len(keys) == SHARDS * PER_SHARD // 4 * 4
        with pytest.raises(WorkerError, match="died with signal SIGKILL"):
            _keys(loader)


def test_a_failure_of_the_epoch_gone_ahead_is_raised_by_its_next_and_kept_in_the_state(shards):
    """NOTE [next epoch ahead]: a worker failing in epoch 1 while epoch 0 is delivered fails
    epoch 1 at its first next() (not iter()), and state_dict() says epoch 1 has not been seen."""
    _, index, _ = shards
    with _loader(index, keys=True, shuffle_buffer=0, stages=[fail_in_the_second_epoch], timeout=60) as loader:
        assert len(_keys(loader)[1]) == len(loader)
        iterator = iter(loader)
        with pytest.raises(WorkerError, match="second epoch"):
            next(iterator)
        state = loader.state_dict()
        assert (state["epoch"], state["batches_done"]) == (1, 0)


def test_set_epoch_to_the_current_epoch_during_it(shards):
    """set_epoch(e) while epoch e runs asks for e again: nothing goes ahead as e + 1, and the
    repeated epoch is e's."""
    _, index, _ = shards
    with _loader(index, keys=True, seed=5, timeout=60) as loader:
        loader.set_epoch(2)
        keys = []
        for batch in loader:
            keys += batch.keys
            loader.set_epoch(2)
        assert _keys(loader)[0] == keys and loader.epoch == 3


def test_a_clean_exit_leaves_nothing_in_dev_shm(shards, tmp_path):
    """A script that closes its loader and exits, the loader still referenced."""
    _, index, _ = shards
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\n"
        "from wdsmp import FastLoader\n"
        "if __name__ == '__main__':\n"
        f"    loader = FastLoader({index!r}, 4, num_workers=2, image_size=8)\n"
        "    for epoch in range(2):\n"
        "        for batch in loader:\n"
        "            pass\n"
        "    loader.close()\n"
        "    print(os.getpid())\n")
    pid = subprocess.run([sys.executable, str(script)], check=True, timeout=120, capture_output=True,
                         text=True).stdout.split()[-1]
    assert not [name for name in os.listdir(SHM_DIR) if f"-{pid}-" in name]


@pytest.mark.parametrize("loaded", [False, True])
def test_an_iter_whose_workers_fail_to_start_is_run_again_by_the_next(shards, monkeypatch, loaded):
    """An epoch left unfinished, then new workers failing to start at the next iter() (a fork
    refused, Ctrl-C): the iter() after that runs the same epoch, or the same loaded state, whole."""
    _, index, _ = shards
    with _loader(index, keys=True, seed=3) as loader:
        state = loader.state_dict()
        expected, _ = _epoch(loader)
    real_workers, failures = resources_module.Workers, []

    def failing_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OSError(11, "Resource temporarily unavailable")
        return real_workers(*args, **kwargs)

    with _loader(index, keys=True, seed=3) as loader:
        next(iter(loader))  # left unfinished: the next iter() starts new workers
        loader.set_epoch(0)
        if loaded:
            loader.load_state_dict(state)
        before = loader.state_dict()
        monkeypatch.setattr(resources_module, "Workers", failing_once)
        with pytest.raises(OSError, match="Resource temporarily unavailable"):
            iter(loader)
        assert failures and loader.state_dict() == before
        keys, _ = _epoch(loader)
    assert keys == expected


@pytest.mark.processes
def test_a_function_of_an_interactive_session_is_refused_at_construction(shards):
    """No worker could import ``__main__`` of ``python -c`` (or a notebook): said at once, with the
    ways out, rather than as a worker dying at the first batch."""
    _, index, _ = shards
    code = textwrap.dedent(f"""
        import wdsmp
        def label(sample):
            return 1
        try:
            wdsmp.FastLoader({index!r}, 4, num_workers=1, image_size=8, label=label)
        except ValueError as exn:
            print(exn)
        with wdsmp.FastLoader({index!r}, 4, num_workers=1, image_size=8, label=label, start_method="fork") as loader:
            print(len(list(loader)))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    message, batches = result.stdout.strip().splitlines()
    assert "defined in an interactive session" in message and "start_method='fork'" in message
    assert batches == str(SHARDS * PER_SHARD // 4)


def test_a_function_that_does_not_pickle_is_refused_at_construction_with_the_ways_out(shards):
    _, index, _ = shards
    with pytest.raises(TypeError, match="must pickle, to reach their processes .*define functions at module level "
                                        r".*start_method='fork'"):
        _loader(index, label=lambda sample: 1)
    with _loader(index, label=lambda sample: 1, start_method="fork") as loader:
        assert {int(label) for batch in loader for label in batch.labels} == {1}


def test_a_state_saved_between_epochs_and_loaded_keeps_the_workers_gone_ahead(shards):
    """``load_state_dict(state_dict())`` at each epoch's end, as a checkpointing loop does: the
    loaded position is the next epoch's start, which the workers went ahead with."""
    _, index, _ = shards
    with _loader(index, keys=True, seed=5) as loader:
        fresh = [_keys(loader)[0] for _ in range(3)]
    with _loader(index, keys=True, seed=5) as loader:
        epochs, workers = [], None
        for _ in range(3):
            epochs.append(_keys(loader)[0])
            loader.load_state_dict(loader.state_dict())
            workers = workers or _worker_pids(loader)
        assert epochs == fresh and _worker_pids(loader) == workers
