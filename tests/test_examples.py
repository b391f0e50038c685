"""Every Python example of README.md, of the documentation (``docs/``) and of the public
docstrings, run as a user runs it: a script of its own in a fresh interpreter, in a directory
holding the shards it names (local shards, or the local HTTP server, in place of the buckets).

Examples that stand for longer runs are shortened (90 epochs to 2, 147 shards to 3); a fragment
that goes on from the example before it gets ``import wdsmp as wds`` and the names the text
leaves to the reader (``urls``, ``url``, ``transform``, a ``checkpoint`` to resume from, epochs)
from a prelude. An example that asks for a GPU must give its batches where CUDA is, and a
RuntimeError naming CUDA where it is not.
"""

import inspect
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch

import wdsmp
from wdsmp.shards.index import write_index

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # docs pages that include files run none

PRELUDE = '''\
import glob
import wdsmp as wds
from wdsmp import FastLoader

urls = sorted(glob.glob("shards/train-*.tar"))
url = urls[0]
checkpoint, start_epoch, epochs = None, 0, 2


def transform(image):
    return image.resize((32, 32))


'''

# What an example names that is too big, or not here: (pattern, replacement; HTTP is the local server).
SUBSTITUTIONS = [
    (r"s3://bucket/train/train-\{000000\.\.000146\}\.tar", "shards/train-{000000..000002}.tar"),
    (r"\{000000\.\.000146\}", "{000000..000002}"),
    (r"https://host/train-\{000000\.\.000099\}\.tar", "HTTP/train-{000000..000002}.tar"),
    (r"/local/wdsmp-cache", "wdsmp-cache"),
    (r"range\(90\)", "range(2)"),
    (r"range\(start, 90\)", "range(start, 2)"),
]


def page_examples():
    """``(name, code)`` of each ```python block of README.md and of the documentation's pages."""
    examples = []
    for page in PAGES:
        blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
        name = page.relative_to(ROOT)
        examples += [(f"{name} python block {i + 1}", block) for i, block in enumerate(blocks)]
    return examples


def docstring_examples():
    """``(name, code)`` of each ``::`` block in the docstrings of ``wdsmp.__all__`` that is Python
    (not a YAML or JSON document)."""
    examples = []
    for name in sorted(wdsmp.__all__):
        doc = inspect.getdoc(getattr(wdsmp, name)) or ""
        for i, block in enumerate(re.findall(r"::\n\n((?:(?: {4}.*)?\n)+)", doc + "\n")):
            code = textwrap.dedent(block)
            try:
                compile(code, name, "exec")
            except SyntaxError:
                continue
            examples.append((f"wdsmp.{name} docstring block {i + 1}", code))
    return examples


def distinct(examples):
    """Each example's code once, under its first name (the README's quick start repeats the docs')."""
    seen, kept = set(), []
    for name, code in examples:
        if code not in seen:
            seen.add(code)
            kept.append((name, code))
    return kept


EXAMPLES = distinct(page_examples() + docstring_examples())


def test_the_examples_are_found():
    names = [name for name, _ in EXAMPLES]
    assert len([n for n in names if n.startswith("README")]) >= 5
    assert len([n for n in names if n.startswith("docs/")]) >= 8
    assert "wdsmp.FastLoader docstring block 1" in names and "wdsmp.ExactSamples docstring block 1" in names


def _photo_shards(directory, count, per_shard):
    """``count`` shards of ``per_shard`` JPEG samples (with ``.cls``) in ``directory``, and an index."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    paths = []
    for s in range(count):
        paths.append(directory / f"train-{s:06d}.tar")
        with wdsmp.TarWriter(str(paths[-1])) as sink:
            for i in range(per_shard):
                pixels = rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)
                sink.write({"__key__": f"{s:06d}-{i:04d}", "jpg": simplejpeg.encode_jpeg(pixels, 85),
                            "cls": str(i % 10).encode()})
    write_index(str(directory / "index.json"), [(p.name, per_shard) for p in paths])
    return paths


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's directory: ``shards/`` (3 shards of 100, an index: a batch of 256 an epoch) and
    ``data/`` (10 shards of 20)."""
    directory = tmp_path_factory.mktemp("examples")
    _photo_shards(directory / "shards", 3, 100)
    _photo_shards(directory / "data", 10, 20)
    return directory


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("name, code", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_the_example_runs(workdir, http_server, name, code):
    for path in sorted((workdir / "shards").glob("train-*.tar")):
        http_server.put_file(path.name, path.read_bytes())
    for pattern, replacement in SUBSTITUTIONS:
        code = re.sub(pattern, replacement.replace("HTTP", http_server.endpoint), code)
    script = workdir / "example.py"
    script.write_text(PRELUDE + code)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()))  # a torchrun of one process, for the multinode example
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=workdir,
                            env=env)
    if result.returncode != 0 and ".cuda(" in code and not torch.cuda.is_available():
        # an example written for a GPU: it fails as a user without one sees it fail
        assert "RuntimeError: FastLoader.cuda() needs a CUDA device" in result.stderr, result.stderr[-3000:]
        return
    assert result.returncode == 0, f"{name} failed:\n{code}\n{result.stderr[-3000:]}"
