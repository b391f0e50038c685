"""The one stream reader (wdsmp/epochs/stream.py): ExactSamples and FastLoader's workers, given the
same plan, make the same samples in the same order, and resume at the same place."""

import numpy as np
import pytest
import simplejpeg

import wdsmp
from wdsmp.epochs.plan import plan_epoch
from wdsmp.epochs.stream import stream_start

BATCH = 4


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    """3 shards of 10 small JPEG samples: their paths."""
    directory = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(3)
    paths = []
    for s in range(3):
        paths.append(str(directory / f"part-{s}.tar"))
        with wdsmp.TarWriter(paths[-1]) as sink:
            for i in range(10):
                pixels = rng.integers(0, 255, (16, 20, 3), dtype=np.uint8)
                sink.write({"__key__": f"s{s}-{i:02d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": b"1"})
    return paths


def _exact(urls, settings, state=None):
    """ExactSamples' keys (one stream, as without DataLoader workers), batch by batch."""
    source = wdsmp.ExactSamples(urls, batch_size=BATCH, **settings)
    pipeline = wdsmp.DataPipeline(source, wdsmp.to_tuple("__key__"), wdsmp.batched(BATCH, partial=False))
    if state is not None:
        pipeline.load_state_dict(state)
    return pipeline, [list(keys) for (keys,) in pipeline]


def _fast(urls, settings, state=None, stop=None):
    """FastLoader's keys (one worker: one stream), batch by batch; its state after ``stop`` batches."""
    with wdsmp.FastLoader(urls, BATCH, num_workers=1, image_size=8, keys=True, **settings) as loader:
        if state is not None:
            loader.load_state_dict(state)
        batches, saved = [], None
        for batch in loader:
            batches.append(list(batch.keys))
            if len(batches) == stop:
                saved = loader.state_dict()
                break
    return batches, saved


SETTINGS = [  # the shuffle buffer given: the two paths' defaults differ (FastLoader's is on in shard order)
    dict(order="global", seed=4, shuffle_buffer=0),
    dict(order="shards", seed=4, shuffle_buffer=0),
    dict(order="shards", seed=4, shuffle_buffer=6),
    dict(order="global", seed=9, shuffle_buffer=0, policy="pad", rank=1, world_size=2),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_both_paths_read_the_same_plan_alike_and_resume_alike(urls, settings):
    _, whole = _exact(urls, settings)
    assert _fast(urls, settings)[0] == whole and len(whole) >= 3
    keys = [key for batch in whole for key in batch]
    assert len(set(keys)) == len(keys) or settings.get("policy") == "pad"
    for stop in range(1, len(whole)):  # every resume position
        head, state = _fast(urls, settings, stop=stop)
        assert head == whole[:stop]
        rest, _ = _fast(urls, settings, state=state)
        assert rest == whole[stop:], f"FastLoader resumed after {stop} batches"
        pipeline, _ = _exact(urls, settings)
        exact_state = dict(pipeline.state_dict(), epoch=0, batches_done=stop)  # the epoch read above
        assert _exact(urls, settings, state=exact_state)[1] == whole[stop:], f"ExactSamples resumed after {stop}"


def test_where_a_resumed_stream_starts():
    """Skipped by count unless something reorders or drops: then replayed and dropped."""
    plan = plan_epoch(((f"s{i}.tar", 10) for i in range(3)), 0, batch_size=BATCH, seed=1, rank=0,
                      world_size=1, num_streams=1, policy="drop", shuffle=True, order="shards").streams[0]
    from dataclasses import replace

    resumed = replace(plan, skip_batches=2)
    plain, buffered = stream_start(resumed, 0), stream_start(resumed, 6)
    assert (plain.replay, plain.drop, plain.taken, plain.read) == (False, resumed.discard, 8, 8)
    assert (buffered.replay, buffered.drop, buffered.taken, buffered.read) == (True, 8, 8, 0)
    counted = stream_start(replace(resumed, consumed=11), 0)
    assert (counted.replay, counted.drop, counted.taken, counted.read) == (True, 11, 11, 0)
