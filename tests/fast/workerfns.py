"""Stages, label and field functions the FastLoader tests hand to workers.

A worker unpickles a function by importing the module that defines it; the test modules
import torch (through ``wdsmp.fast.loader``), which costs each worker about two seconds,
while this module imports nothing a worker does not already have.
"""

import gc
import os
import threading
import time


def keep_even(sample):
    return int(sample["cls"]) % 2 == 0


def add_double(sample):
    return dict(sample, double=str(2 * int(sample["cls"])).encode())


def label_plus_one(sample):
    return int(sample["cls"]) + 1


def label_noting_its_thread(path, sample):
    """The sample's label, after appending "pid thread" to the file at ``path``."""
    with open(path, "a") as stream:
        stream.write(f"{os.getpid()} {threading.get_ident()}\n")
    return int(sample["cls"])


def label_frozen(sample):
    """1 if the worker froze what it inherited out of the garbage collector's reach, else 0."""
    return int(gc.get_freeze_count() > 0)


def without_key(samples):
    for sample in samples:
        yield {k: v for k, v in sample.items() if k != "__key__"}


def below_forty(sample):
    return int(sample["cls"]) < 40


def raise_at(suffix, samples):
    for sample in samples:
        if sample["__key__"].endswith(suffix):
            raise ValueError("stage failure")
        yield sample


def note_read(path, sample):
    """Append the sample's key to the file at ``path``: which samples a worker read, and when."""
    with open(path, "a") as stream:
        stream.write(sample["__key__"] + "\n")
    return sample


def none_at_five(samples):
    for sample in samples:
        yield None if sample["__key__"] == "k/005" else sample


def three_point_seven(sample):
    return 3.7


def out_of_range(sample):
    return [300, -1, 1.9e10, float("nan")]


def deadlock_at_six(samples):
    for sample in samples:
        if sample["__key__"] == "k/006":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # for ever
        yield sample


def sleep_a_second(samples):
    for sample in samples:
        time.sleep(1.0)
        yield sample

_STREAM_RUNS = [0]  # streams a worker process ran this stage on


def fail_in_the_second_epoch(samples):
    """Epoch 0 passes; in the next epoch a worker fails at once. Stream 1 (32 samples, not the
    epoch's last batch) ends a second late, so the epoch 0 iterator is still waiting for it
    when the other worker, gone ahead, fails."""
    _STREAM_RUNS[0] += 1
    first, seen = _STREAM_RUNS[0] == 1, 0
    try:
        for sample in samples:
            if not first:
                raise ValueError("second epoch")
            seen += 1
            yield sample
    finally:
        if first and seen == 32:
            time.sleep(1)


def report_environment(inbox, outbox, tag):
    """A ``WorkerPool`` target: sends what the worker process found (its sys.path and sys.argv,
    whether torch or the parent's script were imported, a script's own flag), then echoes what
    it receives until the pipe closes."""
    import sys

    main = sys.modules.get("__mp_main__")
    outbox.send({"tag": tag, "sys.path": sys.path, "sys.argv": sys.argv, "torch": "torch" in sys.modules,
                 "script": getattr(main, "SCRIPT_FLAG", None),
                 "flags": [sys.flags.isolated, sys.flags.ignore_environment, sys.flags.no_user_site,
                           sys.flags.optimize]})
    while True:
        try:
            outbox.send(inbox.recv())
        except EOFError:
            return


def exit_with(inbox, outbox, code):
    """A ``WorkerPool`` target: says goodbye, then exits with ``code``."""
    outbox.send("goodbye")
    os._exit(code)


def busy_child_at_three(samples):
    """At k/003, wait for a program that computes for 3 s (the worker itself idle meanwhile)."""
    import subprocess
    import sys

    for sample in samples:
        if sample["__key__"] == "k/003":
            subprocess.run([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"],
                           check=True)
        yield sample


def hung_child_at_three(path, samples):
    """At k/003, wait for a program that never ends (its pid written to ``path`` first)."""
    import subprocess

    for sample in samples:
        if sample["__key__"] == "k/003":
            child = subprocess.Popen(["sleep", "600"])
            with open(path, "w") as stream:
                stream.write(str(child.pid))
            child.wait()
        yield sample
