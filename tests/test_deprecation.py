"""@deprecated warns, @obsolete refuses unless ALLOW_OBSOLETE=1."""

import pytest

from wdsmp._internal.deprecation import ObsoleteException, deprecated, obsolete


def test_deprecated_warns_and_calls():
    @deprecated
    def plain(x):
        return x + 1

    @deprecated("use other()")
    def with_reason(x):
        return x * 2

    with pytest.warns(DeprecationWarning, match="deprecated function plain"):
        assert plain(1) == 2
    with pytest.warns(DeprecationWarning, match="Reason: use other"):
        assert with_reason(3) == 6
    assert plain.__name__ == "plain" and with_reason.__name__ == "with_reason"


def test_obsolete_needs_allow_obsolete(monkeypatch):
    @obsolete
    def old(x):
        return x

    @obsolete(reason="gone")
    def older(x):
        return -x

    monkeypatch.delenv("ALLOW_OBSOLETE", raising=False)
    with pytest.raises(ObsoleteException, match="obsolete function old"):
        old(1)
    with pytest.raises(ObsoleteException, match="Reason: gone"):
        older(1)
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    assert old(1) == 1 and older(1) == -1
    assert issubclass(ObsoleteException, Exception)
