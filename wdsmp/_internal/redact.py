"""Text that may hold URLs, as wdsmp shows it in messages: passwords masked.

A URL may carry credentials (``https://user:password@host/...``, which remote
shards accept); error messages and log lines name the shard, and logs travel
further than the job's settings. Every message that names a URL shows it
through :func:`redacted`: a password as ``***``, the user name kept (the log
still says which account failed), and a user name without a password, often
a token, as ``***`` too. The errors' ``url`` attributes keep the URL as given.
"""

import re
from typing import TypeVar, cast

__all__ = ["redacted"]

_T = TypeVar("_T")

# The user information ends at the last "@" before the path, as urllib.parse reads it.
_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):[^\s/]*@")
_TOKEN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/:@]+@")


def redacted(text: _T) -> _T:
    """``text`` with the credentials of every URL in it masked: ``scheme://user:***@`` and
    ``scheme://***@`` (a pipe command's URLs too); anything but a string is returned as it is."""
    if not isinstance(text, str):
        return text
    return cast(_T, _TOKEN.sub(r"\1***@", _PASSWORD.sub(r"\1:***@", text)))
