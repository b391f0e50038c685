"""``wdsmp doctor``: which of wdsmp's native parts are in use here, and what is missing.

Each compiled part (``wdsmp.native.core.parts``) is in use, or not built (with the
import error and what its absence costs: the status is then 1), or off
(``WDSMP_PUREPYTHON=1``); then the versions and the optional packages that
change what wdsmp can do.
"""

import argparse
import importlib
import os
import sys
from typing import Optional

from .common import add_common, print_json

__all__ = ["add_parser", "run"]

# Optional packages: what each gives, and how to get it.
_OPTIONAL = {
    "matplotlib": "the picture of `wdsmp bench` (pip install 'wdsmp[plot]')",
    "boto3": "s3:// URLs (pip install 'wdsmp[s3]')",
    "yaml": "YAML dataset specs (pip install 'wdsmp[yaml]')",
}


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "doctor", help="say which native parts are in use, and what is missing",
        description="Say which of wdsmp's compiled parts (tar splitter, image kernel, JPEG region decoder) are "
        "in use here and why not, the versions that matter, and which optional packages are installed. "
        "The status is 1 when a compiled part is not built.")
    add_common(parser)
    parser.set_defaults(func=run)


def _version(name: str) -> Optional[str]:
    try:
        return getattr(importlib.import_module(name), "__version__", "installed")
    except ImportError:
        return None


def run(args: argparse.Namespace) -> int:
    from ..native import core as native

    parts = native.parts()
    import wdsmp

    versions = {name: _version(name) for name in ("torch", "simplejpeg", "PIL", "numpy")}
    optional = {name: _version(name) is not None for name in _OPTIONAL}
    if args.json:
        print_json({"wdsmp": os.path.dirname(wdsmp.__file__), "python": sys.version.split()[0],
                    "parts": [part._asdict() for part in parts], "versions": versions, "optional": optional})
    else:
        print(f"wdsmp from {os.path.dirname(wdsmp.__file__)}, Python {sys.version.split()[0]}")
        for part in parts:
            print(f"{part.state:9}  {part.name}: {part.does}; {part.detail}")
        print("versions: " + ", ".join(f"{name} {version or 'missing'}" for name, version in versions.items()))
        for name, gives in _OPTIONAL.items():
            print(f"{'installed' if optional[name] else 'missing  '}  {name}: {gives}")
    return 1 if any(part.state == "not built" for part in parts) else 0
