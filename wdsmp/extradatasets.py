"""Small IterableDatasets that change how long a dataset is, or fake one (webdataset's ``extradatasets``).

Each wraps a source as a dataset (``repeatedly`` and ``with_length`` are also
pipeline stages, whose ``run`` takes the upstream iterator), and each pickles,
so it can go to spawned DataLoader workers. webdataset's versions of
``repeatedly`` and ``with_epoch`` fail when used (an attribute never set, a
dataset never stored); these do what their documentation there says.
"""

import os
from typing import Any, Dict, Iterable, Iterator, Optional, TypeVar

from torch.utils.data import IterableDataset

from . import utils
from ._internal.validation import non_negative_int
from .utils import PipelineStage

__all__ = ["MockDataset", "repeatedly", "with_epoch", "with_length"]

_T = TypeVar("_T")


def _check_length(length: int, what: str) -> None:
    non_negative_int(length, what)


class MockDataset(IterableDataset):
    """The same ``sample``, ``length`` times: a source for benchmarks and tests that reads no data.

    Like webdataset's, it has no ``len()``: in a DataLoader every worker yields
    all ``length`` samples, and torch would warn about the excess.
    """

    def __init__(self, sample: Any, length: int) -> None:
        super().__init__()
        _check_length(length, "MockDataset length")
        self.sample = sample
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample


class repeatedly(IterableDataset, PipelineStage):  # noqa: N801 (webdataset's name)
    """Passes over ``source`` again and again, until ``nepochs`` passes or ``nbatches`` items.

    ``length``, when given, is what ``len()`` reports (nothing else uses it).
    As a stage (``source=None``) it repeats its upstream, which only an
    iterable such as a list can be; a pass that yields nothing ends it, so the
    one-shot iterator a DataPipeline hands its stages is passed through once
    (use ``DataPipeline.repeat`` there) rather than looped on forever.
    """

    def __init__(self, source: Optional[Iterable[Any]] = None, nepochs: Optional[int] = None,
                 nbatches: Optional[int] = None, length: Optional[int] = None) -> None:
        super().__init__()
        if length is not None:
            _check_length(length, "repeatedly length")
        self.source = source
        self.nepochs = nepochs
        self.nbatches = nbatches
        self.length = length

    def run(self, source: Iterable[_T]) -> Iterator[_T]:
        return utils.repeatedly(source, nepochs=self.nepochs, nbatches=self.nbatches)

    def __iter__(self) -> Iterator[Any]:
        if self.source is None:
            raise ValueError("repeatedly has no source: pass one, or use it as a pipeline stage")
        return self.run(self.source)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this repeatedly dataset has no length; pass length=")
        return self.length


class with_epoch(IterableDataset):  # noqa: N801 (webdataset's name)
    """Epochs of exactly ``length`` items from ``dataset``, passed through as often as needed.

    Each epoch starts a new pass over ``dataset``, as webdataset's does after a
    complete epoch (NOTE [epoch iterator] in :mod:`wdsmp.pipeline`).
    ``continuous=True`` keeps one pass between epochs instead, restarted when
    it runs dry, so successive epochs continue through the data rather than
    reread its start. The kept iterator belongs to the process that made it:
    it is dropped on pickling and ignored after a fork. An epoch is shorter
    only when the dataset is empty. ``len()`` is ``length``. (For a
    DataPipeline, its own ``.with_epoch(n)`` does the same.)
    """

    def __init__(self, dataset: Iterable[Any], length: int, *, continuous: bool = False) -> None:
        super().__init__()
        _check_length(length, "with_epoch length")
        self.dataset = dataset
        self.length = length
        self.continuous = bool(continuous)
        self.source: Optional[Iterator[Any]] = None
        self._source_pid: Optional[int] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["source"] = state["_source_pid"] = None  # a live iterator does not travel
        return state

    def __len__(self) -> int:
        return self.length

    def _next(self) -> Any:
        """The next item of the kept iterator, restarting it once when it ends; raises StopIteration if empty."""
        if self.source is None or self._source_pid != os.getpid():
            self.source, self._source_pid = iter(self.dataset), os.getpid()
        try:
            return next(self.source)
        except StopIteration:
            self.source = iter(self.dataset)
            return next(self.source)

    def __iter__(self) -> Iterator[Any]:
        if not self.continuous:
            self.source = None
        for _ in range(self.length):
            try:
                item = self._next()
            except StopIteration:
                self.source = None
                return
            yield item


class with_length(IterableDataset, PipelineStage):  # noqa: N801 (webdataset's name)
    """``dataset`` unchanged, but with ``len()`` returning ``length``, for loops that insist on one.

    It does not change how many items an epoch yields.
    """

    def __init__(self, dataset: Iterable[Any], length: int) -> None:
        super().__init__()
        _check_length(length, "with_length length")
        self.dataset = dataset
        self.length = length

    def run(self, upstream: Iterable[_T]) -> Iterator[_T]:
        return iter(upstream)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def __len__(self) -> int:
        return self.length
