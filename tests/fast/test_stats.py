"""Where the loader's time goes: its stage figures, the bottleneck it names, its report on stderr.

The figures are checked on made-up batches; the bottleneck line on real loaders provoked
into each case (a slow training loop, one worker decoding JPEGs, a throttled HTTP server).
"""

import time

import numpy as np
import pytest
import simplejpeg

import wdsmp
from wdsmp.fast.bottleneck import diagnose, shard_source
from wdsmp.fast.messages import BatchReady
from wdsmp.fast.stats import BATCH_FIELDS, STAGES, LoaderStats
from wdsmp.shards.index import write_index


def _times(**values):
    """A BatchReady's ``times`` with ``values`` (milliseconds for the ``*_ns`` fields)."""
    return tuple(int(values.get(name[:-3], 0) * 1e6) if name.endswith("_ns") else values.get(name, 0)
                 for name in BATCH_FIELDS)


def _batch(worker, count, **values):
    return BatchReady(slot=0, worker=worker, epoch=0, index=0, count=count, times=_times(images=count, **values))


def test_figures_by_stage_worker_and_image():
    stats = LoaderStats(num_workers=2)
    assert stats.snapshot(0)["images_per_s"] == 0.0  # nothing yet: no rates, no division by zero
    stats.start()
    stats.add_batch(_batch(0, 4, busy=100, fetch=10, split=5, decode=60, resize=20, write=1, jpeg=4, region=4,
                           scaled=1, shards=1, cache_misses=1), 2_000_000, epoch=0)
    stats.add_batch(_batch(1, 4, busy=50, decode=30, resize=10, slot=8, jpeg=4, region=3), 1_000_000, epoch=0)
    stats.add_stream_end(skipped=2, padded=1)
    figures = stats.snapshot(0)
    assert {k: figures[k] for k in ("batches", "samples", "skipped", "padded", "epoch")} == {
        "batches": 2, "samples": 8, "skipped": 2, "padded": 1, "epoch": 0}
    assert figures["startup_s"] > 0 and "first batch" in figures["interval"]
    assert figures["wait_s"] == pytest.approx(0.001)  # the first batch's wait is start-up, not counted
    assert list(figures["stages"]) == list(STAGES)
    assert figures["stages"]["decode"] == {"seconds": pytest.approx(0.09), "ms_per_image": pytest.approx(90 / 8)}
    assert figures["stages"]["other"]["seconds"] == pytest.approx((100 - 96 + 50 - 48) / 1e3)
    assert figures["worker_busy_s"] == pytest.approx(0.15)
    first, second = figures["workers"]
    assert first["images"] == 4 and first["stages"]["fetch"]["ms_per_image"] == pytest.approx(2.5)
    assert second["stages"]["slot_wait"]["seconds"] == pytest.approx(0.008) and second["busy_s"] == 0.05
    assert figures["decode"] == {"jpeg": 8, "region": 7, "dct_scaled": 1}
    assert figures["shards"] == {"opened": 1, "cache_hits": 0, "cache_misses": 1}
    assert figures["bottleneck"].startswith("decode-bound: ")


def test_rates_with_and_without_startup():
    stats = LoaderStats()
    stats.constructed -= 2_000_000_000  # made two seconds ago
    stats.start()
    stats.add_batch(_batch(0, 10), 0, epoch=0)
    stats.first -= 1_000_000_000  # the first batch came a second ago
    stats.add_batch(_batch(0, 10), 0, epoch=0)
    figures = stats.snapshot(0)
    assert figures["elapsed_s"] == pytest.approx(1.0, abs=0.1)
    assert figures["images_per_s"] == pytest.approx(10.0, rel=0.1)  # the 10 images after the first batch
    assert figures["images_per_s_with_startup"] == pytest.approx(20 / 2.0, rel=0.1)


def test_the_training_loop_time_is_what_it_holds_the_batches():
    stats = LoaderStats()
    stats.start()
    stats.returned()  # nothing was handed out yet
    stats.handed()
    time.sleep(0.01)
    stats.returned()
    stats.returned()  # counted once
    assert stats.totals.training_ns >= 10_000_000
    stats.add_transfer(5)
    assert stats.totals.transfer_ns == 5


def test_reports_only_when_asked(capsys):
    stats = LoaderStats()
    stats.start()
    stats.add_batch(_batch(0, 1), 0, epoch=0)
    assert capsys.readouterr().err == ""
    stats = LoaderStats(report_every=1e-9)
    stats.start()
    stats.add_batch(_batch(0, 5, busy=10, decode=9), 0, epoch=3)
    assert capsys.readouterr().err == ""  # the first batch ends start-up: reports count from there
    stats.add_batch(_batch(0, 5, busy=10, decode=9), 1000, epoch=3)
    assert capsys.readouterr().err.startswith("wdsmp FastLoader: epoch 3, 2 batches, ")


def test_workers_busy_leaves_start_up_out():
    stats = LoaderStats(num_workers=2)
    stats.add_batch(_batch(0, 4, busy=5000), 0, epoch=0)  # a long start-up, in the first batch
    stats.first -= 100_000_000  # the first batch came 100 ms ago
    stats.add_batch(_batch(0, 4, busy=100), 1000, epoch=0)
    stats.add_batch(_batch(1, 4, busy=60, slot=10), 1000, epoch=0)
    assert stats.snapshot(0)["workers_busy"] == pytest.approx((100 + 50) / (2 * 100), rel=0.05)


def _figures(wait=1.0, training=1.0, transfer=0.0, busy=0.9, batches=10, jpeg=0, region=0, misses=0, **seconds):
    stages = {name: {"seconds": seconds.get(name, 0.0), "ms_per_image": 0.0} for name in STAGES}
    return {"batches": batches, "wait_s": wait, "training_s": training, "transfer_s": transfer,
            "wait_fraction": wait / max(wait + training + transfer, 1e-9), "workers_busy": busy, "stages": stages,
            "decode": {"jpeg": jpeg, "region": region, "dct_scaled": 0},
            "shards": {"opened": 1, "cache_hits": 0, "cache_misses": misses}}


@pytest.mark.parametrize("figures, cache_dir, expected", [
    (_figures(batches=0), None, "starting: too few batches"),
    (_figures(wait=0, training=0), None, "starting: too few batches"),
    (_figures(wait=0.1, training=9.9, decode=5), None, "training-bound: the training loop held the batches 99% "
                                                       "of the time and waited for data 1%, workers busy 90%"),
    (_figures(wait=0.1, training=1, transfer=8.9), None, "transfer-bound: copies to the GPU took 89%"),
    (_figures(decode=8, resize=1, fetch=1, jpeg=5, region=5), None,
     "decode-bound: workers busy 90%, training waited 50% of the time: more "),
    (_figures(decode=8, jpeg=5, region=0), None, "region decoding is off"),
    (_figures(fetch=7, decode=3), None, "input-bound: 70% of worker time is reading shards from http://h:1, "
                                        "training waited 50% of the time: use cache_dir="),
    (_figures(fetch=7, decode=3, misses=2), "/c", "the shards are being fetched into cache_dir (/c)"),
    (_figures(fetch=7, decode=3), "/c", "the disk holding cache_dir (/c) is slow"),
    (_figures(split=7, decode=3), None, "input-bound: 70% of worker time is unpacking shards"),
    (_figures(stages=6, decode=4), None, "stage-bound: 60% of worker time is in the stages= given"),
    (_figures(slot_wait=5, decode=1), None, "delivery-bound: training waited 50% of the time while workers waited"),
    (_figures(decode=8, busy=0.4), None, "; the workers were idle 60% of the time (epochs of fewer batches"),
    (_figures(write=6, decode=4), None, "loader-bound: 60% of worker time is spent writing labels"),
    (_figures(decode=8, busy=0.02), None, "startup-bound: training waited 50% of the time while the workers were "
                                          "busy only 2%"),
])
def test_the_bottleneck_in_words(figures, cache_dir, expected):
    assert expected in diagnose(figures, num_workers=1, source="http://h:1", cache_dir=cache_dir)


def test_local_shards_are_advised_a_faster_disk():
    source = shard_source(["/data/a.tar", "/data/b.tar"])
    assert source == "local files in /data"
    assert "faster disk" in diagnose(_figures(fetch=9, decode=1), num_workers=1, source=source)
    assert shard_source(["file:///d/a.tar"]) == "local files in /d"
    assert shard_source(["s3://bucket/x/a.tar"]) == "s3://bucket" and shard_source(["pipe:cat a"]) == "pipe: commands"


# Real loaders, provoked into each case.


def _shards(directory, shards, per_shard, size, noise=20):
    """``shards`` shards of ``per_shard`` JPEGs of ``size`` x ``size``; the index path."""
    rng = np.random.default_rng(3)
    entries = []
    for s in range(shards):
        name = f"part-{s}.tar"
        with wdsmp.TarWriter(str(directory / name)) as sink:
            for i in range(per_shard):
                y, x = np.mgrid[0:size, 0:size]
                pixels = np.stack([x * 255 // size, y * 255 // size, (x * y) % 256], -1)
                pixels = np.clip(pixels + rng.integers(-noise, noise + 1, pixels.shape), 0, 255).astype(np.uint8)
                sink.write({"__key__": f"{s}/{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 95), "cls": str(i)})
        entries.append((name, per_shard))
    write_index(str(directory / "index.json"), entries)
    return str(directory / "index.json")


def test_stage_figures_add_up_to_the_workers_busy_time_and_name_decoding(tmp_path):
    """One worker decoding large JPEGs for a loop that takes them at once: decode-bound. (Large,
    so that the loop's own time per batch, not measured, stays small beside the stages'.)"""
    index = _shards(tmp_path, 2, 24, 640)
    with wdsmp.FastLoader(index, 8, num_workers=1, image_size=64) as loader:
        for _ in loader:
            pass
        figures = loader.stats
    busy = figures["worker_busy_s"]
    stages = figures["stages"]
    measured = sum(stage["seconds"] for name, stage in stages.items() if name != "other")
    assert 0.9 * busy <= measured <= busy  # what is not measured (publishing, the loop) is under 10%
    assert stages["other"]["seconds"] == pytest.approx(busy - measured)
    assert figures["workers"][0]["busy_s"] == busy and figures["workers"][0]["images"] == 48
    assert stages["decode"]["ms_per_image"] == pytest.approx(stages["decode"]["seconds"] * 1e3 / 48)
    # Each shard opened once, each image decoded once.
    assert figures["decode"]["jpeg"] == 48 and figures["shards"]["opened"] == 2
    assert figures["decode"]["region"] == (48 if wdsmp.native.core.jpeg_region_available() else 0)
    assert figures["bottleneck"].startswith("decode-bound: workers busy "), figures


def test_a_loop_slower_than_the_loader_is_training_bound(tmp_path):
    index = _shards(tmp_path, 2, 12, 32)
    with wdsmp.FastLoader(index, 4, num_workers=1, image_size=16) as loader:
        for _ in loader:
            time.sleep(0.2)  # the training step
        figures = loader.stats
    assert figures["training_s"] >= 0.2 * 5
    assert figures["bottleneck"].startswith("training-bound: the training loop held the batches"), figures


def test_a_throttled_server_is_input_bound(tmp_path, http_server):
    _shards(tmp_path, 2, 6, 32)
    urls = []
    for s in range(2):
        urls.append(http_server.put_file(f"part-{s}.tar", (tmp_path / f"part-{s}.tar").read_bytes()))
        http_server.fault(f"part-{s}.tar", "stall", times=None, after=1024, seconds=1.5)
    with wdsmp.FastLoader([(url, 6) for url in urls], 4, num_workers=1, image_size=16, progress=1e-6) as loader:
        for _ in loader:
            pass
        figures = loader.stats
    assert figures["stages"]["fetch"]["seconds"] >= 2 * 1.5
    assert figures["shards"]["opened"] == 2
    assert figures["bottleneck"].startswith("input-bound: ") and f"reading shards from {http_server.endpoint}" \
        in figures["bottleneck"] and "use cache_dir=" in figures["bottleneck"], figures


def test_progress_prints_the_bottleneck(tmp_path, capsys):
    index = _shards(tmp_path, 1, 16, 32)
    with wdsmp.FastLoader(index, 4, num_workers=1, image_size=16, progress=1e-6) as loader:
        list(loader)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" batches, ")[0] for line in lines] == [f"wdsmp FastLoader: epoch 0, {n}" for n in (2, 3, 4)]
    causes = [line.split("images/s; ")[1].split(":")[0] for line in lines]
    assert all(cause == "starting" or cause.endswith("-bound") for cause in causes) and causes[-1] != "starting", lines
