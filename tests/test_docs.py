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


def _args_section(doc):
    """The names an ``Args:`` section of ``doc`` documents, one entry per line indented by 4 more."""
    lines = doc.split("Args:\n", 1)[1].splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    return [line.strip().split(":")[0].lstrip("*") for line in lines
            if line.strip() and len(line) - len(line.lstrip()) == indent]


def test_every_fastloader_setting_is_documented_once_in_its_args_section():
    """The API reference renders FastLoader's and LoaderOptions' Args sections: one entry for
    each parameter and each setting, in order, and each setting's default and type come from
    its field."""
    import dataclasses
    import inspect

    import wdsmp
    from wdsmp.fast.options import LoaderOptions

    loader = [name for name in inspect.signature(wdsmp.FastLoader.__init__).parameters if name != "self"]
    assert _args_section(inspect.getdoc(wdsmp.FastLoader)) == loader
    settings = [field.name for field in dataclasses.fields(LoaderOptions)]
    assert _args_section(inspect.getdoc(LoaderOptions)) == settings


def test_the_reference_renders_fastloaders_args_as_tables():
    text = (ROOT / "docs" / "api.md").read_text()
    for name in ("wdsmp.fast.loader.FastLoader", "wdsmp.fast.options.LoaderOptions"):
        entry = text.split(f"::: {name}\n", 1)[1].split(":::", 1)[0]
        assert "docstring_style: google" in entry
