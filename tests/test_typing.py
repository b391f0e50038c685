"""The public API is typed: every callable in ``wdsmp.__all__`` annotates its parameters and
its return, and the package ships ``py.typed`` (PEP 561) so that type checkers read them.

What is checked, for each callable name of ``wdsmp.__all__``: a function itself; a class's
``__init__``, ``__call__``, public methods and property getters (those wdsmp defines, not
those it inherits from torch or the builtins); an object called as a function (a curried
stage such as ``wds.map``, ``wds.gzfilter``) its class's ``__call__``. Every parameter but
``self``/``cls`` needs an annotation, ``*args`` and ``**kw`` too, and so does the return
(``-> None`` included). mypy (configured in pyproject.toml) checks that the annotations agree
with the code; this test that they are there.
"""

import ast
import inspect
import sys
from pathlib import Path

import pytest

import wdsmp

ROOT = Path(__file__).resolve().parents[1]

# The dunder methods checked with a class's public methods (the others, __iter__ or __repr__, are
# not asked for).
CHECKED_DUNDERS = ("__init__", "__call__")


def _in_module(module, modules):
    return any(module == m or module.startswith(m + ".") for m in modules)


def _defined_by_wdsmp(function):
    module = getattr(function, "__module__", None) or ""
    return module == "wdsmp" or module.startswith("wdsmp.")


def _methods(cls):
    """``(name, function)`` for the methods of ``cls`` that this test checks."""
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in CHECKED_DUNDERS:
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property):
            raw = raw.fget
        if inspect.isfunction(raw) and _defined_by_wdsmp(raw):
            yield name, raw


def _checked():
    """``(label, function)`` for every function the public API consists of."""
    for name in wdsmp.__all__:
        value = getattr(wdsmp, name)
        if not callable(value):
            continue
        if inspect.isclass(value):
            for method, function in _methods(value):
                yield f"{name}.{method}", function
        elif inspect.isfunction(value):
            yield name, value
        else:  # an object called as a function: a curried stage, a handler
            call = inspect.getattr_static(type(value), "__call__")
            if inspect.isfunction(call) and _defined_by_wdsmp(call):
                yield f"{name} ({type(value).__name__}.__call__)", call


def _missing_annotations(function):
    """What ``function`` leaves unannotated: parameter names, and "return"."""
    signature = inspect.signature(function)
    missing = [p.name for i, p in enumerate(signature.parameters.values())
               if p.annotation is inspect.Parameter.empty and not (i == 0 and p.name in ("self", "cls"))]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_the_check_covers_the_api():
    labels = [label for label, _ in _checked()]
    assert len(labels) > 150  # functions, classes' methods and curried stages, not an empty walk
    for expected in ("WebDataset.__init__", "WebDataset.shuffle", "DataPipeline.with_epoch", "ShardWriter.write",
                     "detshuffle.epoch", "map (RestCurried.__call__)", "gzfilter (GzipFilter.__call__)", "gopen"):
        assert expected in labels


def test_every_public_callable_is_annotated():
    unannotated = {label: missing for label, function in _checked()
                   if (missing := _missing_annotations(function))}
    assert unannotated == {}, ("public callables with unannotated parameters or return (a parameter "
                               f"name, or 'return'): {unannotated}")


def test_mypy_refuses_unannotated_definitions_everywhere():
    """pyproject.toml has mypy refuse unannotated and half-annotated definitions, and exempts
    no module from it."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["disallow_untyped_defs"] is True and mypy["disallow_incomplete_defs"] is True
    exempt = [override["module"] for override in mypy.get("overrides", [])
              if override.get("disallow_untyped_defs") is False or override.get("disallow_incomplete_defs") is False]
    assert exempt == []


def test_every_function_in_the_package_is_annotated():
    """Each function and method of wdsmp annotates its parameters (but ``self``/``cls``) and its
    return (``__init__`` may leave it out), as mypy's settings ask; counted from the source, so
    the figure does not depend on what mypy skips."""
    unannotated = []
    for path in sorted((ROOT / "wdsmp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            arguments += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
            bare = [a.arg for a in arguments if a.annotation is None and a.arg not in ("self", "cls")]
            if bare or (node.returns is None and node.name != "__init__"):
                unannotated.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert unannotated == []


def test_the_check_finds_an_unannotated_callable():
    def annotated(self, x: int, *args: str, **kw: float) -> None:
        """A method with everything annotated."""

    def unannotated(self, x: int, *args, key=None, **kw):
        """A method with parameters and a return left unannotated."""

    assert _missing_annotations(annotated) == []
    assert _missing_annotations(unannotated) == ["args", "key", "kw", "return"]


def test_type_checkers_see_the_lazily_imported_names():
    """``wdsmp/__init__.py`` imports the public names on first use (its ``__getattr__``); its
    ``if _TYPE_CHECKING:`` block imports every one of them, from the module ``_PUBLIC`` names,
    so that type checkers know their types rather than ``__getattr__``'s Any."""
    tree = ast.parse((ROOT / "wdsmp" / "__init__.py").read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
              and node.test.id == "_TYPE_CHECKING"]
    assert len(blocks) == 1
    imported = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            assert alias.asname is None
            imported[alias.name] = node.module  # None: a submodule (from . import tenbin)
    expected = {name: module for module, names in wdsmp._PUBLIC.items() for name in names}
    expected.update({name: None for name in wdsmp.__all__ if inspect.ismodule(getattr(wdsmp, name))})
    assert imported == expected
    assert set(imported) | {"gopen"} == set(wdsmp.__all__)  # gopen: imported at run time, above the block


def test_py_typed_is_in_the_package():
    assert (Path(wdsmp.__file__).parent / "py.typed").is_file()
    assert (ROOT / "wdsmp" / "py.typed").is_file()


def test_py_typed_is_package_data():
    """pyproject.toml lists py.typed as package data of wdsmp, so that wheels and sdists carry it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["wdsmp"]
    assert "wdsmp*" in setuptools["packages"]["find"]["include"]  # the package the data belongs to
