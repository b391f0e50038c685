"""Brace patterns (``"shard-{000..099}.tar"``, ``"*.{tar,tgz}"``): the one place they are expanded.

Shard specs, glob and fnmatch patterns and MultiShardSample's ``shards`` all
expand braces here, so they agree on the syntax and on the error for an
unbalanced brace.
"""

import fnmatch
import glob
from typing import List

import braceexpand

__all__ = ["expand_braces", "fnmatch_with_braces", "glob_with_braces"]


def expand_braces(text: str, what: str = "pattern") -> List[str]:
    """The strings ``text`` stands for, in order; ValueError naming ``what`` for unbalanced braces."""
    try:
        return list(braceexpand.braceexpand(text))
    except braceexpand.UnbalancedBracesError as exn:  # type: ignore[attr-defined]  # missing from its stub
        raise ValueError(f"unbalanced braces in {what} {text!r}") from exn


def glob_with_braces(pattern: str) -> List[str]:
    """Files matching a glob pattern that may hold braces (``"d/*.{tar,tgz}"``), which glob lacks.

    Each alternative's matches are sorted (webdataset leaves them in directory
    order), so the result is the same on every machine.
    """
    return [name for alternative in expand_braces(pattern) for name in sorted(glob.glob(alternative))]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    """Whether ``filename`` matches a shell pattern that may hold braces."""
    return any(fnmatch.fnmatch(filename, alternative) for alternative in expand_braces(pattern))
