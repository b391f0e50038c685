"""Saved formats carry their version: the one check that every format wdsmp keeps goes through.

What wdsmp saves for later (FastLoader's and ExactSamples' states, which checkpoints keep; the
DBCache database; the count cache) outlives the wdsmp that wrote it. Each names its format and
version when saved, and a reader takes only the versions it knows: anything else (a newer wdsmp's
state, a state from elsewhere, one without a version) is refused with both versions named, never
read as if it were current.
"""

from typing import Any, Collection, Mapping

__all__ = ["check_version", "versioned"]


def versioned(format_name: str, version: int, body: Mapping[str, Any]) -> dict:
    """``body`` with the keys ``format`` and ``version`` that :func:`check_version` reads back."""
    return {"format": format_name, "version": version, **body}


def check_version(saved: Mapping[str, Any], format_name: str, readable: Collection[int], what: str) -> int:
    """The version of ``saved`` when it is ``format_name`` in one of the ``readable`` versions;
    else ValueError naming ``what``, the version found and the ones this wdsmp reads."""
    if not isinstance(saved, Mapping):
        raise ValueError(f"{what} must be a dict (from state_dict()), not {type(saved).__name__}")
    found_format, found = saved.get("format"), saved.get("version")
    known = ", ".join(str(v) for v in sorted(readable))
    if found_format != format_name or found is None:
        raise ValueError(f"{what} is not in a known version of {format_name} (it has format={found_format!r}, "
                         f"version={found!r}; this wdsmp reads {format_name} version {known})")
    if found not in readable:
        raise ValueError(f"{what} is {format_name} version {found!r}; this wdsmp reads version {known} "
                         f"(what a newer wdsmp saved needs that wdsmp)")
    return int(found)
