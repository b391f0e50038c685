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


    def workers():
        # The script's child processes but multiprocessing's resource tracker.
        children = [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
        return [p for p in children if "resource_tracker" not in " ".join(p.cmdline())]


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
])
def test_the_loader_as_a_temporary_lives_as_long_as_its_iterator(tmp_path, urls, form, expected):
    """Each form gets its batches, and the loader's workers and ring are gone once it ends (the
    dropped one within seconds of ``del``), with no close() and no ``with``."""
    assert _run(tmp_path, form, urls) == expected


def test_cuda_inline_gives_batches_on_a_gpu_and_an_error_naming_cuda_without(tmp_path, urls):
    expected = (["batches", f"{SHARDS * PER_SHARD // BATCH} True"] if torch.cuda.is_available()
                else ["error", "True False True"])
    assert _run(tmp_path, "cuda", urls) == expected
