"""FastLoader written the way users write it, each form in a fresh interpreter as a script runs it:
the loader a temporary (``for images, labels in FastLoader(urls, batch_size=256):``), its iterator
the only thing holding it (NOTE [shutdown order] in ``wdsmp/fast/loader.py``). Not marked
``processes``: they run in the pure-Python pass too, as users run the loader either way."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import simplejpeg
import torch

import wdsmp

SHARDS, PER_SHARD, BATCH = 2, 12, 4  # 6 batches an epoch

_SCRIPT = textwrap.dedent("""
    import itertools, os, sys, time
    import psutil
    import torch
    from wdsmp import FastLoader

    URLS = sys.argv[2:]


    def batches_of_a_function():
        return iter(FastLoader(URLS, batch_size=4, num_workers=2, image_size=16))


    class Labels(torch.utils.data.IterableDataset):
        # A dataset whose DataLoader worker runs a FastLoader of its own.

        def __init__(self, urls, start_method):
            self.urls, self.start_method = urls, start_method

        def __iter__(self):
            for images, labels in FastLoader(self.urls, batch_size=4, num_workers=2, image_size=16,
                                             start_method=self.start_method):
                yield labels


    def workers():
        # The script's child processes but multiprocessing's resource tracker and fork server.
        children = [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
        return [p for p in children if not any(helper in " ".join(p.cmdline())
                                               for helper in ("resource_tracker", "forkserver"))]


    def gone(seconds=10):
        deadline = time.monotonic() + seconds
        while workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not workers() and not [n for n in os.listdir("/dev/shm") if f"-{os.getpid()}-" in n]


    if __name__ == "__main__":
        form = sys.argv[1]
        if form == "for":
            shapes = set()
            for images, labels in FastLoader(URLS, batch_size=4, num_workers=2, image_size=16):
                shapes.add((tuple(images.shape), tuple(labels.shape)))
            print("batches", sorted(shapes), gone())
        elif form == "next":
            images, labels = next(iter(FastLoader(URLS, batch_size=4, num_workers=2, image_size=16)))
            print("shape", tuple(images.shape), int(labels.sum()) >= 0, gone())
        elif form == "islice":
            print("batches", len(list(itertools.islice(FastLoader(URLS, batch_size=4, num_workers=2,
                                                                  image_size=16), 3))), gone())
        elif form == "function":
            print("batches", sum(1 for _ in batches_of_a_function()), gone())
        elif form == "cuda":
            try:
                count = sum(1 for _ in FastLoader(URLS, batch_size=4, num_workers=2, image_size=16).cuda())
                print("batches", count, gone())
            except RuntimeError as exn:  # its traceback holds the loader until the handler is done
                named = "CUDA" in str(exn)
            else:
                sys.exit()
            print("error", named, torch.cuda.is_available(), gone())
        elif form in ("in a DataLoader worker", "forked in a DataLoader worker"):
            try:
                method = "fork" if form.startswith("forked") else "spawn"
                loader = torch.utils.data.DataLoader(Labels(URLS, method), batch_size=None, num_workers=1,
                                                     multiprocessing_context="forkserver")
                print("batches", sum(1 for _ in loader), gone())
            except Exception as exn:
                print("error", "start_method='spawn' (the default)" in str(exn), gone())
        elif form == "dropped":
            batches = iter(FastLoader(URLS, batch_size=4, num_workers=2, image_size=16))
            next(batches)
            before = len(workers())
            del batches  # mid-epoch, no close(), no with
            print("workers", before, gone())
""")


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("usage")
    rng = np.random.default_rng(3)
    paths = []
    for s in range(SHARDS):
        paths.append(str(directory / f"train-{s}.tar"))
        with wdsmp.TarWriter(paths[-1]) as sink:
            for i in range(PER_SHARD):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                sink.write({"__key__": f"{s}/{i:03d}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": b"3"})
    return paths


def _run(tmp_path, form, urls):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    result = subprocess.run([sys.executable, str(script), form, *urls], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr[-3000:]
    return result.stdout.strip().split(maxsplit=1)


@pytest.mark.parametrize("form, expected", [
    ("for", ["batches", "[((4, 16, 16, 3), (4,))] True"]),
    ("next", ["shape", "(4, 16, 16, 3) True True"]),
    ("islice", ["batches", "3 True"]),
    ("function", ["batches", f"{SHARDS * PER_SHARD // BATCH} True"]),
    ("dropped", ["workers", "2 True"]),
    ("in a DataLoader worker", ["batches", f"{SHARDS * PER_SHARD // BATCH} True"]),
])
def test_the_loader_as_a_temporary_lives_as_long_as_its_iterator(tmp_path, urls, form, expected):
    """Each form gets its batches, and the loader's workers and ring are gone once it ends (the
    dropped one within seconds of ``del``), with no close() and no ``with``."""
    assert _run(tmp_path, form, urls) == expected


def test_a_loader_in_a_dataloader_worker_spawns_its_workers_and_a_forking_one_says_why_not(tmp_path, urls):
    """A DataLoader worker is a daemonic process, which multiprocessing lets start no process:
    spawned FastLoader workers need none of it; fork is refused at construction, saying so."""
    assert _run(tmp_path, "forked in a DataLoader worker", urls) == ["error", "True True"]


def test_cuda_inline_gives_batches_on_a_gpu_and_an_error_naming_cuda_without(tmp_path, urls):
    expected = (["batches", f"{SHARDS * PER_SHARD // BATCH} True"] if torch.cuda.is_available()
                else ["error", "True False True"])
    assert _run(tmp_path, "cuda", urls) == expected
