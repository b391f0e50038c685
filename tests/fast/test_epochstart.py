"""An epoch's tasks on their way to the workers (``wdsmp.fast.epochstart``): who gets the threads,
who waits. The workers are stand-ins that keep what they are sent; the plans are real."""

import dataclasses
import threading
import time
import types

import pytest

from wdsmp.epochplan import plan_epoch
from wdsmp.fast.epochstart import EpochStart, release_after
from wdsmp.fast.messages import BatchReady
from wdsmp.fast.worker import FirstBatch


class _Queue(list):
    put = list.append


def _workers(count):
    return types.SimpleNamespace(tasks=[_Queue() for _ in range(count)], broken=False)


def _plan(num_streams):
    return plan_epoch([(f"/data/shard-{i}.tar", 40) for i in range(4)], 0, batch_size=4, num_streams=num_streams)


def test_the_first_batch_is_made_together_and_the_other_workers_wait_for_it():
    """NOTE [first batch together] in worker.py."""
    plan, workers = _plan(3), _workers(3)
    start = EpochStart(workers, plan, [[0], [1], [2]], threads=2)
    assert [len(q) for q in workers.tasks] == [1, 0, 0] and workers.tasks[0][0].threads == 2
    start.note(BatchReady(0, 0, 0, 0, 4, 4, 0, None))
    assert [len(q) for q in workers.tasks] == [1, 1, 1]
    assert [q[0].threads for q in workers.tasks] == [2, 1, 1]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_after_a_batch_made_here_the_next_is_made_together_and_the_wait_is_bounded(num_workers):
    """NOTE [first batch here] in worker.py: the next batch's worker gets the threads; the others
    wait, at most as long as the batch made here took (the loop's first step may be long, and only
    its next request would release them otherwise); the worker of the batch made here pads with
    its last row."""
    plan, workers = _plan(num_workers), _workers(num_workers)
    made = []

    def make_first(worker, stream, threads):
        made.append((worker, stream.stream, threads))
        time.sleep(0.05)
        return FirstBatch(("ready",), dataclasses.replace(stream, skip_batches=1, consumed=4), {"images": "row"})

    start = EpochStart(workers, plan, [[w] for w in range(num_workers)], threads=2, make_first=make_first)
    assert made == [(0, 0, 2)] and start.made_here and start.early == ["ready"] and start.made_in >= 0.05
    next_worker = 1 if num_workers > 1 else 0  # the next batch is stream 1's first, else stream 0's second
    assert [len(q) for q in workers.tasks] == [int(w == next_worker or num_workers == 1) for w in range(num_workers)]
    stop = threading.Event()
    stop.set()
    release_after(start, stop)  # shut down meanwhile: nothing sent
    assert sum(map(len, workers.tasks)) == 1
    began = time.monotonic()
    release_after(start, threading.Event())
    assert time.monotonic() - began >= start.made_in and all(len(q) == 1 for q in workers.tasks)
    tasks = [q[0] for q in workers.tasks]
    assert tasks[0].plans[0].skip_batches == 1 and tasks[0].last_rows == {0: {"images": "row"}}
    assert all(task.last_rows is None for task in tasks[1:])
    assert [task.threads for task in tasks] == [2 if w == next_worker else 1 for w in range(num_workers)]
