"""Tests of the webdataset helpers in wdsmp.utils that live there: iteration helpers,
sample weights, the security flag; the names it re-exports are tested with their modules."""

import os

import numpy as np
import pytest

import wdsmp
import wdsmp.utils as utils


def test_repeatedly():
    assert list(utils.repeatedly([1, 2, 3], nepochs=2)) == [1, 2, 3, 1, 2, 3]
    assert list(utils.repeatedly([1, 2, 3], nbatches=5)) == [1, 2, 3, 1, 2]
    assert list(utils.repeatedly(iter([1, 2]))) == [1, 2]  # an exhausted iterator ends it
    batches = [([1, 2],), ([3, 4],), ([5, 6],)]
    assert list(utils.repeatedly(batches, nsamples=3)) == batches[:2]


def test_compute_sample_weights():
    weights = utils.compute_sample_weights([(100, 1.0), (50, 1.0), (10, 5.0)])
    np.testing.assert_allclose(weights, [1.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="at least one"):
        utils.compute_sample_weights([])
    with pytest.raises(ValueError, match="one positive"):
        utils.compute_sample_weights([(0, 1), (5, 0)])


def test_enforce_security_follows_the_environment(monkeypatch):
    monkeypatch.delenv("WDS_SECURE", raising=False)
    assert utils.enforce_security is False
    monkeypatch.setenv("WDS_SECURE", "1")
    assert utils.enforce_security is True  # read when asked, not at import
    assert "enforce_security" in dir(utils)


def test_enforce_security_assignment_sets_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WDS_SECURE", "1")
    utils.enforce_security = False  # webdataset's switch: overrides WDS_SECURE for the process
    assert utils.enforce_security is False and os.environ["WDS_SECURE"] == "0"
    path = tmp_path / "x"
    path.write_bytes(b"x")
    with wdsmp.gopen(str(path)) as stream:
        assert stream.read() == b"x"
    utils.enforce_security = True
    assert utils.enforce_security is True and os.environ["WDS_SECURE"] == "1"
    with pytest.raises(wdsmp.ShardError, match="refused in secure mode"):
        wdsmp.gopen(str(path))
    with pytest.raises(TypeError, match="True or False"):
        utils.enforce_security = "yes"
