"""Start-up: what ``import wdsmp``, a FastLoader's fork server and its workers import (NOTE [light
workers] in ``wdsmp/fast/pool.py``). Each check runs in a fresh interpreter."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import simplejpeg

import wdsmp


def _python(*args):
    """stdout of ``python args``, which must succeed."""
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_import_wdsmp_is_light_and_every_public_name_still_resolves():
    code = textwrap.dedent("""
        import sys
        import wdsmp as wds
        light = "torch" not in sys.modules
        missing = [name for name in wds.__all__ if getattr(wds, name, None) is None]
        assert not missing, missing
        assert set(wds.__all__) <= set(dir(wds))
        assert wds.filters.to_tuple is wds.to_tuple and wds.autodecode.Decoder is wds.Decoder
        try:
            wds.no_such_name
        except AttributeError as exn:
            assert "no_such_name" in str(exn)
        else:
            raise AssertionError("wds.no_such_name did not raise AttributeError")
        from wdsmp import *
        assert WebDataset is wds.WebDataset and FastLoader is wds.FastLoader
        import wdsmp.gopen
        assert wds.gopen is sys.modules["wdsmp.gopen"].gopen  # the function, not its module
        print(light)
    """)
    assert _python("-c", code) == "True"


def test_the_fork_servers_preload_does_not_import_torch():
    assert _python("-c", "import sys, wdsmp.fast.worker; print(sorted({'torch', 'PIL'} & set(sys.modules)))") == "[]"


def test_the_fork_server_loads_numpy_on_one_thread_and_leaves_the_environment_as_it_was():
    """NOTE [light workers]: OpenBLAS's thread per core, spinning as it loads, took CPU from the
    first batch; the workers' environment stays the user's."""
    code = textwrap.dedent("""
        import os
        os.environ["MKL_NUM_THREADS"] = "3"
        before = dict(os.environ)
        import wdsmp.fast.numpy_one_thread
        print(len(os.listdir("/proc/self/task")), os.environ == before)
    """)
    assert _python("-c", code) == "1 True"


_SCRIPT = textwrap.dedent("""
    import sys
    import torch  # as a training script does: the fork server must not import it through the script
    import wdsmp
    from probe import torch_imported

    if __name__ == "__main__":
        fields = {"torch": (torch_imported, (), "uint8")}
        with wdsmp.FastLoader(sys.argv[1:], 2, num_workers=2, image_size=16, fields=fields) as loader:
            print(sorted({int(value) for batch in loader for value in batch.fields["torch"]}))
""")

_PROBE = textwrap.dedent("""
    import sys

    def torch_imported(sample):
        return int("torch" in sys.modules)
""")


def _two_shards(directory):
    """Two shards of four small JPEGs in ``directory``; their paths."""
    urls = []
    for s in range(2):
        urls.append(str(directory / f"part-{s}.tar"))
        with wdsmp.TarWriter(urls[-1]) as sink:
            for i in range(4):
                pixels = np.full((20, 24, 3), 40 * i, np.uint8)
                sink.write({"__key__": f"{s}-{i}", "jpg": simplejpeg.encode_jpeg(pixels, 90), "cls": b"1"})
    return urls


def test_workers_of_a_script_that_imports_torch_do_not_import_torch(tmp_path):
    urls = _two_shards(tmp_path)
    (tmp_path / "probe.py").write_text(_PROBE)
    (tmp_path / "train.py").write_text(_SCRIPT)
    assert _python(str(tmp_path / "train.py"), *urls) == "[0]"  # probe.py is beside it, on sys.path


_WHEN_THE_SERVER_STARTS = textwrap.dedent("""
    import json, sys, time
    from multiprocessing import forkserver
    import wdsmp
    import wdsmp.fast.loader

    def running():
        return forkserver._forkserver._forkserver_pid is not None

    def label(sample):
        return 1

    if __name__ == "__main__":
        urls, what = sys.argv[1:-1], sys.argv[-1]
        settings = dict(num_workers=2, image_size=16, keys=True)
        if what == "state":
            with wdsmp.FastLoader(urls, 2, **settings) as loader:
                batches = iter(loader)
                next(batches)
                print(json.dumps(loader.state_dict()))
        elif what == "resumed":
            state = json.loads(sys.stdin.read())
            wdsmp.fast.loader.FORK_SERVER_DELAY = 60  # not by the timer here
            with wdsmp.FastLoader(urls, 2, **settings) as loader:
                built = running()
                loader.load_state_dict(state)
                print(built, running(), len(list(loader)))
        elif what == "pause":  # a script that builds its model before the loop
            with wdsmp.FastLoader(urls, 2, **settings) as loader:
                time.sleep(wdsmp.fast.loader.FORK_SERVER_DELAY + 1)
                print(running(), len(list(loader)))
        else:  # a label function of the script's own: workers import the script, so does the server
            with wdsmp.FastLoader(urls, 2, label=label, **settings) as loader:
                print(running())
""")


def test_the_fork_server_starts_at_once_where_the_workers_make_the_first_batch(tmp_path):
    """NOTE [first batch here]: a loader whose first batch its own process makes starts the fork
    server after it, or FORK_SERVER_DELAY after construction where the script does other things
    first; one resumed mid-epoch (its first batch is the workers'), or whose workers import the
    script (a slow server start), starts it as soon as it knows."""
    urls = _two_shards(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(_WHEN_THE_SERVER_STARTS)
    state = _python(str(script), *urls, "state")
    result = subprocess.run([sys.executable, str(script), *urls, "resumed"], input=state, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "True", "3"]  # 4 batches an epoch, one seen before
    assert _python(str(script), *urls, "label") == "True"
    assert _python(str(script), *urls, "pause").split() == ["True", "4"]
