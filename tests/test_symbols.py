"""Names to objects: lookup_sym, and safe_eval's limits."""

import pytest

from wdsmp._internal.symbols import lookup_sym, safe_eval


def test_lookup_sym():
    from wdsmp import filters

    assert lookup_sym("shuffle", [".filters"]) is filters.shuffle
    assert lookup_sym("shuffle", [".tenbin", "wdsmp.filters"]) is filters.shuffle  # first that has it
    assert lookup_sym("no_such_name", [".filters", ".tenbin"]) is None


def test_safe_eval_values():
    assert safe_eval("42") == 42
    assert safe_eval("1e3") == 1000.0
    assert safe_eval("True") is True
    assert safe_eval("abc", '"{}"') == "abc"
    assert safe_eval("7", "int({}) * 2") == 14
    assert safe_eval("3", "({},)") == (3,)


@pytest.mark.parametrize("text", ["__import__", "a b", "os.system", "1+1", "x;y", "'q'", "open()", None])
def test_safe_eval_refuses_unsafe_input(text):
    with pytest.raises(ValueError, match="safe_eval"):
        safe_eval(text)


@pytest.mark.parametrize("name", ["os", "open", "eval", "exec", "getattr", "sys", "np", "utils"])
def test_safe_eval_reaches_no_module_or_dangerous_builtin(name):
    with pytest.raises(NameError):
        safe_eval(name)
    with pytest.raises(NameError):
        safe_eval(name, "{}('x')")
