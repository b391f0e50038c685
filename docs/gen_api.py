"""Write docs/api.md: a reference entry for every name in ``wdsmp.__all__``, grouped by the
module that defines it, rendered from the docstrings by mkdocstrings. Run it after changing
the public API; ``tests/test_docs.py`` fails while api.md is out of date."""

import inspect
import os
import sys

HEADER = """# API reference

Every public name of `wdsmp` (`import wdsmp as wds`; `wds.<name>`), grouped by the module that
defines it, from its docstring. Submodules keep webdataset 1.0.2's names (`wds.autodecode`,
`wds.shardlists`, ...).
"""


def where(name):
    """The dotted path mkdocstrings documents ``wdsmp.<name>`` under: the public module users
    import it from (imported names are followed to their definition), or the submodule itself."""
    import wdsmp

    value = getattr(wdsmp, name)
    if inspect.ismodule(value):
        return value.__name__
    module = next((module for module, names in wdsmp._PUBLIC.items() if name in names), None)
    return f"wdsmp.{module}.{name}" if module else f"{value.__module__}.{name}"  # gopen: the function


# Rendered with their Args sections as tables (name, type, default, description): FastLoader and
# its settings, which the reference shows next to it.
GOOGLE_STYLE = ("wdsmp.fast.loader.FastLoader", "wdsmp.fast.options.LoaderOptions")
COMPANIONS = {"wdsmp.fast.loader.FastLoader": ["wdsmp.fast.options.LoaderOptions"]}


def entry(path):
    """One mkdocstrings entry."""
    if path in GOOGLE_STYLE:
        return f"::: {path}\n    options:\n      docstring_style: google\n"
    return f"::: {path}\n"


def render():
    import wdsmp

    groups = {}
    for name in sorted(wdsmp.__all__, key=str.lower):
        path = where(name)
        module = path if inspect.ismodule(getattr(wdsmp, name)) else path.rsplit(".", 1)[0]
        groups.setdefault(module, []).append(path)
    out = [HEADER]
    for module in sorted(groups):
        out.append(f"\n## `{module}`\n")
        for path in groups[module]:
            out.extend(entry(companion) for companion in [path] + COMPANIONS.get(path, []))
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "api.md"), "w") as stream:
        stream.write(render())
