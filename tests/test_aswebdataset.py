"""``wdsmp.install_as_webdataset()``: a library that imports webdataset itself (here a small one
written as timm or open_clip write theirs) runs on wdsmp unedited, in the script's process and
in DataLoader workers made by fork, spawn and forkserver; each run in a fresh interpreter."""

import os
import subprocess
import sys
import textwrap

import pytest

import wdsmp

LIBRARY = '''
"""A third-party library: it imports webdataset in every form projects use."""
import sys

import webdataset as wds
import webdataset.shardlists
from webdataset.autodecode import imagehandler
from webdataset import WebDataset


def where(sample):
    """Which library this process's ``webdataset`` is, asked in the worker that runs it."""
    import webdataset
    return sample + (webdataset.__name__, webdataset.shardlists.__name__, imagehandler.__module__)


def make_dataset(urls):
    return WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls").map(where)
'''

SCRIPT = '''
import sys
import wdsmp

wdsmp.install_as_webdataset()   # at the top level: spawned workers import this script first

import torch.utils.data
import thirdparty

if __name__ == "__main__":
    import webdataset
    print("main", webdataset is wdsmp, type(thirdparty.make_dataset(URLS)).__module__)
    for method in ("fork", "spawn", "forkserver"):
        loader = torch.utils.data.DataLoader(thirdparty.make_dataset(URLS), batch_size=None, num_workers=2,
                                             multiprocessing_context=method)
        samples = list(loader)
        print(method, len(samples), sorted({tuple(sample[2:]) for sample in samples}))
'''


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    directory = tmp_path_factory.mktemp("aswebdataset")
    (directory / "thirdparty.py").write_text(LIBRARY)
    urls = []
    for s in range(2):
        url = str(directory / f"shard-{s}.tar")
        with wdsmp.TarWriter(url) as sink:
            for i in range(5):
                sink.write({"__key__": f"{s}-{i}", "jpg": _jpeg(), "cls": i})
        urls.append(url)
    return directory, urls


def _jpeg():
    import io

    import PIL.Image

    stream = io.BytesIO()
    PIL.Image.new("RGB", (8, 8), (10, 20, 30)).save(stream, "JPEG")
    return stream.getvalue()


def _run(directory, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory), os.getcwd()]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env,
                          cwd=directory)


@pytest.mark.processes  # DataLoader workers under fork, spawn and forkserver, in a script of its own
def test_a_library_importing_webdataset_runs_on_wdsmp_in_every_worker(library):
    directory, urls = library
    script = directory / "train.py"
    script.write_text(f"URLS = {urls!r}\n" + SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory), os.getcwd()])),
                          cwd=directory)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "main True wdsmp.compat"
    expected = str([("wdsmp", "wdsmp.shardlists", "wdsmp.autodecode")])
    assert lines[1:] == [f"{method} 10 {expected}" for method in ("fork", "spawn", "forkserver")]


def test_submodules_and_patches_are_shared(library):
    directory, _ = library
    done = _run(directory, textwrap.dedent("""
        import wdsmp
        wdsmp.install_as_webdataset()
        wdsmp.install_as_webdataset()   # idempotent
        import webdataset, webdataset.gopen, webdataset.tariterators
        from webdataset import gopen, tariterators
        assert webdataset is wdsmp and callable(gopen) and gopen is wdsmp.gopen   # the function, as in webdataset
        assert webdataset.tariterators is wdsmp.tariterators is tariterators
        def opener(data, handler=None):
            return []
        webdataset.tariterators.url_opener = opener   # a patch through either name is seen by both
        assert wdsmp.tariterators.url_opener is opener
        import importlib
        for name in wdsmp.aswebdataset.WEBDATASET_MODULES:
            assert importlib.import_module("webdataset." + name) is importlib.import_module("wdsmp." + name)
        try:
            import webdataset.multi
        except ImportError as exn:
            print("multi", type(exn).__name__)
    """))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["multi", "ModuleNotFoundError"]


def test_called_after_webdataset_was_imported_it_warns():
    pytest.importorskip("webdataset")
    done = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent("""
        import webdataset as early
        import wdsmp
        wdsmp.install_as_webdataset()
        import webdataset
        print(webdataset is wdsmp, early is wdsmp)
    """)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
    assert "webdataset was imported before it" in done.stderr
