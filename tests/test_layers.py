"""The layers contract: wdsmp's packages in the order they may import each other, and the
modules that FastLoader's workers import kept clear of torch. docs/development.md draws it.

An import may go to its own layer or one below, never up: read as a table, every edge of the
import graph (at module level or inside a function) points down. Within a layer the graph must
still be acyclic, which ``../shared/tools/layers.py``-style cycle checks and Python itself
enforce.
"""

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "wdsmp"

# Lowest first. A module belongs to the longest prefix that names it.
LAYERS: List[Tuple[str, ...]] = [
    ("wdsmp._internal", "wdsmp.errors", "wdsmp.handlers", "wdsmp.pytorch", "wdsmp.tenbin", "wdsmp.utils"),
    ("wdsmp.formats",),
    ("wdsmp.native",),
    ("wdsmp.storage", "wdsmp.gopen"),
    ("wdsmp.images", "wdsmp.autodecode"),
    ("wdsmp.stages", "wdsmp.pipeline", "wdsmp.extradatasets", "wdsmp.mix"),
    ("wdsmp.shards", "wdsmp.tariterators", "wdsmp.shardlists", "wdsmp.cache", "wdsmp.filters", "wdsmp.writer"),
    ("wdsmp.epochs",),
    ("wdsmp.datasets",),
    ("wdsmp.compat", "wdsmp.fast"),
    ("wdsmp.bench", "wdsmp.cli", "wdsmp.aswebdataset", "wdsmp"),
]

# What a FastLoader worker process starts with (NOTE [worker processes] in wdsmp/fast/pool.py).
WORKER_ENTRY = "wdsmp.fast.worker"


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest prefix in LAYERS naming it."""
    matches = [(len(prefix), number) for number, group in enumerate(LAYERS) for prefix in group
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _modules() -> Iterator[Tuple[str, pathlib.Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(module: str, path: pathlib.Path) -> Iterator[Tuple[str, int, bool]]:
    """``(imported module, line, at module level)`` for each import in ``path``: wdsmp's own and
    torch."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])
                source = ".".join(base)
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield (full if _is_module(full) else source), node.lineno, id(node) in top_level
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top_level


def _graph() -> Dict[str, List[Tuple[str, int, bool]]]:
    return {module: list(_imports(module, path)) for module, path in _modules()}


def test_every_module_has_a_layer_of_its_own_package():
    unplaced = [module for module, _ in _modules() if module != "wdsmp" and
                max((len(prefix), prefix) for group in LAYERS for prefix in group
                    if module == prefix or module.startswith(prefix + "."))[1] == "wdsmp"]
    assert not unplaced, f"modules with no layer in tests/test_layers.py: {unplaced}"


def test_no_import_goes_up_a_layer():
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)}), line {line}"
              for module, imports in _graph().items() for target, line, _ in imports
              if target.startswith("wdsmp") and layer_of(target) > layer_of(module)]
    assert not upward, "\n".join(upward)


def test_torch_reaches_no_module_a_worker_imports():
    graph = _graph()
    seen: Set[str] = set()
    chain = {WORKER_ENTRY: [WORKER_ENTRY]}
    todo = [WORKER_ENTRY]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for target, line, top in graph.get(module, ()):
            if not top:
                continue
            assert target.split(".")[0] != "torch", f"torch imported at module level by {' -> '.join(chain[module])}"
            for parent in _parents(target) + [target]:
                if parent in graph and parent not in chain:
                    chain[parent] = chain[module] + [parent]
                    todo.append(parent)
    assert len(seen) > 20  # the walk did follow the worker's imports


def _parents(module: str) -> List[str]:
    """The packages an import of ``module`` runs first (their ``__init__``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@pytest.mark.parametrize("package", sorted({m for m, p in _modules() if p.name == "__init__.py" and m != "wdsmp"}))
def test_each_subpackage_says_what_it_holds_and_imports_nothing(package):
    path = PACKAGE.parent / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 80, f"{package}/__init__.py needs a docstring: what it holds and who uses it"
    if package not in ("wdsmp.cli", "wdsmp.fast"):  # the command's entry point, FastLoader's face
        assert all(isinstance(node, ast.Expr) for node in tree.body), f"{package}/__init__.py imports or defines"
