"""The documentation: its API reference lists every public name (``docs/gen_api.py`` writes it),
and every page is in the site's navigation."""

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    assert (ROOT / "docs" / "api.md").read_text() == gen_api.render(), \
        "docs/api.md is out of date: run python docs/gen_api.py"


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nplugins:")[0])  # the plain part
    pages = {page for entry in config["nav"] for page in entry.values()}
    assert pages == {path.name for path in (ROOT / "docs").glob("*.md")}


def test_every_fastloader_parameter_is_documented():
    """The API reference is FastLoader's docstring: each of its parameters is named there."""
    import inspect

    import wdsmp

    doc = inspect.getdoc(wdsmp.FastLoader)
    undocumented = [name for name in inspect.signature(wdsmp.FastLoader.__init__).parameters
                    if name != "self" and f"``{name}" not in doc]
    assert undocumented == []
