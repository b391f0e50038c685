"""Batching: samples to batches (collation) and back, as webdataset's filters do it.

:mod:`wdsmp.filters` re-exports these names, where webdataset has them.

``default_collation_fn`` follows webdataset 1.0.2 value for value: a field of
Python ints/floats becomes a numpy array, of torch tensors a stacked tensor,
of numpy arrays a stacked array, and anything else (strings, bytes, nested
dicts, None) a list. Unlike webdataset it says which field and which shapes
when the tensors of a field disagree, and it keeps the fields in order.

In a DataLoader worker, tensors are stacked straight into shared memory, as
torch's own ``default_collate`` does: a batch then reaches the main process
without the copy into shared memory the DataLoader otherwise makes (for
ImageNet-sized float batches, about a third of a millisecond of CPU per
image; benchmarks/RESULTS.md). The values are the same either way.

torch is imported only for tensors: a value can only be a tensor once torch
has been imported by whoever made it.
"""

import sys
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .base import pipelinefilter
from .._internal.validation import positive_int

__all__ = [
    "batched",
    "combine_values",
    "default_collation_fn",
    "dict2tuple",
    "tuple2dict",
    "unbatched",
    "unlisted",
]


def _check_shapes(values: Sequence[Any], name: Optional[str]) -> None:
    shape = values[0].shape
    for i, value in enumerate(values):
        other = getattr(value, "shape", None)
        if other != shape:
            raise ValueError(f"cannot collate {name or 'values'}: sample 0 has shape "
                             f"{tuple(shape)}, sample {i} has shape "
                             f"{None if other is None else tuple(other)}")


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _stack(tensors: List[Any]) -> Any:
    """``torch.stack(tensors)``; in a DataLoader worker, into shared memory for plain CPU
    tensors of one dtype without grad (through ``default_collate``, which does that)."""
    import torch
    from torch.utils.data import default_collate, get_worker_info

    first = tensors[0]
    if (get_worker_info() is not None and type(first) is torch.Tensor and first.layout == torch.strided
            and first.device.type == "cpu"
            and all(t.dtype == first.dtype and not t.requires_grad and type(t) is torch.Tensor for t in tensors)):
        return default_collate(tensors)
    return torch.stack(tensors)


def combine_values(b: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True,
                   name: Optional[str] = None) -> Any:
    """One batched value from the values ``b`` of one field; ``name`` is for messages."""
    first = b[0]
    if isinstance(first, (int, float)):  # bool and np.float64 too, as in webdataset
        return np.array(list(b)) if combine_scalars else list(b)
    if _is_tensor(first):
        if not combine_tensors:
            return list(b)
        _check_shapes(b, name)
        return _stack(list(b))
    if isinstance(first, np.ndarray):
        if not combine_tensors:
            return list(b)
        _check_shapes(b, name)
        return np.stack(list(b))
    return list(b)


def tuple2dict(l: Union[Dict[Any, Any], Sequence[Any]]) -> Dict[Any, Any]:  # noqa: E741 (webdataset's parameter name)
    """A tuple/list ``l`` as a dict keyed by position; a dict as it is."""
    if isinstance(l, dict):
        return l
    return dict(enumerate(l))


def dict2tuple(d: Dict[int, Any]) -> Tuple[Any, ...]:
    """The inverse of ``tuple2dict``."""
    return tuple(d[i] for i in range(1 + max(d.keys())))


def default_collation_fn(samples: Sequence[Any], combine_tensors: bool = True,
                         combine_scalars: bool = True) -> Any:
    """A batch from a list of samples: a tuple for tuples and lists, else a dict (of fields
    for dicts; of positions along the first axis for arrays and tensors, as webdataset)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    rows = [tuple2dict(x) for x in samples]
    keys = list(rows[0])
    for i, row in enumerate(rows):
        if row.keys() != rows[0].keys():
            what = "fields" if isinstance(samples[0], dict) else "positions"
            raise ValueError(f"cannot collate samples with different {what}: sample 0 has "
                             f"{keys}, sample {i} has {list(row)}")
    is_dict = isinstance(samples[0], dict)
    is_tuple = isinstance(samples[0], (list, tuple))
    result = {}
    for k in keys:
        name = f"field {k!r}" if is_dict else f"position {k}"
        result[k] = combine_values([row[k] for row in rows], combine_tensors, combine_scalars,
                                   name)
    return dict2tuple(result) if is_tuple else result


def _batched(data: Iterable[Any], batchsize: int = 20,
             collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
             partial: bool = True) -> Iterator[Any]:
    """Batches of ``batchsize`` samples, collated with ``collation_fn`` (None: lists).

    A batch is handed on as soon as it is full; the last, shorter one only
    with ``partial=True``.
    """
    positive_int(batchsize, "batchsize")
    batch = []
    for sample in data:
        batch.append(sample)
        if len(batch) == batchsize:
            yield batch if collation_fn is None else collation_fn(batch)
            batch = []
    if batch and partial:
        yield batch if collation_fn is None else collation_fn(batch)


batched = pipelinefilter(_batched)



def _unlisted(data: Iterable[Any]) -> Iterator[Any]:
    """The samples of each list batch (the inverse of ``batched(collation_fn=None)``)."""
    for batch in data:
        if not isinstance(batch, list):
            raise TypeError(f"unlisted needs list batches, not {type(batch).__name__}")
        yield from batch


unlisted = pipelinefilter(_unlisted)



def _unbatched(data: Iterable[Any]) -> Iterator[Any]:
    """The samples of each collated batch (the inverse of ``batched()``)."""
    for batch in data:
        if isinstance(batch, (list, tuple)):
            if not batch:
                raise ValueError("unbatched: a batch with no fields")
            for i in range(len(batch[0])):
                yield tuple(x[i] for x in batch)
        elif isinstance(batch, dict):
            lengths = {k: len(v) for k, v in batch.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"unbatched: fields of different lengths {lengths}")
            for i in range(next(iter(lengths.values()), 0)):
                yield {k: v[i] for k, v in batch.items()}
        else:
            raise ValueError(f"unbatched: unknown batch type {type(batch).__name__}")




unbatched = pipelinefilter(_unbatched)
