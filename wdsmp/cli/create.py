"""``wdsmp create``: shards from a directory tree, an ImageFolder tree or a tarp-style recipe.

Also the output side that ``cat`` and ``split`` (``reshard.py``) share: ``-o`` is one tar (a
path, any URL gopen writes, or ``-``) or, when it holds a %-format such as ``out-%06d.tar``, a
series cut by ``--maxcount``/``--maxsize`` (ShardWriter's rule: a sample that would not fit
starts the next shard).

NOTE [failed output]: a run that fails must not leave an archive that looks whole. On an
exception the output streams are abandoned before the writers close, so no end-of-archive marker
is written (a reader of ``-`` or of a URL sees a truncated archive, an error), and the local files
the run wrote are removed.
"""

import argparse
import io
import json
import os
import re
import time

from ..gopen import gopen, local_path
from ..handlers import reraise_exception
from ..tariterators import base_plus_ext
from ..writer import ShardWriter, TarWriter, _compression
from .common import Progress, add_common, check_output, die, print_json

DEFAULT_MAXCOUNT = 100000  # ShardWriter's defaults
DEFAULT_MAXSIZE = 3e9

_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*([kKmMgGtT]i?)?[bB]?")
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text):
    """A byte count for ``--maxsize``: ``3e9``, ``500M``, ``1G`` (powers of 1000) or ``512Mi``."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive size: {text!r} (examples: 3e9, 500M, 1G, 512Mi)")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def positive_int(text):
    """A count for ``--maxcount`` and ``--buffer``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def is_pattern(name):
    """Whether ``-o`` names a series: a %-format that the shard number changes."""
    try:
        return name % 0 != name % 1
    except (TypeError, ValueError):
        return False


def add_output_options(parser, series):
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


def check_summary_target(args):
    """``--json`` prints on stdout, so it cannot share stdout with an archive."""
    if args.json and args.output == "-":
        die("--json prints on stdout, where -o - writes the archive; drop one of them")


class _Abandonable(io.RawIOBase):
    """A write stream that can be abandoned (NOTE [failed output]): once ``abandon()`` is
    called, writes are dropped, so closing the tar writer on top adds no end-of-archive marker."""

    def __init__(self, stream):
        super().__init__()
        self._stream = stream
        self._abandoned = False

    def writable(self):
        return True

    def write(self, data):
        if not self._abandoned:
            self._stream.write(data)
        return len(data)

    def flush(self):
        if not self._abandoned and not self.closed:
            self._stream.flush()

    def abandon(self):
        self._abandoned = True

    def close(self):
        if self.closed:
            return
        try:
            super().close()  # flushes first
        finally:
            self._stream.close()


class Output:
    """Samples (dicts of bytes) to ``-o``: one tar, or a ShardWriter series for a %-pattern.

    Fields are written as they are (no encoding; fields starting with ``_`` kept). Existing
    outputs and the local ``inputs`` are never written to (the latter even with ``--force``).
    A key met twice in one archive is an error: readers would merge or reject those samples.
    Use as a context manager; an exception abandons the outputs (NOTE [failed output]).
    """

    def __init__(self, target, force=False, maxcount=None, maxsize=None, inputs=()):
        self.force = force
        self._inputs = {os.path.realpath(path) for path in map(local_path, inputs) if path is not None}
        self._streams = []
        self._keys = set()
        self.names, self.counts = [], []
        self.samples = self.bytes = 0
        options = dict(encoder=False, keep_meta=True)
        if is_pattern(target):
            check_output(target % 0, force)  # fail now, not once the first sample is ready
            self._series = ShardWriter(target, maxcount=maxcount or DEFAULT_MAXCOUNT,
                                       maxsize=maxsize or DEFAULT_MAXSIZE, opener=self._open, **options)
            self._single = None
        else:
            if maxcount is not None or maxsize is not None:
                die(f"--maxcount and --maxsize cut a series: give -o a pattern such as out-%06d.tar, not {target!r}")
            self._series = None
            self._single = TarWriter(self._open(target), compress=_compression(target, None), **options)

    def _open(self, name):
        check_output(name, self.force)
        path = local_path(name)
        if path is not None and os.path.realpath(path) in self._inputs:
            die(f"{path} is an input; it cannot be an output too")
        if path is not None and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)  # as a series' first shard would need
        stream = _Abandonable(gopen(name, "wb"))
        self._streams.append(stream)
        self.names.append(name)
        self.counts.append(0)
        self._keys = set()
        return stream

    def write(self, sample):
        """Write one sample; the bytes it added to the tar stream."""
        key = sample["__key__"]
        if key in self._keys:
            raise ValueError(f"key {key!r} occurs twice in output {self.names[-1]!r}: readers would merge or "
                             "reject those samples (inputs with overlapping keys?)")
        written = (self._single or self._series).write(sample)
        self._keys.add(key)
        self.counts[-1] += 1
        self.samples += 1
        self.bytes += written
        return written

    def summary(self):
        return [{"url": name, "samples": count} for name, count in zip(self.names, self.counts)]

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self._abandon()
            return
        try:
            self._close()
        except BaseException:
            self._abandon()
            raise

    def _close(self):
        (self._single or self._series).close()
        for stream in self._streams:
            stream.close()

    def _abandon(self):
        for stream in self._streams:
            stream.abandon()
        try:
            self._close()
        finally:
            self._remove()

    def _remove(self):
        for path in map(local_path, self.names):
            if path is not None and os.path.exists(path):
                os.remove(path)


# Sources. Each gives {key: {extension: source}} in writing order; sources are read lazily.


def _fields_of(key, fields, where):
    """``fields``, unless two differ only in case: readers lowercase extensions, so to them
    those would be one field given twice."""
    lowered = {}
    for ext in fields:
        if ext.lower() in lowered:
            die(f"{where}: sample {key!r} has fields {lowered[ext.lower()]!r} and {ext!r}, the same field "
                "to readers, which lowercase extensions")
        lowered[ext.lower()] = ext
    return fields


def _scan(root, imagefolder):
    """``{key: {ext: path}}`` for the files under ``root``, keys sorted; hidden entries skipped.

    The key is the path relative to ``root`` up to the first dot of the file name, the rest
    is the extension, as readers split member names. With ``imagefolder``, each file must lie
    in a class directory (the first path component).
    """
    groups = {}
    for directory, subdirectories, files in os.walk(root, onerror=reraise_exception):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if imagefolder and "/" not in relative:
                die(f"{path}: with --imagefolder, files belong in class directories under {root}")
            if not os.path.isfile(path):
                die(f"{path}: not a regular file")
            key, ext = base_plus_ext(relative)
            if key is None:
                die(f"{path}: no extension, so it would belong to no sample (rename it, or use --recipe)")
            if imagefolder and ext.lower() == "cls":
                die(f"{path}: a .cls file, where --imagefolder puts the class index")
            groups.setdefault(key, {})[ext] = path
    return {key: _fields_of(key, groups[key], root) for key in sorted(groups)}


def _check_outside(output, root):
    """An output inside SOURCE would be read back as a sample by the next run (and be
    overwritten while it is read, with --force)."""
    path = local_path(output)
    if path is None:
        return
    root = os.path.realpath(root)
    directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if os.path.commonpath([root, directory]) == root:
        die(f"the output {output} lies inside SOURCE {root}; write it elsewhere")


def _class_names(root):
    """ImageFolder's classes: the directories under ``root``, sorted (hidden ones skipped)."""
    with os.scandir(root) as entries:
        return sorted(entry.name for entry in entries if entry.is_dir() and not entry.name.startswith("."))


def _tree_samples(groups, classes):
    for key, fields in groups.items():
        sample = {"__key__": key}
        for ext, path in fields.items():
            with open(path, "rb") as stream:
                sample[ext] = stream.read()
        if classes is not None:
            sample["cls"] = str(classes[key.split("/", 1)[0]]).encode("ascii")
        yield sample


def _parse_recipe(url):
    """``{key: {ext: source}}`` from a recipe (lines ``key.ext source``), in order of first
    appearance; ``#`` comments and blank lines skipped."""
    with gopen(url) as stream:
        text = stream.read().decode("utf-8")
    groups = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{url}, line {number}"
        parts = line.split(None, 1)
        if len(parts) != 2:
            die(f"{where}: expected 'archive-name source', got {line!r}")
        name, source = parts
        key, ext = base_plus_ext(name)
        if key is None:
            die(f"{where}: archive name {name!r} has no extension (key.ext)")
        fields = groups.setdefault(key, {})
        if ext in fields:
            die(f"{where}: {name!r} appears twice")
        fields[ext] = source
    return {key: _fields_of(key, fields, url) for key, fields in groups.items()}


def _read_source(source):
    """A recipe source's bytes: ``text:...`` literally, else a path or URL (``pipe:`` too) via gopen."""
    if source.startswith("text:"):
        return source[len("text:"):].encode("utf-8")
    with gopen(source) as stream:
        return stream.read()


def _recipe_samples(groups):
    for key, fields in groups.items():
        yield {"__key__": key, **{ext: _read_source(source) for ext, source in fields.items()}}


def _classes_file(args, classes):
    """Where the class index ``{name: index}`` goes, and its text; an existing file with other
    text is replaced only with ``--force``."""
    path = args.classes
    if path is None:
        output = local_path(args.output)
        if output is None:
            die("with -o - or a URL, --imagefolder needs --classes FILE for the class index")
        path = os.path.join(os.path.dirname(output), "classes.json")
    text = json.dumps(classes, indent=1) + "\n"
    local = local_path(path)
    if local is not None and os.path.exists(local):
        with open(local, encoding="utf-8", errors="replace") as stream:
            same = stream.read() == text
        if not same:
            check_output(path, args.force)
    return path, text


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "create", help="make shards from a directory, an ImageFolder tree or a recipe",
        description="Make WebDataset shards. From a directory, files sharing a path up to the first dot "
        "of their name are one sample (key = that path relative to SOURCE; the rest of the name is the "
        "field), samples sorted by key; hidden files are skipped. --imagefolder adds a .cls field, the "
        "index of the file's class directory (class names sorted), and writes the class index as JSON. "
        "--recipe reads lines 'key.ext source', source being a path or URL (pipe:command too) or "
        "text:literal, and writes samples in the order their keys first appear. The same input always "
        "gives the same bytes.")
    parser.add_argument("source", nargs="?", metavar="SOURCE", help="a directory")
    parser.add_argument("--imagefolder", action="store_true",
                        help="SOURCE has one directory per class, as torchvision's ImageFolder reads")
    parser.add_argument("--classes", metavar="FILE",
                        help="where --imagefolder writes {class name: index} (default: classes.json next "
                        "to the output; an existing identical file is left alone)")
    parser.add_argument("--recipe", metavar="FILE", help="a recipe file (or '-') instead of SOURCE; "
                        "relative paths in it are taken from the current directory")
    add_output_options(parser, series=True)
    add_common(parser)
    parser.set_defaults(func=run)


def run(args):
    if (args.source is None) == (args.recipe is None):
        die("give either a SOURCE directory or --recipe FILE")
    if args.recipe is not None and args.imagefolder:
        die("--imagefolder reads a directory, not a recipe")
    if args.classes is not None and not args.imagefolder:
        die("--classes goes with --imagefolder")
    check_summary_target(args)
    started = time.monotonic()
    classes = classes_file = None
    if args.recipe is not None:
        groups = _parse_recipe(args.recipe)
        samples = _recipe_samples(groups)
    else:
        if not os.path.isdir(args.source):
            die(f"{args.source}: not a directory")
        _check_outside(args.output, args.source)
        groups = _scan(args.source, args.imagefolder)
        if args.imagefolder:
            classes = {name: index for index, name in enumerate(_class_names(args.source))}
            classes_file, classes_text = _classes_file(args, classes)
        samples = _tree_samples(groups, classes)
    if not groups:
        die(f"no samples in {args.source or args.recipe}")
    with Progress("create", total=len(groups), quiet=args.quiet) as progress, \
            Output(args.output, args.force, args.maxcount, args.maxsize) as output:
        for sample in samples:
            progress.update(1, output.write(sample))
    if classes_file is not None:
        with gopen(classes_file, "wb") as stream:
            stream.write(classes_text.encode("utf-8"))
    if args.json:
        summary = dict(command="create", samples=output.samples, bytes=output.bytes, outputs=output.summary(),
                       seconds=round(time.monotonic() - started, 3))
        if classes is not None:
            summary.update(classes=len(classes), classes_file=classes_file)
        print_json(summary)
    return 0
