"""Batches a DataLoader worker stacks into recycled shared memory (``wdsmp/_recycledshm.py``): the
values ``torch.stack`` gives, and memory written again only once no process holds the batch in
it: not while the main process keeps the batch, a numpy view of it, or has passed it to another
process."""

import os
import sys

import numpy as np
import psutil
import pytest
import torch
import torch.multiprocessing
import torch.utils.data

import wdsmp

pytestmark = [pytest.mark.processes,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd and inotify are Linux's")]

SHAPE = (4, 128, 128)  # 256 KB of float32: a batch of 8 is 2 MB, past the 1 MB it takes to recycle


def _samples():
    """Each worker's own samples: a tensor filled with its number, and that number as label; 84
    of them, so that the last batch (4 samples, 1 MB) has a size of its own."""
    info = torch.utils.data.get_worker_info()
    for i in range(84):
        number = 1000 * info.id + i
        yield torch.full(SHAPE, float(number)), number


def loader(workers=2, **options):
    """Forked workers unless told otherwise: the only ones that recycle (Python 3.14's default
    start method is forkserver)."""
    dataset = wdsmp.DataPipeline(_samples, wdsmp.batched(8))
    options.setdefault("multiprocessing_context", "fork")
    return torch.utils.data.DataLoader(dataset, num_workers=workers, batch_size=None, **options)


def intact(images, labels):
    """Whether each image still holds its label's number, as it was stacked."""
    numbers = torch.as_tensor(np.asarray(labels), dtype=torch.float32)
    expected = numbers.reshape(-1, *[1] * (images.dim() - 1)).expand_as(images)
    return torch.equal(images, expected)


def inode(images):
    fd, _ = images.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def test_batches_let_go_of_are_recycled_and_hold_what_was_stacked():
    inodes = []
    for images, labels in loader():
        assert images.is_shared() and images.shape[1:] == SHAPE and images.dtype == torch.float32
        assert intact(images, labels)
        inodes.append(inode(images))
        del images
    assert len(inodes) == 22
    assert len(set(inodes)) <= 16  # written again into batches let go of (7-9 files seen, more under load)


def test_kept_batches_and_numpy_views_are_never_written_again():
    kept = []
    for step, (images, labels) in enumerate(loader()):
        kept.append((images if step % 2 else images.numpy(), labels))  # a view alone keeps the batch
        del images
    assert len(kept) == 22
    assert all(intact(torch.as_tensor(images), labels) for images, labels in kept)
    assert len({inode(torch.as_tensor(images)) for images, _ in kept}) == 22


def _hold(queue, verdict):
    images, labels = queue.get()
    queue.get()  # the main process has gone on by then, letting go of its own copy long ago
    verdict.put(intact(images, labels))


def test_a_batch_passed_to_another_process_is_kept_for_it():
    context = torch.multiprocessing.get_context("spawn")
    queue, verdict = context.Queue(), context.Queue()
    child = context.Process(target=_hold, args=(queue, verdict))
    child.start()
    try:
        batches = iter(loader())
        queue.put(next(batches))
        for images, labels in batches:  # each worker needs new memory for each batch meanwhile
            assert intact(images, labels)
            del images
        queue.put("done")
        assert verdict.get(timeout=60) is True
    finally:
        child.join(60)
        queue.close()
        verdict.close()
    assert child.exitcode == 0


def test_small_batches_and_batches_outside_workers_stack_as_torch_does():
    plain = list(wdsmp.DataPipeline(_one_worker_samples, wdsmp.batched(8)))
    assert all(not images.is_shared() and intact(images, labels) for images, labels in plain)
    small = wdsmp.DataPipeline(lambda: ((torch.full((3,), float(i)), i) for i in range(16)), wdsmp.batched(8))
    received = list(torch.utils.data.DataLoader(small, num_workers=1, batch_size=None))
    assert [intact(images, labels) for images, labels in received] == [True, True]


def _one_worker_samples():
    for i in range(16):
        yield torch.full(SHAPE, float(i)), i


def test_under_the_file_system_strategy_batches_go_to_new_memory_with_the_same_values():
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        received = [(images, labels) for images, labels in loader()]  # all kept: values must hold
        names = {images.untyped_storage()._share_filename_cpu_()[1] for images, _ in received}
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
    assert len(received) == 22 and all(intact(images, labels) for images, labels in received)
    assert len(names) == 22


def test_spawned_workers_of_a_file_system_process_write_each_batch_into_new_memory():
    """A spawned worker shares by file descriptor whatever the process taking its batches does.
    That process, under ``file_system``, moves a batch it shares again (``share_memory_()``)
    into memory of its own, letting go of the file the batch came in while the batch lives on
    in torch's cache of received files: a later batch written into that file would come out of
    the cache with the old values. Such workers must not recycle."""
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        kept = []
        for images, labels in loader(workers=1, multiprocessing_context="spawn"):
            images.share_memory_()
            kept.append((images, labels))
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
    assert len(kept) == 11 and all(intact(images, labels) for images, labels in kept)


def test_new_batch_memory_turns_recycling_off(monkeypatch):
    monkeypatch.setenv("WDSMP_NEW_BATCH_MEMORY", "1")
    inodes = []
    for images, labels in loader():
        assert intact(images, labels)
        inodes.append(inode(images))
        del images
    assert len(inodes) == len(set(inodes)) == 22


def test_programs_a_worker_runs_inherit_none_of_its_batch_memory():
    """Every descriptor of a worker's memfds, torch's duplicates among them, closes on exec."""
    batches = iter(loader(workers=1))
    for _ in range(4):
        next(batches)
    flags = {}
    for child in psutil.Process().children():  # the worker, and whatever earlier tests left exiting
        try:
            for fd in os.listdir(f"/proc/{child.pid}/fd"):
                if os.readlink(f"/proc/{child.pid}/fd/{fd}").startswith("/memfd:wdsmp-batch"):
                    with open(f"/proc/{child.pid}/fdinfo/{fd}") as info:
                        line = next(line for line in info if line.startswith("flags:"))
                    flags[child.pid, fd] = int(line.split()[1], 8)
        except FileNotFoundError:  # gone meanwhile
            continue
    del batches
    assert len(flags) >= 3  # the segments' own, and torch's duplicates of them
    assert all(value & os.O_CLOEXEC for value in flags.values()), flags
