"""``wdsmp create``: shards from a directory tree, an ImageFolder tree or a tarp-style recipe.

How the archives are written, and what a failed run leaves, is output.py's (NOTE [failed output]).
"""

import argparse
import json
import os
import sys
import time
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from ..gopen import gopen, local_path
from ..handlers import reraise_exception
from ..tariterators import base_plus_ext
from .common import Progress, add_common, check_output, die, print_json
from .output import Output, add_output_options, check_summary_target


# Sources. Each gives {key: {extension: source}} in writing order; sources are read lazily.

_Groups = Dict[str, Dict[str, str]]  # {key: {extension: path, URL or text:literal}}
_Sample = Dict[str, Union[str, bytes]]  # __key__ and the fields' bytes


def _fields_of(key: str, fields: Dict[str, str], where: str) -> Dict[str, str]:
    """``fields``, unless two differ only in case: readers lowercase extensions, so to them
    those would be one field given twice."""
    lowered: Dict[str, str] = {}
    for ext in fields:
        if ext.lower() in lowered:
            die(f"{where}: sample {key!r} has fields {lowered[ext.lower()]!r} and {ext!r}, the same field "
                "to readers, which lowercase extensions")
        lowered[ext.lower()] = ext
    return fields


def _skip_link(path: str, why: str) -> None:
    print(f"wdsmp create: skipping {path}: a symbolic link to {os.readlink(path)!r}, {why}", file=sys.stderr)


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _followed(path: str, real_root: str, follow_links: bool, ancestors: Iterable[str] = ()) -> bool:
    """Whether to read the symbolic link ``path`` (to a file or a directory): only with
    ``follow_links``, and only to a place inside SOURCE that exists and is not a directory
    above it (a cycle). Each link left out is named on stderr: none is skipped silently."""
    if not follow_links:
        _skip_link(path, "not followed (--follow-links follows links that stay inside SOURCE)")
        return False
    target = os.path.realpath(path)
    if not os.path.exists(target):
        _skip_link(path, "which does not exist")
    elif not _inside(target, real_root):
        _skip_link(path, "outside SOURCE: never followed")
    elif any(_inside(ancestor, target) for ancestor in ancestors):
        _skip_link(path, "a directory above it: following it would never end")
    else:
        return True
    return False


def _files(root: str, follow_links: bool) -> Iterator[Tuple[str, str]]:
    """``(path, path relative to root)`` of the files under ``root``, hidden entries skipped,
    symbolic links as ``_followed`` says."""
    real_root = os.path.realpath(root)
    for directory, subdirectories, files in os.walk(root, onerror=reraise_exception, followlinks=follow_links):
        here = os.path.realpath(directory)
        kept = []
        for name in subdirectories:
            path = os.path.join(directory, name)
            if name.startswith(".") or (os.path.islink(path) and not _followed(path, real_root, follow_links,
                                                                                (here, real_root))):
                continue
            kept.append(name)
        subdirectories[:] = kept
        for name in files:
            path = os.path.join(directory, name)
            if name.startswith(".") or (os.path.islink(path) and not _followed(path, real_root, follow_links)):
                continue
            yield path, os.path.relpath(path, root).replace(os.sep, "/")


def _scan(root: str, imagefolder: bool, follow_links: bool = False) -> _Groups:
    """``{key: {ext: path}}`` for the files under ``root``, keys sorted; hidden entries skipped,
    symbolic links as ``_followed`` says.

    The key is the path relative to ``root`` up to the first dot of the file name, the rest
    is the extension, as readers split member names. With ``imagefolder``, each file must lie
    in a class directory (the first path component).
    """
    groups: _Groups = {}
    for path, relative in _files(root, follow_links):
        if imagefolder and "/" not in relative:
            die(f"{path}: with --imagefolder, files belong in class directories under {root}")
        if not os.path.isfile(path):
            die(f"{path}: not a regular file")
        key, ext = base_plus_ext(relative)
        if not ext:  # none, or nothing after the dot: no field to put the file in
            die(f"{path}: no extension, so it would belong to no sample (rename it, or use --recipe)")
        assert key is not None  # base_plus_ext gives a key with every extension
        if imagefolder and ext.lower() == "cls":
            die(f"{path}: a .cls file, where --imagefolder puts the class index")
        groups.setdefault(key, {})[ext] = path
    return {key: _fields_of(key, groups[key], root) for key in sorted(groups)}


def _check_outside(output: str, root: str) -> None:
    """An output inside SOURCE would be read back as a sample by the next run (and be
    overwritten while it is read, with --force)."""
    path = local_path(output)
    if path is None:
        return
    root = os.path.realpath(root)
    directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if os.path.commonpath([root, directory]) == root:
        die(f"the output {output} lies inside SOURCE {root}; write it elsewhere")


def _class_names(root: str, follow_links: bool) -> List[str]:
    """ImageFolder's classes: the directories under ``root``, sorted (hidden ones skipped, and
    symbolic links unless ``follow_links`` and they stay inside, as for the files)."""
    real_root = os.path.realpath(root)
    with os.scandir(root) as entries:
        return sorted(entry.name for entry in entries if entry.is_dir() and not entry.name.startswith(".")
                      and (not entry.is_symlink() or _quietly_followed(entry.path, real_root, follow_links)))


def _quietly_followed(path: str, real_root: str, follow_links: bool) -> bool:
    """``_followed`` for a link the scan has already named."""
    target = os.path.realpath(path)
    return follow_links and os.path.exists(target) and _inside(target, real_root) and target != real_root


def _tree_samples(groups: Mapping[str, Mapping[str, str]], classes: Optional[Mapping[str, int]]) -> Iterator[_Sample]:
    for key, fields in groups.items():
        sample: _Sample = {"__key__": key}
        for ext, path in fields.items():
            with open(path, "rb") as stream:
                sample[ext] = stream.read()
        if classes is not None:
            sample["cls"] = str(classes[key.split("/", 1)[0]]).encode("ascii")
        yield sample


def _parse_recipe(url: str) -> _Groups:
    """``{key: {ext: source}}`` from a recipe (lines ``key.ext source``), in order of first
    appearance; ``#`` comments and blank lines skipped."""
    with gopen(url) as stream:
        text = stream.read().decode("utf-8")
    groups: _Groups = {}
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
        if not ext:
            die(f"{where}: archive name {name!r} has no extension (key.ext)")
        assert key is not None  # base_plus_ext gives a key with every extension
        fields = groups.setdefault(key, {})
        if ext in fields:
            die(f"{where}: {name!r} appears twice")
        fields[ext] = source
    return {key: _fields_of(key, fields, url) for key, fields in groups.items()}


def _read_source(source: str) -> bytes:
    """A recipe source's bytes: ``text:...`` literally, else a path or URL (``pipe:`` too) via gopen."""
    if source.startswith("text:"):
        return source[len("text:"):].encode("utf-8")
    with gopen(source) as stream:
        return stream.read()


def _recipe_samples(groups: Mapping[str, Mapping[str, str]]) -> Iterator[_Sample]:
    for key, fields in groups.items():
        yield {"__key__": key, **{ext: _read_source(source) for ext, source in fields.items()}}


def _sources(groups: Mapping[str, Mapping[str, str]]) -> List[str]:
    """The paths and URLs samples are read from, which must not become outputs."""
    return [source for fields in groups.values() for source in fields.values() if not source.startswith("text:")]


def _classes_file(args: argparse.Namespace, classes: Dict[str, int]) -> Tuple[str, str]:
    """Where the class index ``{name: index}`` goes, and its text; an existing file with other
    text is replaced only with ``--force``."""
    path = args.classes
    if path is None:
        output = local_path(args.output)
        if output is None:
            die("with -o - or a URL, --imagefolder needs --classes FILE for the class index")
        path = os.path.join(os.path.dirname(output), "classes.json")
    _check_outside(path, args.source)
    text = json.dumps(classes, indent=1) + "\n"
    local = local_path(path)
    if local is not None and os.path.exists(local):
        with open(local, encoding="utf-8", errors="replace") as stream:
            same = stream.read() == text
        if not same:
            check_output(path, args.force)
    return path, text


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "create", help="make shards from a directory, an ImageFolder tree or a recipe",
        description="Make WebDataset shards. From a directory, files sharing a path up to the first dot "
        "of their name are one sample (key = that path relative to SOURCE; the rest of the name is the "
        "field), samples sorted by key; hidden files are skipped, and so are symbolic links, each named on "
        "stderr, unless --follow-links (then links that stay inside SOURCE are followed). --imagefolder adds "
        "a .cls field, the index of the file's class directory (class names sorted), and writes the class "
        "index as JSON. "
        "--recipe reads lines 'key.ext source', source being a path or URL (pipe:command too) or "
        "text:literal, and writes samples in the order their keys first appear. The same input always "
        "gives the same bytes.")
    parser.add_argument("source", nargs="?", metavar="SOURCE", help="a directory")
    parser.add_argument("--imagefolder", action="store_true",
                        help="SOURCE has one directory per class, as torchvision's ImageFolder reads")
    parser.add_argument("--classes", metavar="FILE",
                        help="where --imagefolder writes {class name: index} (default: classes.json next "
                        "to the output; an existing identical file needs no --force)")
    parser.add_argument("--follow-links", action="store_true",
                        help="follow symbolic links to files and directories that stay inside SOURCE (links "
                        "leading out of it are skipped, and named, even then)")
    parser.add_argument("--recipe", metavar="FILE", help="a recipe file (or '-') instead of SOURCE; "
                        "relative paths in it are taken from the current directory")
    add_output_options(parser, series=True)
    add_common(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.source is None) == (args.recipe is None):
        die("give either a SOURCE directory or --recipe FILE")
    if args.recipe is not None and (args.imagefolder or args.follow_links):
        die("--imagefolder and --follow-links read a directory, not a recipe")
    if args.classes is not None and not args.imagefolder:
        die("--classes goes with --imagefolder")
    check_summary_target(args)
    started = time.monotonic()
    classes: Optional[Dict[str, int]]
    classes_file: Optional[str]
    classes = classes_file = None
    if args.recipe is not None:
        groups = _parse_recipe(args.recipe)
        samples = _recipe_samples(groups)
        inputs = [args.recipe, *_sources(groups)]
    else:
        if not os.path.isdir(args.source):
            die(f"{args.source}: not a directory")
        _check_outside(args.output, args.source)
        groups = _scan(args.source, args.imagefolder, args.follow_links)
        if args.imagefolder:
            classes = {name: index for index, name in enumerate(_class_names(args.source, args.follow_links))}
            classes_file, classes_text = _classes_file(args, classes)
        samples = _tree_samples(groups, classes)
        inputs = _sources(groups)
    if not groups:
        die(f"no samples in {args.source or args.recipe}")
    with Progress("create", total=len(groups), quiet=args.quiet) as progress, \
            Output(args.output, args.force, args.maxcount, args.maxsize, inputs=inputs) as output:
        if classes_file is not None:
            output.attach(classes_file, classes_text.encode("utf-8"))
        for sample in samples:
            progress.update(1, output.write(sample))
    if args.json:
        summary = dict(command="create", samples=output.samples, bytes=output.bytes, outputs=output.summary(),
                       seconds=round(time.monotonic() - started, 3))
        if classes is not None:
            summary.update(classes=len(classes), classes_file=classes_file)
        print_json(summary)
    return 0
