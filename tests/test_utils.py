"""Tests of the webdataset helpers in wdsmp.utils: symbols, safe_eval, deprecation, security."""

import numpy as np
import pytest

import wdsmp.utils as utils


def test_lookup_sym():
    from wdsmp import filters

    assert utils.lookup_sym("shuffle", [".filters"]) is filters.shuffle
    assert utils.lookup_sym("shuffle", [".tenbin", "wdsmp.filters"]) is filters.shuffle  # first that has it
    assert utils.lookup_sym("no_such_name", [".filters", ".tenbin"]) is None


def test_safe_eval_values():
    assert utils.safe_eval("42") == 42
    assert utils.safe_eval("1e3") == 1000.0
    assert utils.safe_eval("True") is True
    assert utils.safe_eval("abc", '"{}"') == "abc"
    assert utils.safe_eval("7", "int({}) * 2") == 14
    assert utils.safe_eval("3", "({},)") == (3,)


@pytest.mark.parametrize("text", ["__import__", "a b", "os.system", "1+1", "x;y", "'q'", "open()", None])
def test_safe_eval_refuses_unsafe_input(text):
    with pytest.raises(ValueError, match="safe_eval"):
        utils.safe_eval(text)


@pytest.mark.parametrize("name", ["os", "open", "eval", "exec", "getattr", "sys", "np", "utils"])
def test_safe_eval_reaches_no_module_or_dangerous_builtin(name):
    with pytest.raises(NameError):
        utils.safe_eval(name)
    with pytest.raises(NameError):
        utils.safe_eval(name, "{}('x')")


def test_deprecated_warns_and_calls():
    @utils.deprecated
    def plain(x):
        return x + 1

    @utils.deprecated("use other()")
    def with_reason(x):
        return x * 2

    with pytest.warns(DeprecationWarning, match="deprecated function plain"):
        assert plain(1) == 2
    with pytest.warns(DeprecationWarning, match="Reason: use other"):
        assert with_reason(3) == 6
    assert plain.__name__ == "plain" and with_reason.__name__ == "with_reason"


def test_obsolete_needs_allow_obsolete(monkeypatch):
    @utils.obsolete
    def old(x):
        return x

    @utils.obsolete(reason="gone")
    def older(x):
        return -x

    monkeypatch.delenv("ALLOW_OBSOLETE", raising=False)
    with pytest.raises(utils.ObsoleteException, match="obsolete function old"):
        old(1)
    with pytest.raises(utils.ObsoleteException, match="Reason: gone"):
        older(1)
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    assert old(1) == 1 and older(1) == -1
    assert issubclass(utils.ObsoleteException, Exception)


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


def test_enforce_security_cannot_be_assigned(monkeypatch):
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(AttributeError, match="WDS_SECURE"):
        utils.enforce_security = False  # would silently leave the program without the security it asked for
    assert utils.enforce_security is True
