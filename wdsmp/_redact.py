"""Text that may hold URLs, as wdsmp shows it in messages: passwords masked.

A URL may carry credentials (``https://user:password@host/...``, which remote
shards accept); error messages and log lines name the shard, and logs travel
further than the job's settings. Every message that names a URL shows it
through :func:`redacted`, which keeps the user name, so the log still says
which account failed. The errors' ``url`` attributes keep the URL as given.
"""

import re

__all__ = ["redacted"]

_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):[^\s/@]*@")


def redacted(text):
    """``text`` with the password of every ``scheme://user:password@`` in it shown as ``***``
    (a pipe command's URLs too); anything but a string is returned as it is."""
    return _CREDENTIALS.sub(r"\1:***@", text) if isinstance(text, str) else text
