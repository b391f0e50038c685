"""The epoch plan: exactly once across ranks and streams, equal batches per rank, determinism, resume."""

import pickle
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsmp.epochs.plan import POLICIES, PlanPosition, plan_epoch, round_robin_share, shard_order

SETTINGS = settings(max_examples=150, deadline=None)
counts_st = st.lists(st.integers(0, 30), min_size=1, max_size=10)
config_st = st.fixed_dictionaries({
    "world_size": st.integers(1, 4),
    "num_streams": st.integers(1, 4),
    "batch_size": st.integers(1, 8),
    "policy": st.sampled_from(POLICIES),
    "seed": st.integers(0, 2**40),
})


def table(counts):
    return [(f"shard-{i:03d}.tar", count) for i, count in enumerate(counts)]


def samples(ranges):
    """``[(shard, sample, pad), ...]`` of shard ranges with known stops."""
    return [(r.shard, i, r.pad) for r in ranges for i in range(r.start, r.stop)]


def rank_plans(shards, position=0, **config):
    return [plan_epoch(shards, position, rank=rank, **config) for rank in range(config["world_size"])]


def budget(total, config):
    world, size = config["world_size"], config["batch_size"]
    if config["policy"] == "drop":
        return total // world // size * size
    per_rank = -(-total // world)  # ceil
    return -(-per_rank // size) * size


def delivered(plan, resume=True):
    """The rank's batches in delivery order, as ``{index: samples}`` (known counts)."""
    batches = {}
    for stream in plan.streams:
        read = samples(stream.shards(resume))
        first = stream.skip_batches if resume else 0
        size = plan.batch_size
        for j in range(stream.num_batches - first):
            batches[stream.stream + (first + j) * plan.num_streams] = read[j * size:(j + 1) * size]
        assert len(read) == (stream.num_batches - first) * size
    return batches


def expect_too_small(counts, config):
    total = sum(counts)
    if total == 0:
        with pytest.raises(ValueError, match="hold no samples"):
            plan_epoch(table(counts), batch_size=config["batch_size"], policy=config["policy"])
        return True
    if budget(total, config) == 0:
        with pytest.raises(ValueError, match="too few for .* ranks of batch_size .* use policy='pad'"):
            rank_plans(table(counts), **config)
        return True
    return False


# -- samples mode: all counts known


@SETTINGS
@given(counts_st, config_st, st.integers(0, 5))
def test_every_sample_is_read_exactly_once_and_ranks_get_equal_batches(counts, config, epoch):
    if expect_too_small(counts, config):
        return
    plans = rank_plans(table(counts), epoch, **config)
    total, world, size = sum(counts), config["world_size"], config["batch_size"]
    per_rank = budget(total, config)
    everything = [(shard, i) for shard, count in enumerate(counts) for i in range(count)]
    read = [s for plan in plans for stream in plan.streams for s in samples(stream.ranges)]
    real = [(shard, i) for shard, i, pad in read if not pad]
    padding = [(shard, i) for shard, i, pad in read if pad]
    dropped = [(shard, i) for shard, i, _ in samples(plans[0].dropped)]
    assert sorted(real + dropped) == everything  # each sample once: read, or dropped by the policy
    assert set(padding) <= set(everything)
    assert len(read) == world * per_rank
    if config["policy"] == "pad":
        assert dropped == [] and len(padding) == world * per_rank - total
    else:
        assert padding == [] and len(dropped) == total - world * per_rank
    for plan in plans:
        assert plan.mode == "samples" and plan.batches_per_rank == per_rank // size == plan.remaining
        assert plan.dropped == plans[0].dropped and plan.order == plans[0].order
        assert [w.num_batches for w in plan.streams] == list(round_robin_share(per_rank // size,
                                                                               config["num_streams"]))
        assert sorted(delivered(plan)) == list(range(plan.batches_per_rank))
        assert all(len(batch) == size for batch in delivered(plan).values())


@pytest.mark.parametrize("policy", POLICIES)
def test_two_ranks_of_two_workers_partition_the_samples(policy):
    counts = [7, 3, 11, 0, 5, 9]  # 35 samples
    plans = rank_plans(table(counts), 1, world_size=2, num_streams=2, batch_size=4, seed=3, policy=policy)
    assert [p.batches_per_rank for p in plans] == ([4, 4] if policy == "drop" else [5, 5])
    regions = [set(samples(w.ranges)) for p in plans for w in p.streams]
    for a in range(len(regions)):
        for b in range(a + 1, len(regions)):
            assert not {s[:2] for s in regions[a] if not s[2]} & {s[:2] for s in regions[b] if not s[2]}
    real = {s[:2] for region in regions for s in region if not s[2]}
    dropped = {s[:2] for s in samples(plans[0].dropped)}
    assert real | dropped == {(shard, i) for shard, count in enumerate(counts) for i in range(count)}
    assert len(real) == (32 if policy == "drop" else 35) and len(dropped) == (3 if policy == "drop" else 0)


def test_a_shard_may_be_split_between_ranks_and_workers():
    plans = rank_plans([("a.tar", 10)], world_size=2, num_streams=2, batch_size=2, policy="drop")
    ranges = [[(r.url, r.start, r.stop) for r in w.ranges] for p in plans for w in p.streams]
    assert ranges == [[("a.tar", 0, 2)], [("a.tar", 2, 4)], [("a.tar", 4, 6)], [("a.tar", 6, 8)]]
    assert [(r.start, r.stop) for r in plans[0].dropped] == [(8, 10)]


def test_pad_repeats_from_the_start_of_the_epoch_order():
    plans = rank_plans([("a.tar", 5)], world_size=2, num_streams=1, batch_size=2, policy="pad")
    assert [(r.start, r.stop, r.pad) for r in plans[1].streams[0].ranges] == [(4, 5, False), (0, 3, True)]
    tiny = rank_plans([("a.tar", 1)], world_size=2, num_streams=1, batch_size=3, policy="pad")
    assert [(r.start, r.stop, r.pad) for r in tiny[1].streams[0].ranges] == [(0, 1, True)] * 3


@SETTINGS
@given(counts_st, config_st, st.integers(0, 3), st.data())
def test_resume_yields_exactly_the_remainder(counts, config, epoch, data):
    if expect_too_small(counts, config):
        return
    rank = data.draw(st.integers(0, config["world_size"] - 1))
    full = plan_epoch(table(counts), epoch, rank=rank, **config)
    done = data.draw(st.integers(0, full.batches_per_rank))
    resumed = plan_epoch(table(counts), PlanPosition(epoch, done), rank=rank, **config)
    batches = delivered(full)
    assert delivered(resumed) == {i: batches[i] for i in range(done, full.batches_per_rank)}
    assert resumed.remaining == full.batches_per_rank - done and resumed.batches_done == done
    assert [w.skip_batches for w in resumed.streams] == list(round_robin_share(done, config["num_streams"]))
    assert delivered(resumed, resume=False) == batches  # a replaying stream sees all of its ranges
    with_counts = PlanPosition(epoch, done, round_robin_share(done, config["num_streams"]))
    assert plan_epoch(table(counts), with_counts, rank=rank, **config) == resumed


def test_resume_at_the_end_of_an_epoch_is_empty_and_past_it_is_an_error():
    config = dict(batch_size=2, num_streams=2)
    assert plan_epoch([("a", 8)], PlanPosition(0, 4), **config).remaining == 0
    with pytest.raises(ValueError, match="past the end of the epoch"):
        plan_epoch([("a", 8)], PlanPosition(0, 5), **config)
    with pytest.raises(ValueError, match=r"worker_batches \(3, 0\) do not fit the plan's 2 streams of \(2, 2\)"):
        plan_epoch([("a", 8)], PlanPosition(0, 3, (3, 0)), **config)
    with pytest.raises(ValueError, match="do not fit the plan's 2 streams"):
        plan_epoch([("a", 8)], PlanPosition(0, 3, (1, 1, 1)), **config)


def test_a_position_may_have_any_split_of_batches_between_streams():
    """After a resume with another worker count, streams advance at their own pace."""
    config = dict(batch_size=2, num_streams=2)
    plan = plan_epoch([("a", 8)], PlanPosition(0, 2, (2, 0)), **config)
    assert [w.skip_batches for w in plan.streams] == [2, 0] and plan.remaining == 2
    assert [list(w.shards()) for w in plan.streams] == [[], list(plan.streams[1].ranges)]


# -- determinism


@SETTINGS
@given(counts_st, config_st, st.integers(0, 5))
def test_plans_are_deterministic_and_pickle(counts, config, epoch):
    if sum(counts) == 0 or budget(sum(counts), config) == 0:
        return
    first = plan_epoch(table(counts), epoch, **config)
    assert plan_epoch(table(counts), epoch, **config) == first
    assert pickle.loads(pickle.dumps(first)) == first
    assert len({w.seed for w in first.streams}) == config["num_streams"]


def test_the_order_changes_with_epoch_and_seed_only():
    orders = [shard_order(20, seed=7, epoch=e) for e in range(4)]
    assert len({tuple(o) for o in orders}) == 4 and all(sorted(o) == list(range(20)) for o in orders)
    assert shard_order(20, seed=7, epoch=0) == orders[0]
    assert shard_order(20, seed=8, epoch=0) != orders[0]
    assert shard_order(20, seed=7, epoch=0, shuffle=False) == list(range(20))
    plans = rank_plans(table([5] * 20), 2, world_size=3, batch_size=2, seed=7, policy="drop")
    assert all(p.order == tuple(shard_order(20, 7, 2)) for p in plans)
    assert plan_epoch(table([5] * 20), 3, batch_size=2, seed=7).order != plans[0].order


# -- shards mode: counts unknown


@SETTINGS
@given(st.integers(1, 12), config_st, st.integers(0, 3))
def test_unknown_counts_fall_back_to_whole_shards(nshards, config, epoch):
    urls = [f"shard-{i:03d}.tar" for i in range(nshards)]
    world = config["world_size"]
    if config["policy"] == "drop" and nshards < world:
        with pytest.raises(ValueError, match="too few for .* ranks with policy='drop'"):
            rank_plans(urls, epoch, **config)
        return
    plans = rank_plans(urls, epoch, **config)
    per_rank = nshards // world if config["policy"] == "drop" else -(-nshards // world)
    assigned = [(r.shard, r.pad) for p in plans for w in p.streams for r in w.ranges]
    real = [shard for shard, pad in assigned if not pad]
    assert sorted(real + [r.shard for r in plans[0].dropped]) == list(range(nshards))
    assert len(assigned) == world * per_rank
    for plan in plans:
        assert plan.mode == "shards" and plan.batches_per_rank is None and plan.remaining is None
        sizes = [len(w.ranges) for w in plan.streams]
        assert sum(sizes) == per_rank and max(sizes) - min(sizes) <= 1
        assert all(r.start == 0 and r.stop is None and r.url == urls[r.shard] for w in plan.streams for r in w.ranges)
        assert all(w.num_batches is None and w.discard == 0 for w in plan.streams)


def test_unknown_counts_resume_needs_worker_batches():
    urls = ["a.tar", "b.tar", "c.tar"]
    with pytest.raises(ValueError, match="needs the position's worker_batches"):
        plan_epoch(urls, PlanPosition(0, 5), batch_size=4, num_streams=2)
    with pytest.raises(ValueError, match="worker_batches for 3 workers, the plan has 2"):
        plan_epoch(urls, PlanPosition(0, 5, (2, 2, 1)), batch_size=4, num_streams=2)
    plan = plan_epoch(urls, PlanPosition(0, 5, (4, 1)), batch_size=4, num_streams=2)
    assert [(w.skip_batches, w.discard) for w in plan.streams] == [(4, 16), (1, 4)]
    assert [list(w.shards()) for w in plan.streams] == [list(w.ranges) for w in plan.streams]


def test_some_unknown_counts_mean_whole_shards_with_the_known_stops():
    plan = plan_epoch([("a.tar", 4), "b.tar"], batch_size=2, shuffle=False)
    assert plan.mode == "shards"
    assert [(r.url, r.stop) for r in plan.streams[0].ranges] == [("a.tar", 4), ("b.tar", None)]


def test_exact_false_deals_out_whole_shards_and_names_what_it_leaves_out():
    shards = [("a.tar", 10), ("b.tar", 50), ("c.tar", 23), ("d.tar", 37), ("e.tar", 8)]
    plans = [plan_epoch(shards, 2, batch_size=16, rank=r, world_size=2, shuffle=False, exact=False) for r in (0, 1)]
    assert [p.mode for p in plans] == ["shards", "shards"] and [r.url for r in plans[0].dropped] == ["e.tar"]
    assert plans[0].notice().startswith("epoch 2 deals out whole shards to ranks (exact=False, or sample counts "
                                        "unknown): 1 shard (8 samples) read by no rank, by policy='drop'")
    assert plans[1].notice() is None  # what no rank reads is said once, by rank 0
    padded = plan_epoch(shards, 0, batch_size=16, rank=1, world_size=2, shuffle=False, exact=False, policy="pad")
    assert [r.url for r in padded.repeated] == ["a.tar"]
    assert "1 shard (10 samples) read twice by rank 1, by policy='pad'" in padded.notice()
    unknown = plan_epoch([url for url, _ in shards], 0, batch_size=16, world_size=2, shuffle=False)
    assert "1 shard (samples unknown) read by no rank" in unknown.notice()
    assert plan_epoch(shards, 0, batch_size=16, world_size=2).notice() is None  # exact: nothing to say


# -- resampled mode


def resampled(position=0, counts=(5, 0, 7, 3), **kw):
    config = dict(batch_size=4, seed=11, num_streams=2, world_size=2, resampled=True, epoch_batches=9)
    config.update(kw)
    return plan_epoch(table(list(counts)), position, **config)


def draws(stream, n=40):
    return [(r.shard, r.start) for r in islice(stream.shards(), n)]


def test_resampled_draws_are_deterministic_per_seed_epoch_rank_worker():
    plan = resampled()
    assert plan.mode == "resampled" and plan.batches_per_rank == 9 and plan.order == ()
    assert [w.num_batches for w in plan.streams] == [5, 4]
    reference = draws(plan.streams[0])
    assert draws(resampled().streams[0]) == reference
    assert draws(pickle.loads(pickle.dumps(plan)).streams[0]) == reference
    assert all(shard != 1 for shard, _ in reference)  # empty shards are never handed out
    others = [resampled().streams[1], resampled(rank=1).streams[0], resampled(1).streams[0],
              resampled(seed=12).streams[0]]
    assert all(draws(w) != reference for w in others)
    assert resampled(rank=1).batches_per_rank == 9


def test_resampled_resume_skips_the_delivered_samples():
    full, resumed = resampled(), resampled(PlanPosition(0, 5))
    for before, after in zip(full.streams, resumed.streams):
        stream = [s for r in islice(before.shards(), 60) for s in samples([r])]
        skip = after.skip_batches * 4
        assert after.discard == 0 and skip > 0
        assert [s for r in islice(after.shards(), 40) for s in samples([r])][:100] == stream[skip:skip + 100]
        assert list(islice(after.shards(resume=False), 20)) == list(islice(before.shards(), 20))


def test_resampled_with_unknown_counts_discards():
    plan = plan_epoch(["a.tar", "b.tar"], PlanPosition(2, 3), batch_size=4, num_streams=2, resampled=True,
                      epoch_batches=10)
    assert [(w.skip_batches, w.discard) for w in plan.streams] == [(2, 8), (1, 4)]
    assert all(r.start == 0 and r.stop is None for r in islice(plan.streams[0].shards(), 10))


# -- validation


@pytest.mark.parametrize("args, kwargs, match", [
    ([], dict(batch_size=1), "at least one shard"),
    ([3], dict(batch_size=1), "a URL or a"),
    ([("a", 1, 2)], dict(batch_size=1), "a URL or a"),
    ([(b"a", 1)], dict(batch_size=1), "a URL or a"),
    ([("a", -1)], dict(batch_size=1), "sample count of 'a' must be an int >= 0"),
    ([("a", 1.5)], dict(batch_size=1), "sample count of 'a'"),
    (["a"], dict(batch_size=0), "batch_size must be an int >= 1"),
    (["a"], dict(batch_size=True), "batch_size must be an int >= 1"),
    (["a"], dict(batch_size=1, world_size=0), "world_size must be an int from 1 to 1048576"),
    (["a"], dict(batch_size=1, rank=2, world_size=2), "rank 2 is not below world_size 2"),
    (["a"], dict(batch_size=1, rank=-1), "rank must be"),
    (["a"], dict(batch_size=1, num_streams=0), "num_streams must be an int from 1 to 65536"),
    (["a"], dict(batch_size=1, policy="partial"), "policy must be one of"),
    (["a"], dict(batch_size=1, epoch_batches=5), "applies to resampled=True only"),
    (["a"], dict(batch_size=1, resampled=True), "epoch_batches"),
    ([("a", 0)], dict(batch_size=1, resampled=True, epoch_batches=2), "hold no samples"),
    (["a"], dict(batch_size=1, resampled=True, epoch_batches=2, num_streams=2,
                 position=PlanPosition(0, 2, (0, 2))), "do not fit the plan's 2 streams"),
])
def test_bad_arguments(args, kwargs, match):
    position = kwargs.pop("position", 0)
    with pytest.raises(ValueError, match=match):
        plan_epoch(args, position, **kwargs)


@pytest.mark.parametrize("args, match", [
    ((-1,), "epoch must be an int >= 0"),
    ((0, -1), "batches_done must be"),
    ((0, 3, (1, 1)), r"do not add up to batches_done=3"),
    ((0, 2, (3, -1)), "worker_batches entries must be"),
])
def test_bad_positions(args, match):
    with pytest.raises(ValueError, match=match):
        PlanPosition(*args)


# -- elastic resume: an epoch saved on W ranks goes on on W' ranks


def _stream_samples(stream):
    """(shard, index) of each sample a stream reads, in order, with its pad flag."""
    if stream.order == "global":
        return [(shard, index, pad) for shard, index, _, pad in stream.samples(resume=False)]
    return [(r.shard, i, r.pad) for r in stream.ranges for i in range(r.start, r.stop)]


@pytest.mark.parametrize("order", ["global", "shards"])
@pytest.mark.parametrize("worlds", [(2, 3), (3, 2), (4, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_elastic_resume_deals_the_rest_at_most_once_in_equal_batches(order, worlds, policy):
    old, new = worlds
    counts = [37, 12, 50, 23, 8, 41]
    table = [(f"s{i}.tar", n) for i, n in enumerate(counts)]
    bsize, streams, done = 4, 3, 5
    common = dict(batch_size=bsize, seed=9, policy=policy, order=order)
    delivered = []
    for rank in range(old):
        plan = plan_epoch(table, 2, rank=rank, world_size=old, num_streams=streams, **common)
        taken = round_robin_share(done, streams)
        for stream, n in zip(plan.streams, taken):
            delivered += _stream_samples(stream)[: n * bsize]
    rest, batches = [], set()
    for rank in range(new):
        plan = plan_epoch(table, PlanPosition(2, origin=(old, done, streams)), rank=rank, world_size=new,
                          num_streams=2, **common)
        batches.add(plan.batches_per_rank)
        for stream in plan.streams:
            got = _stream_samples(stream)
            assert len(got) == stream.num_batches * bsize
            rest += got
    assert len(batches) == 1  # equal batches on every new rank
    real = [s[:2] for s in delivered + rest if not s[2]]
    if policy == "drop":
        assert len(real) == len(set(real))  # each sample at most once in the whole epoch
    fresh = [s[:2] for s in rest]
    assert not set(fresh) & {s[:2] for s in delivered if not s[2]} or policy == "pad"
    total = sum(counts)
    plain = plan_epoch(table, 2, world_size=old, num_streams=streams, **common).batches_per_rank
    left = old * (plain - done) * bsize
    assert batches.pop() == (left // new // bsize if policy == "drop" else -(-(-(-left // new)) // bsize))
    assert len(set(s[:2] for s in delivered + rest)) <= total


def test_elastic_resume_of_a_finished_epoch_position_is_past_its_end():
    table = [("a", 40)]
    with pytest.raises(ValueError, match="past the end of the epoch it was saved in"):
        plan_epoch(table, PlanPosition(0, origin=(2, 6, 1)), batch_size=4, world_size=3)


def test_elastic_resume_in_global_order_does_not_depend_on_the_old_ranks_streams():
    """In global order a rank's batch i comes from stream i % S, so the first d batches delivered are
    the rank's first d * B positions whatever S each old rank had (ranks may run other worker counts)."""
    table = [(f"s{i}.tar", n) for i, n in enumerate([37, 12, 50, 23, 8, 41])]
    bsize, done, common = 4, 5, dict(batch_size=4, seed=4, policy="drop", order="global")
    delivered = []
    for rank, streams in enumerate((2, 3, 1)):
        plan = plan_epoch(table, 1, rank=rank, world_size=3, num_streams=streams, **common)
        for stream, n in zip(plan.streams, round_robin_share(done, streams)):
            delivered += [s[:2] for s in _stream_samples(stream)[: n * bsize]]
    rest = []
    for rank in range(2):
        plan = plan_epoch(table, PlanPosition(1, origin=(3, done, 2)), rank=rank, world_size=2, num_streams=3,
                          **common)
        rest += [s[:2] for stream in plan.streams for s in _stream_samples(stream)]
    assert len(delivered + rest) == len(set(delivered + rest))
    assert len(rest) == 2 * ((3 * (sum(n for _, n in table) // 3 // bsize - done) * bsize) // 2 // bsize) * bsize


def test_the_global_permutation_is_fixed_by_its_seed():
    """The same seed gives the same order on every rank, worker and numpy (PCG64's raw stream)."""
    table = [("a", 5), ("b", 3)]
    plan = plan_epoch(table, 0, batch_size=1, seed=11, order="global")
    first = [(shard, index) for shard, index, _, _ in plan.streams[0].samples()]
    assert sorted(first) == [(0, i) for i in range(5)] + [(1, i) for i in range(3)]
    assert first == [(1, 2), (0, 0), (0, 2), (0, 3), (0, 1), (0, 4), (1, 0), (1, 1)]  # pinned: a change breaks resumes
