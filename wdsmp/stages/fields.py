"""Stages that address fields by name: alternatives, tuples, renaming, globs, xdecode.

A field spec names one field or alternatives, ``"jpg;png"``: the first one a
sample has is used. A field that is missing is a MissingFieldError naming the
shard, the key, the spec and the fields the sample has (NOTE [stage errors]
in :mod:`wdsmp.stages.base`). :mod:`wdsmp.filters` re-exports these names, where
webdataset has them.
"""

import io
import pickle
from fnmatch import fnmatch
from typing import (IO, Any, Callable, Dict, Iterable, Iterator, List, Mapping, NoReturn, Optional, Sequence, Tuple,
                    Union)

from .._internal import env
from .base import handle_each, missing_field, need_dict, pipelinefilter, sample_error
from ..autodecode import imagehandler
from ..errors import DecodeError
from ..handlers import reraise_exception
from ..utils import identity

__all__ = [
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_decoders",
    "extract_keys",
    "find_decoder",
    "getfirst",
    "parse_field_spec",
    "rename",
    "rename_keys",
    "to_tuple",
    "transform_with",
    "xdecode",
]


def _alternatives(spec: Union[str, Iterable[Any]]) -> List[Any]:
    """``"jpg;png"`` -> ``["jpg", "png"]``; a list is already alternatives."""
    if isinstance(spec, str):
        if " " in spec:
            raise ValueError(f"field spec {spec!r} contains a space; separate alternatives "
                             f"with ';'")
        return spec.split(";")
    return list(spec)


def _spec_text(alternatives: Iterable[Any]) -> str:
    return ";".join(str(a) for a in alternatives)


_MISSING = object()


def _first(sample: Mapping[Any, Any], alternatives: Iterable[Any], stage: str, missing_is_error: bool = True,
           default: Any = None) -> Any:
    """The value of the first of ``alternatives`` that ``sample`` has."""
    for k in alternatives:
        value = sample.get(k, _MISSING)
        if value is not _MISSING:
            return value
    if missing_is_error:
        raise missing_field(stage, f"no field {_spec_text(alternatives)!r}", sample)
    return default


def getfirst(a: Mapping[str, Any], keys: Union[str, Sequence[str]], default: Any = None,
             missing_is_error: bool = True) -> Any:
    """The value of the first of ``keys`` (a list, or a string ``"jpg;png"``) in ``a``."""
    return _first(a, _alternatives(keys), "getfirst", missing_is_error, default)


def parse_field_spec(fields: Union[str, Iterable[str]]) -> List[List[str]]:
    """``"jpg;png cls"`` -> ``[["jpg", "png"], ["cls"]]``."""
    if isinstance(fields, str):
        fields = fields.split()
    return [field.split(";") for field in fields]


def transform_with(sample: Sequence[Any],
                   transformers: Optional[Sequence[Optional[Callable[[Any], Any]]]]) -> Sequence[Any]:
    """Apply ``transformers[i]`` to ``sample[i]``; None or a missing function keeps the value."""
    if not transformers:
        return sample
    if len(transformers) > len(sample):
        raise ValueError(f"{len(transformers)} transformers for a sample of {len(sample)} values")
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


# -- stages


def _to_tuple(data: Iterable[Dict[str, Any]], *args: Any, handler: Callable[[Exception], Any] = reraise_exception,
              missing_is_error: bool = True, none_is_error: Optional[bool] = None) -> Iterator[Tuple[Any, ...]]:
    """Tuples of fields: ``to_tuple("jpg;png", "cls", "__key__")`` or ``to_tuple("jpg cls")``.

    A missing field is an error unless ``missing_is_error=False`` (then it is
    None); a None value is an error while ``none_is_error`` (default:
    ``missing_is_error``) is true.
    """
    if none_is_error is None:
        none_is_error = missing_is_error
    if len(args) == 1 and isinstance(args[0], str) and " " in args[0]:
        args = tuple(args[0].split())
    specs = [_alternatives(a) for a in args]

    def fields(sample: Any) -> Iterator[Tuple[Any, ...]]:
        need_dict("to_tuple", sample)
        result = tuple(_first(sample, alts, "to_tuple", missing_is_error) for alts in specs)
        if none_is_error:
            for alts, value in zip(specs, result):
                if value is None:
                    raise sample_error("to_tuple", f"field {_spec_text(alts)!r} is None", sample)
        yield result

    yield from handle_each(data, fields, handler, "to_tuple")


to_tuple = pipelinefilter(_to_tuple)


def _rename(data: Iterable[Dict[str, Any]], handler: Callable[[Exception], Any] = reraise_exception, keep: bool = True,
            **kw: Any) -> Iterator[Dict[str, Any]]:
    """``rename(new="old1;old2")``: the first old field present, under the new name.

    With ``keep=True`` the other fields stay (the old names go); with
    ``keep=False`` only the renamed fields are left (``__key__`` too goes,
    as in webdataset, unless it is renamed).
    """
    specs = {new: _alternatives(old) for new, old in kw.items()}
    replaced = {old for alts in specs.values() for old in alts}

    def renamed(sample: Any) -> Iterator[Dict[str, Any]]:
        need_dict("rename", sample)
        result = {new: _first(sample, alts, "rename") for new, alts in specs.items()}
        if keep:
            result = {**{k: v for k, v in sample.items() if k not in replaced}, **result}
        yield result

    yield from handle_each(data, renamed, handler, "rename")


rename = pipelinefilter(_rename)


def _extract_keys(source: Iterable[Dict[str, Any]], *patterns: Any, duplicate_is_error: bool = True,
                  ignore_missing: bool = False,
                  handler: Callable[[Exception], Any] = reraise_exception) -> Iterator[Tuple[Any, ...]]:
    """Tuples of the fields matching glob ``patterns`` (``"*.jpg;*.png"``; ``.jpg`` matches jpg)."""
    specs = [_alternatives(p) for p in patterns]

    def extracted(sample: Any) -> Iterator[Tuple[Any, ...]]:
        result = []
        need_dict("extract_keys", sample)
        for alts in specs:
            matches = [k for k in sample if any(fnmatch("." + k, p) or fnmatch(k, p) for p in alts)]
            if not matches:
                if ignore_missing:
                    continue
                raise missing_field("extract_keys", f"no field matches {_spec_text(alts)!r}", sample)
            if len(matches) > 1 and duplicate_is_error:
                raise sample_error("extract_keys", f"fields {matches} all match "
                                   f"{_spec_text(alts)!r}", sample)
            result.append(sample[matches[0]])
        yield tuple(result)

    yield from handle_each(source, extracted, handler, "extract_keys")


extract_keys = pipelinefilter(_extract_keys)


def _rename_keys(source: Iterable[Dict[str, Any]], *args: Tuple[str, str], keep_unselected: bool = False,
                 must_match: bool = True, duplicate_is_error: bool = True,
                 handler: Callable[[Exception], Any] = reraise_exception, **kw: str) -> Iterator[Dict[str, Any]]:
    """Rename fields whose (lower-cased base) name matches a glob: ``(new, pattern)`` pairs
    or ``new=pattern``; later renamings win. Unmatched fields go unless ``keep_unselected``."""
    renamings = [(pattern, new) for new, pattern in args]
    renamings += [(pattern, new) for new, pattern in kw.items()]
    renamings.reverse()

    def renamed(sample: Any) -> Iterator[Dict[str, Any]]:
        result = {}
        matched = set()
        for path, value in need_dict("rename_keys", sample).items():
            fname = path.rsplit("/", 1)[-1].lower()
            new = next(((p, n) for p, n in renamings if fnmatch(fname, p)), None)
            if new is None:
                if keep_unselected:
                    result[path] = value
                continue
            matched.add(new[0])
            if new[1] in result:
                if duplicate_is_error:
                    raise sample_error("rename_keys", f"two fields renamed to {new[1]!r}", sample)
                continue
            result[new[1]] = value
        unmatched = [p for p, _ in renamings[::-1] if p not in matched]
        if must_match and unmatched:
            raise missing_field("rename_keys", f"no field matches {unmatched}", sample)
        yield result

    yield from handle_each(source, renamed, handler, "rename_keys")


rename_keys = pipelinefilter(_rename_keys)


# -- decoding by glob


def decode_bin(stream: IO[bytes]) -> bytes:
    """The bytes of a field."""
    return stream.read()


def decode_text(stream: IO[bytes]) -> str:
    """A field as UTF-8 text."""
    return stream.read().decode("utf-8")


def decode_pickle(stream: IO[bytes]) -> Any:
    """An unpickled field; refused under ``WDS_SECURE=1``, as pickles can run code.

    ``xdecode`` calls it only with ``unsafe=True`` (NOTE [unsafe decoders] in
    :mod:`wdsmp.autodecode`); without, a pattern mapped to it refuses the field.
    """
    if env.secure():
        raise DecodeError("decode_pickle: unpickling is refused while WDS_SECURE is set")
    return pickle.load(stream)


def _refuse_pickle(stream: IO[bytes]) -> NoReturn:
    """What ``decode_pickle`` becomes in an ``xdecode`` without ``unsafe=True``."""
    raise DecodeError("refusing to unpickle the field: unpickling runs arbitrary code; if the data is "
                      "trusted, pass unsafe=True to xdecode()")


default_decoders = [
    ("*.bin", decode_bin),
    ("*.txt", decode_text),
    ("*.pyd", decode_pickle),
]


def find_decoder(decoders: Sequence[Tuple[str, Any]], path: str) -> Any:
    """The decoder of the last ``(pattern, decoder)`` whose glob matches ``path``'s base name
    (lower-cased, also with a leading dot, so "*.jpg" matches a field "jpg"); None if none."""
    fname = path.rsplit("/", 1)[-1]
    if fname.startswith("__"):
        return identity
    fname = fname.lower()
    for pattern, decoder in reversed(decoders):
        if fnmatch(fname, pattern) or fnmatch("." + fname, pattern):
            return decoder
    return None


def _xdecode(source: Iterable[Dict[str, Any]], *args: Tuple[str, Any], must_decode: bool = True,
             defaults: Sequence[Tuple[str, Any]] = default_decoders,
             handler: Callable[[Exception], Any] = reraise_exception, unsafe: bool = False,
             **kw: Any) -> Iterator[Dict[str, Any]]:
    """Decode fields by glob: ``(pattern, decoder)`` pairs and ``extension=decoder``.

    A decoder is a function of a binary stream, False (or ``identity``) to keep
    the value as it is, or an image spec string ("rgb", "pil", ...) decoded by ``wdsmp.autodecode``. A
    field no pattern matches is an error while ``must_decode``. Pickles (``*.pyd``
    in the defaults, or any pattern mapped to ``decode_pickle``) are refused
    unless ``unsafe=True``, as ``decode()`` refuses them: a field the pipeline
    never asked for could otherwise run code (NOTE [unsafe decoders] in
    :mod:`wdsmp.autodecode`).
    """
    decoders = [*defaults, *args, *(("*." + ext, f) for ext, f in kw.items())]
    if not unsafe:
        decoders = [(p, _refuse_pickle if f is decode_pickle else f) for p, f in decoders]
    images = {}
    for _, spec in decoders:
        if isinstance(spec, str) and spec not in images:
            images[spec] = imagehandler(spec)
    path = None

    def decoded(sample: Any) -> Iterator[Dict[str, Any]]:
        nonlocal path
        result = {}
        path = None
        for path, data in need_dict("xdecode", sample).items():
            decoder = identity if path.startswith("__") else find_decoder(decoders, path)
            if decoder is False or decoder is identity:
                result[path] = data
            elif decoder is None:
                if must_decode:
                    raise sample_error("xdecode", f"no decoder for field {path!r}", sample)
                result[path] = data
            elif isinstance(decoder, str):
                result[path] = images[decoder]("." + path, data)
                if result[path] is None:
                    raise ValueError(f"image spec {decoder!r} does not decode {path!r}")
            else:
                result[path] = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
        yield result

    def where() -> Optional[str]:
        return None if path is None else f"field {path!r}"

    yield from handle_each(source, decoded, handler, "xdecode", where)


xdecode = pipelinefilter(_xdecode)
