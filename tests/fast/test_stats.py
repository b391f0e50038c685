"""The loader's throughput figures and their report on stderr."""

from wdsmp.fast.stats import LoaderStats


def test_counts_and_rates():
    stats = LoaderStats()
    assert stats.snapshot(0)["images_per_s"] == 0.0  # not started: no rates, no division by zero
    stats.start()
    stats.add_batch(4, 0.5, epoch=0)
    stats.add_batch(3, 0.25, epoch=0)
    stats.add_stream_end(skipped=2, padded=1)
    figures = stats.snapshot(0)
    assert {k: figures[k] for k in ("batches", "samples", "skipped", "padded", "wait_s", "epoch")} == {
        "batches": 2, "samples": 7, "skipped": 2, "padded": 1, "wait_s": 0.75, "epoch": 0}
    assert figures["elapsed_s"] > 0 and figures["images_per_s"] > 0


def test_reports_only_when_asked(capsys):
    LoaderStats().add_batch(1, 0.0, epoch=0)
    assert capsys.readouterr().err == ""
    stats = LoaderStats(report_every=1e-9)
    stats.start()
    stats.add_batch(5, 0.0, epoch=3)
    assert capsys.readouterr().err.startswith("wdsmp FastLoader: epoch 3, 1 batches, ")
