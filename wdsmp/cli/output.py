"""The output side of ``create``, ``cat`` and ``split``: ``-o`` and the archives written to it.

``-o`` is one tar (a path, any URL gopen writes, or ``-``) or, when it holds a %-format such
as ``out-%06d.tar``, a series cut by ``--maxcount``/``--maxsize`` (ShardWriter's rule: a
sample that would not fit starts the next shard).

NOTE [failed output]: a run that fails or is killed must not leave an archive that looks whole.
A local output is written as ``.partial-NAME`` beside ``NAME`` (hidden, and not matched by
``*.tar``, as in convert.py's NOTE [complete outputs]); once every archive of the run is
complete, the files are synced to disk and renamed into place together (with the files
``attach`` adds, such as the class index), and only then, under ``--force``, are the shards of
an earlier, longer series removed. On an exception, SIGTERM included, the partial files are
removed; a run killed outright leaves its partial files, which the next run overwrites, and no
file under an output's name. ``-``, URLs and what cannot be renamed over (``/dev/null``) are
written in place: on an exception their streams are abandoned before the writers close, so no
end-of-archive marker is written, and a reader sees a truncated archive, an error.
"""

import argparse
import glob
import io
import os
import re
import signal
import sys
import threading
from decimal import Decimal
from fractions import Fraction
from types import FrameType, TracebackType
from typing import IO, Any, Callable, Dict, Iterable, List, NoReturn, Optional, Set, Tuple, Type, Union

from .._internal import validation
from .._internal.atomic import put_in_place
from ..gopen import gopen, local_path
from ..writer import ShardWriter, TarWriter, _compression
from .common import PARTIAL, check_output, die

__all__ = ["Output", "add_output_options", "check_summary_target", "existing_series", "is_pattern", "parse_size",
           "positive_int"]

DEFAULT_MAXCOUNT = 100000  # ShardWriter's defaults
DEFAULT_MAXSIZE = 3e9
MAX_SIZE = 10**19  # bytes: past any shard, and it keeps parse_size's arithmetic small

_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*([kKmMgGtT]i?)?[bB]?")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_CONVERSION = re.compile(r"%(?:%|[-#0 +]*\d*(?:\.\d*)?[hlL]?([a-zA-Z]))")  # a %-format; group 1 unless %%


def parse_size(text: str) -> int:
    """A byte count for ``--maxsize``: ``3e9``, ``500M``, ``1G`` (powers of 1000) or ``512Mi``;
    it must come to a whole number of bytes, from 1 to MAX_SIZE."""
    match = _SIZE.fullmatch(text.strip())
    if match and Decimal(match.group(1)).adjusted() < 20:  # the digits before the point: no huge powers
        value = Fraction(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
        if 1 <= value <= MAX_SIZE and value.denominator == 1:
            return int(value)
    raise argparse.ArgumentTypeError(f"not a whole number of bytes from 1 to 1e19: {text!r} "
                                     "(examples: 3e9, 500M, 1G, 512Mi)")


def positive_int(text: str) -> int:
    """An argparse type for a count of at least one (``--maxcount``, ``--buffer``, ``--workers``, ...): the rule
    of :func:`wdsmp._internal.validation.positive_int`, applied to the text as an integer."""
    try:
        return validation.positive_int(int(text), "the value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}") from None


def is_pattern(name: str) -> bool:
    """Whether ``-o`` names a series: a %-format that the shard number changes."""
    try:
        return name % 0 != name % 1
    except (TypeError, ValueError):
        return False


def existing_series(pattern: str) -> Dict[int, str]:
    """``{n: path}``, n ascending: the local files named ``pattern % n`` (n >= 0) that exist, a
    series that an earlier run may have left, longer or shorter than this one."""
    conversion = next(match for match in _CONVERSION.finditer(pattern) if match.group(1))
    template = local_path(pattern[:conversion.start()] % () + "\0" + pattern[conversion.end():] % ())
    if template is None:
        return {}
    before, after = template.split("\0")
    base = {"x": 16, "X": 16, "o": 8}.get(conversion.group(1), 10)
    found = {}
    for path in glob.glob(glob.escape(before) + "*" + glob.escape(after)):
        try:
            number = int(path[len(before):len(path) - len(after)], base)
        except ValueError:
            continue
        if number >= 0 and local_path(pattern % number) == path:
            found[number] = path
    return dict(sorted(found.items()))


def check_format(name: str) -> None:
    """The name picks the compression; refuse those wdsmp's reader could not read back."""
    if _compression(name, None) not in (None, "gz"):
        die(f"{name}: wdsmp reads plain and gzip tars only, so it writes only those: "
            "name the output .tar, .tar.gz or .tgz")


def add_output_options(parser: argparse.ArgumentParser, series: bool) -> None:
    """``-o`` and ``--force``; with ``series``, also ``--maxcount`` and ``--maxsize``."""
    what = "a tar path or URL, '-' for stdout"
    if series:
        what += ", or a pattern such as out-%%06d.tar for a series of shards"
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help=what)
    parser.add_argument("-f", "--force", action="store_true", help="overwrite existing outputs")
    if series:
        parser.add_argument("--maxcount", type=positive_int, metavar="N",
                            help=f"at most N samples per shard (default {DEFAULT_MAXCOUNT})")
        parser.add_argument("--maxsize", type=parse_size, metavar="S",
                            help="at most S bytes of tar per shard, e.g. 1G (default 3G)")


def check_summary_target(args: argparse.Namespace) -> None:
    """``--json`` prints on stdout, so it cannot share stdout with an archive."""
    if args.json and args.output == "-":
        die("--json prints on stdout, where -o - writes the archive; drop one of them")


class _Abandonable(io.RawIOBase):
    """A write stream that can be abandoned (NOTE [failed output]): once ``abandon()`` is
    called, writes are dropped, so closing the tar writer on top adds no end-of-archive marker."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__()
        self._stream = stream
        self._abandoned = False

    def writable(self) -> bool:
        return True

    # The tar writer writes bytes: narrower than RawIOBase's readable buffers
    def write(self, data: bytes) -> int:  # type: ignore[override]
        if not self._abandoned:
            self._stream.write(data)
        return len(data)

    def flush(self) -> None:
        if not self._abandoned and not self.closed:
            self._stream.flush()

    def abandon(self) -> None:
        self._abandoned = True

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()  # flushes first
        finally:
            self._stream.close()


class Output:
    """Samples (dicts of bytes) to ``-o``: one tar, or a ShardWriter series for a %-pattern.

    Fields are written as they are (no encoding; fields starting with ``_`` kept). Existing
    outputs are replaced only with ``force``, and the local ``inputs`` never; for a series,
    any existing shard of the pattern counts, as the run replaces the whole series. A key met
    twice in one archive is an error: readers would merge or reject those samples. Use as a
    context manager: NOTE [failed output] says how archives come into place. ``command``
    names the command in messages.
    """

    _streams: List[_Abandonable]
    _renames: List[Tuple[str, str]]  # (partial file, the output's path)
    _attached: List[Tuple[str, bytes]]
    _keys: Set[str]
    _sigterm: Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]
    names: List[str]
    counts: List[int]
    _series: Optional[ShardWriter]
    _single: Optional[TarWriter]

    def __init__(self, target: str, force: bool = False, maxcount: Optional[int] = None, maxsize: Optional[int] = None,
                 inputs: Iterable[str] = (), command: str = "create") -> None:
        self.force, self.command = force, command
        self._inputs = {_identity(path) for path in map(local_path, inputs) if path is not None} - {None}
        self._streams, self._renames, self._attached, self._keys = [], [], [], set()
        self._sigterm = None
        self.names, self.counts = [], []
        self.samples = self.bytes = 0
        options: Dict[str, Any] = dict(encoder=False, keep_meta=True)
        if is_pattern(target):
            check_format(target % 0)
            self._earlier = existing_series(target)
            for path in self._earlier.values():
                self._check_target(path)  # fail now, not once the first sample is ready
            self._series = ShardWriter(target, maxcount=DEFAULT_MAXCOUNT if maxcount is None else maxcount,
                                       maxsize=DEFAULT_MAXSIZE if maxsize is None else maxsize,
                                       opener=self._open, **options)
            self._single = None
        else:
            if maxcount is not None or maxsize is not None:
                die(f"--maxcount and --maxsize cut a series: give -o a pattern such as out-%06d.tar, not {target!r}")
            check_format(target)
            self._earlier, self._series = {}, None
            self._single = TarWriter(self._open(target), compress=_compression(target, None), **options)

    def _check_target(self, name: str) -> None:
        check_output(name, self.force)
        path = local_path(name)
        if path is not None and _identity(path) in self._inputs:
            die(f"{path} is an input; it cannot be an output too")

    def _open(self, name: str) -> _Abandonable:
        """The stream for the archive ``name`` (ShardWriter's opener)."""
        self._check_target(name)
        stream = _Abandonable(self._open_file(name))
        self._streams.append(stream)
        self.names.append(name)
        self.counts.append(0)
        self._keys = set()
        return stream

    def _open_file(self, name: str) -> IO[bytes]:
        """A binary stream to ``name``: for a local file its partial file (NOTE [failed output]),
        made in place only for what cannot be renamed over (``/dev/null``, a FIFO)."""
        path = local_path(name)
        if path is None or (os.path.exists(path) and not os.path.isfile(path)):
            return gopen(name, "wb")
        directory, base = os.path.split(path)
        if directory:
            os.makedirs(directory, exist_ok=True)  # as a series' first shard would need
        partial = os.path.join(directory, PARTIAL + base)
        self._renames.append((partial, path))
        return open(partial, "wb")

    def attach(self, name: str, data: bytes) -> None:
        """Write ``data`` (bytes) to ``name`` with the archives, all or nothing: the class index.
        Whether ``name`` may be replaced is the caller's to check."""
        self._attached.append((name, data))

    def write(self, sample: Dict[str, Any]) -> int:
        """Write one sample; the bytes it added to the tar stream.

        The key is checked after the write: only then is it known which archive of a series
        the sample went to. A repeated key fails the run, so that archive is never completed.
        """
        writer = self._single or self._series
        assert writer is not None  # __init__ made one of them
        written = writer.write(sample)
        key = sample["__key__"]
        if key in self._keys:
            raise ValueError(f"key {key!r} occurs twice in output {self.names[-1]!r}: readers would merge or "
                             "reject those samples (inputs with overlapping keys?)")
        self._keys.add(key)
        self.counts[-1] += 1
        self.samples += 1
        self.bytes += written
        return written

    def summary(self) -> List[Dict[str, Union[str, int]]]:
        return [{"url": name, "samples": count} for name, count in zip(self.names, self.counts)]

    def __enter__(self) -> "Output":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _terminate)
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        try:
            if kind is None:
                self._finish()
            else:
                self._abandon()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)

    def _finish(self) -> None:
        try:
            self._close()
            self._commit()
        except BaseException:
            self._abandon()
            raise

    def _close(self) -> None:
        writer = self._single or self._series
        assert writer is not None  # __init__ made one of them
        writer.close()
        for stream in self._streams:
            stream.close()

    def _commit(self) -> None:
        """Put the archives and attached files in place, then drop an earlier series' shards past
        this run's (NOTE [failed output])."""
        for name, data in self._attached:
            with self._open_file(name) as stream:
                stream.write(data)
        for partial, _ in self._renames:
            with open(partial, "rb+") as stream:  # on disk before the name says complete
                os.fsync(stream.fileno())
        for partial, path in self._renames:
            put_in_place(partial, path)
        stale = [path for number, path in self._earlier.items() if number >= len(self.names)]
        for path in stale:
            _unlink(path)
        if stale:
            last = f" ... {stale[-1]}" if len(stale) > 1 else ""
            print(f"wdsmp {self.command}: removed {len(stale)} shards left by an earlier run of the series: "
                  f"{stale[0]}{last}", file=sys.stderr)

    def _abandon(self) -> None:
        for stream in self._streams:
            stream.abandon()
        try:
            self._close()
        finally:
            for partial, _ in self._renames:
                _unlink(partial)


def _identity(path: str) -> Optional[Tuple[int, int]]:
    """What makes two paths one file (links included), or None for a file that does not exist."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _terminate(signum: int, frame: Optional[FrameType]) -> NoReturn:
    """SIGTERM unwinds as SIGINT does, so that the partial files are removed (NOTE [failed output])."""
    raise SystemExit(128 + signum)
