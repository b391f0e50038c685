"""Start-up: what ``import wdsmp`` and a FastLoader's workers import (NOTE [worker processes] in
``wdsmp/fast/pool.py``). Each check runs in a fresh interpreter."""

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


def test_the_workers_modules_do_not_import_torch():
    assert _python("-c", "import sys, wdsmp.fast.worker; print(sorted({'torch', 'PIL'} & set(sys.modules)))") == "[]"


def test_a_worker_loads_numpy_on_one_thread_and_leaves_the_environment_as_it_was():
    """OpenBLAS's thread per core, spinning as it loads, took CPU from the first batches; the
    workers' environment stays the user's."""
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
    import torch  # as a training script does: the workers must not import it through the script
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
