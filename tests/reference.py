"""Code run with wdsmp and, when it is installed, with webdataset 1.0.2 as the reference: the
helpers that the drop-in and the patch-point tests share. webdataset is never a requirement;
without it the comparisons are skipped."""

import wdsmp
from .conftest import write_tar

try:
    import webdataset
except ImportError:  # a reference when present, never a requirement
    webdataset = None


def libraries():
    """wdsmp, then webdataset when it is installed."""
    return [wdsmp] if webdataset is None else [wdsmp, webdataset]


def same_with_each(user_code):
    """``user_code(wds)`` with wdsmp, checked equal to what webdataset gives when installed."""
    results = [user_code(wds) for wds in libraries()]
    for result in results[1:]:
        assert result == results[0], "webdataset 1.0.2 gives another result"
    return results[0]


def make_shards(tmp_path, nshards, per_shard):
    """``s{i}.tar`` holding samples ``s{i}/{j}`` (keys unique across shards) with a ``txt`` and a ``cls``."""
    urls = []
    for i in range(nshards):
        members = []
        for j in range(per_shard):
            members += [(f"s{i}/{j}.txt", f"txt {i} {j}".encode()), (f"s{i}/{j}.cls", str(100 * i + j).encode())]
        urls.append(write_tar(tmp_path / f"s{i}.tar", members))
    return urls
