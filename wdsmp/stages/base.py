"""What every stage is made of: currying, and the error protocol of stages.

Kept apart from :mod:`wdsmp.filters` so that every module holding stages
(filters, fields, batching) builds on it without import cycles;
``wdsmp.filters`` re-exports the public names, where webdataset has them.

NOTE [stage errors]: a stage that runs user code (``map``, ``select``,
``map_dict``, ...) passes each exception to its ``handler``: True skips the
item, False ends the stream, raising stops everything (``handle_each`` is
that loop, for every stage and shard reader). Before that, the
exception gets a note (``add_note``) naming the stage, the sample's
``__key__`` and ``__url__`` and the field, keeping its type and message
(wdsmp's own errors, which name the shard and member already, get none). A
field that is missing is a :class:`~wdsmp.errors.MissingFieldError` (a
SampleError, a KeyError and a ValueError) naming the shard, the key, the
wanted field and the fields the sample does have, where webdataset would
silently produce a wrong sample or a bare KeyError.
"""

from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Type

from ..errors import MissingFieldError, SampleError, WdsmpError

__all__ = [
    "Curried",
    "FilterFunction",
    "RestCurried",
    "add_note",
    "handle_each",
    "handled",
    "missing_field",
    "need_dict",
    "pipelinefilter",
    "sample_error",
]


class Curried:
    """``f`` with every argument but the upstream iterator bound; picklable."""

    def __init__(self, f: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.f = f
        self.args = args
        self.kw = kw

    def __call__(self, data: Any) -> Any:
        return self.f(data, *self.args, **self.kw)

    def __repr__(self) -> str:
        return f"<{self.f.__name__} {self.args} {self.kw}>"


FilterFunction = Curried  # webdataset's name for it


class RestCurried:
    """What ``pipelinefilter`` returns: call it with a stage's arguments."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f
        self.__name__ = getattr(f, "__name__", "stage").lstrip("_")
        self.__doc__ = f.__doc__

    def __call__(self, *args: Any, **kw: Any) -> Curried:
        return Curried(self.f, *args, **kw)

    def __repr__(self) -> str:
        return f"<stage {self.__name__}>"


def pipelinefilter(f: Callable[..., Any]) -> RestCurried:
    """Turn ``f(data, *args, **kw)`` into a stage constructor ``stage(*args, **kw)``."""
    return RestCurried(f)


# -- errors, NOTE [stage errors]


def add_note(exn: BaseException, text: str) -> None:
    """``exn.add_note(text)``, also before Python 3.11."""
    if hasattr(exn, "add_note"):
        exn.add_note(text)
    else:  # Python < 3.11: keep the note where 3.11's traceback would look
        exn.__notes__ = [*getattr(exn, "__notes__", []), text]


def handled(exn: Exception, handler: Callable[[Exception], Any], stage: str, item: Any,
            field: Optional[str] = None) -> Any:
    """Note where ``exn`` happened and ask ``handler``: True skips the item, False stops."""
    if not isinstance(exn, WdsmpError):  # wdsmp's own errors already say where
        where = [f"in wdsmp stage {stage}"]
        if isinstance(item, dict):
            if "__key__" in item:
                where.append(f"sample {item['__key__']!r}")
            if "__url__" in item:
                where.append(f"shard {item['__url__']!r}")
        if field:
            where.append(field)
        add_note(exn, ", ".join(where))
    return handler(exn)


def handle_each(data: Iterable[Any], step: Callable[[Any], Iterable[Any]], handler: Callable[[Exception], Any],
                stage: Optional[str] = None, where: Optional[Callable[[], Optional[str]]] = None) -> Iterator[Any]:
    """What ``step(item)`` yields, for each item of ``data``, under NOTE [stage errors].

    ``step`` is a generator function, so an item may give no output (a dropped
    sample), one, or many (a shard's members). An exception goes to ``handler``:
    True skips to the next item, False ends the stream. ``stage`` names the stage
    in the exception's note (None: no note, for errors that name their shard);
    ``where()``, if given, names the part of the item that failed.
    """
    for item in data:
        try:
            yield from step(item)
        except Exception as exn:
            if stage is None:
                go_on = handler(exn)
            else:
                go_on = handled(exn, handler, stage, item, where and where())
            if not go_on:
                break


def sample_error(stage: str, problem: str, sample: Mapping[str, Any],
                 error: Type[SampleError] = SampleError) -> SampleError:
    """An ``error`` (a SampleError) about ``sample`` naming its shard, key and fields."""
    fields = ", ".join(repr(k) for k in sample)
    return error(f"{stage}: {problem}; the sample has fields {fields}",
                 url=sample.get("__url__"), member=sample.get("__key__"))


def missing_field(stage: str, problem: str, sample: Mapping[str, Any]) -> SampleError:
    """The MissingFieldError of a stage that did not find a field in ``sample``."""
    return sample_error(stage, problem, sample, MissingFieldError)


def need_dict(stage: str, sample: Any) -> Dict[str, Any]:
    """``sample``, when it is a dict; a TypeError naming the stage otherwise."""
    if not isinstance(sample, dict):
        raise TypeError(f"{stage} needs dict samples, not {type(sample).__name__}")
    return sample
