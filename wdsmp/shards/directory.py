"""DirectoryShardList: shards claimed from a directory that producers fill and readers share."""

import glob
import os
import random
import re
import time
from typing import Any, Dict, Iterator, List, Optional

from torch.utils.data import IterableDataset

from .._internal.braces import glob_with_braces
from .._internal.liveness import pid_alive

__all__ = ["DirectoryShardList", "check_pid_is_running", "get_pid_from_filename", "without_last_extension"]


def check_pid_is_running(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine).

    A process of another user counts as running (webdataset says it is not,
    and would recycle the shard that process is reading); a zombie does not.
    """
    return pid_alive(pid)


def without_last_extension(fname: str) -> str:
    """``fname`` without its last ``.ext`` (in its last path component only)."""
    head, tail = os.path.split(fname)
    stem, dot, _ = tail.rpartition(".")
    return os.path.join(head, stem) if dot else fname


_CLAIMED = re.compile(r"^(.*)\._(\d+)_$")
_DONE = "._done_"


def get_pid_from_filename(fname: str) -> Optional[int]:
    """The pid of a claimed shard's name (``shard.tar._1234_`` -> 1234), else None."""
    match = _CLAIMED.match(fname)
    return int(match.group(2)) if match else None


def _mtime(fname: str) -> float:
    try:
        return os.stat(fname).st_mtime
    except FileNotFoundError:  # claimed by another process since it was listed
        return float("inf")


class DirectoryShardList(IterableDataset):
    """Shards taken from a directory that producers fill and several readers share.

    A reader claims a shard by renaming ``x.tar`` to ``x.tar._<pid>_`` (the
    rename succeeds for one reader only) and yields that path. Once the
    consumer asks for the next shard, the finished one is recycled by
    ``mode``: ``"resample"`` renames it back (an endless stream), ``"keep"``
    renames it to ``x.tar._done_``, ``"unlink"`` deletes it. ``select`` is
    ``"random"`` or ``"oldest"`` (by mtime). With no shard to claim it polls
    every ``poll`` seconds, and ends after ``timeout`` seconds without one
    (``poll=None``: at once). Pids only mean something on one machine, so
    readers on several hosts sharing the directory are out of scope, as in
    webdataset.

    Differences from webdataset: a shard not known to be finished -- claimed
    by a process that died, or held when the consumer stopped early (the
    generator was closed) -- goes back under its own name for another reader,
    whatever the mode (webdataset applies the mode to a dead reader's shard,
    deleting it under ``"unlink"``, and leaves an early-closed one claimed until
    the process exits). The path needs no trailing ``/``; the pattern's braces
    work (webdataset hands them to glob, which has none, so its default pattern
    matches nothing); ``timeout`` counts time without a shard (webdataset: since
    the start); ``mode``/``select``/``poll`` are checked up front. ``fate`` is
    accepted for compatibility and, as in webdataset, unused.
    """

    MODES = ("resample", "keep", "unlink")
    SELECTS = ("random", "oldest")

    def __init__(self, path: Any, pattern: str = "*.{tar,tgz,tar.tgz}", poll: Optional[float] = 1,
                 timeout: float = 1e12, mode: str = "resample", select: str = "random", fate: Any = None) -> None:
        super().__init__()
        if not os.path.isdir(path):
            raise ValueError(f"DirectoryShardList: {path!r} is not a directory")
        if mode not in self.MODES:
            raise ValueError(f"DirectoryShardList: mode must be one of {', '.join(self.MODES)}, not {mode!r}")
        if select not in self.SELECTS:
            raise ValueError(f"DirectoryShardList: select must be one of {', '.join(self.SELECTS)}, "
                             f"not {select!r}")
        if poll is not None and not poll >= 0:
            raise ValueError(f"DirectoryShardList: poll must be None or a non-negative number, not {poll!r}")
        self.path = os.fspath(path)
        self.pattern = pattern
        self.poll = poll
        self.timeout = timeout
        self.mode = mode
        self.select = select
        self.fate = fate

    def recycle(self, activename: str) -> None:
        """Return a claimed shard by ``mode``: rename back, mark done, or delete."""
        if self.mode == "unlink":
            os.unlink(activename)
        elif self.mode == "keep":
            os.rename(activename, without_last_extension(activename) + _DONE)
        else:
            os.rename(activename, without_last_extension(activename))

    @staticmethod
    def _release(activename: str) -> None:
        """Give a claimed shard back under its own name, unfinished."""
        os.rename(activename, without_last_extension(activename))

    def cleanup_files_without_processes(self) -> None:
        """Give back the shards claimed by processes that no longer run."""
        for fname in glob.glob(os.path.join(glob.escape(self.path), "*._*_")):
            pid = get_pid_from_filename(fname)
            if pid is None or check_pid_is_running(pid):
                continue
            try:
                self._release(fname)
            except FileNotFoundError:  # another reader gave it back first
                pass

    def _candidates(self) -> List[str]:
        names = glob_with_braces(os.path.join(glob.escape(self.path), self.pattern))
        return sorted({n for n in names if get_pid_from_filename(n) is None and not n.endswith(_DONE)})

    def _claim(self) -> Optional[str]:
        """Rename one free shard to this process's claimed name; None when there is none."""
        while True:
            candidates = self._candidates()
            if not candidates:
                return None
            if self.select == "oldest":
                candidate = min(candidates, key=_mtime)
            else:
                candidate = random.choice(candidates)
            activename = f"{candidate}._{os.getpid()}_"
            try:
                os.rename(candidate, activename)
            except FileNotFoundError:  # another reader claimed it first: list again
                continue
            return activename

    def __iter__(self) -> Iterator[Dict[str, str]]:
        deadline = time.monotonic() + self.timeout
        while True:
            activename = self._claim()
            if activename is None:
                self.cleanup_files_without_processes()
                activename = self._claim()
            if activename is None:
                remaining = deadline - time.monotonic()
                if self.poll is None or remaining <= 0:
                    return
                time.sleep(min(self.poll, remaining))
                continue
            try:
                yield {"url": activename}
            except BaseException:  # closed early (GeneratorExit) or an error thrown in
                self._release(activename)
                raise
            self.recycle(activename)
            self.cleanup_files_without_processes()
            deadline = time.monotonic() + self.timeout
