"""webdataset's ``utils`` names, and the small iteration helpers that have no other home.

The rest lives in one module per idea, re-exported here under webdataset's
names: who am I (``_workerinfo``), seeds (``_seeding``), brace patterns
(``_braces``), names to objects (``_symbols``), deprecation
(``_deprecation``).

``enforce_security`` is webdataset's switch for secure mode, kept working:
reading it reports ``WDS_SECURE`` at that moment; assigning True or False
sets ``WDS_SECURE`` to 1 or 0 for this process and the DataLoader workers and
``pipe:`` commands it starts afterwards (webdataset's flag is a plain module
variable, which a spawned worker would not see). wdsmp's checks read
``WDS_SECURE`` when they run, so the assignment takes effect at once.
"""

import itertools
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

from ._internal import env
from ._internal.braces import fnmatch_with_braces, glob_with_braces
from ._internal.deprecation import ObsoleteException, deprecated, obsolete
from ._internal.seeding import make_seed
from ._internal.symbols import lookup_sym, safe_eval
from ._internal.workerinfo import pytorch_worker_info

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "ObsoleteException",
    "PipelineStage",
    "compute_sample_weights",
    "deprecated",
    "enforce_security",  # a property of this module's type: see _UtilsModule
    "fnmatch_with_braces",
    "glob_with_braces",
    "guess_batchsize",
    "identity",
    "is_iterable",
    "lookup_sym",
    "make_seed",
    "obsolete",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
    "repeatedly0",
    "safe_eval",
]

_T = TypeVar("_T")


def is_iterable(obj: object) -> bool:
    """Whether ``obj`` can be iterated as a sequence of items (strings and bytes cannot)."""
    if isinstance(obj, (str, bytes, bytearray)):
        return False
    return hasattr(obj, "__iter__")


class PipelineStage:
    """Base of stage objects that ``DataPipeline`` calls as ``stage.run(upstream)``."""

    def run(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.run")

    def invoke(self, *args: Any, **kw: Any) -> Any:
        return self.run(*args, **kw)


def pytorch_worker_seed(group: Any = None) -> int:
    """A seed distinct per node and worker, and the same on every run (webdataset's formula),
    from this module's ``pytorch_worker_info`` as it is at the call: a replacement assigned
    there counts here too, as in webdataset."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def identity(x: _T) -> _T:
    """Return the argument: a picklable stand-in for ``lambda x: x``."""
    return x


def repeatedly0(loader: Iterable[_T], nepochs: int = sys.maxsize, nbatches: int = sys.maxsize) -> Iterator[_T]:
    """Up to ``nbatches`` items from each of ``nepochs`` passes over ``loader``."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def guess_batchsize(batch: Sequence[Any]) -> int:
    """The batch size of a tuple/list batch: the length of its first field."""
    return len(batch[0])


def repeatedly(source: Iterable[_T], nepochs: Optional[int] = None, nbatches: Optional[int] = None,
               nsamples: Optional[int] = None, batchsize: Callable[[Any], int] = guess_batchsize) -> Iterator[_T]:
    """Items from repeated passes over ``source``, until a limit is reached.

    Stops after ``nepochs`` passes, ``nbatches`` items or ``nsamples`` samples
    (counted with ``batchsize(item)``), whichever comes first; a pass that
    yields nothing ends it too, so an exhausted iterator cannot loop forever.
    """
    epoch = batches = total = 0
    while nepochs is None or epoch < nepochs:
        count = 0
        for item in source:
            yield item
            count += 1
            batches += 1
            if nbatches is not None and batches >= nbatches:
                return
            if nsamples is not None:
                total += batchsize(item)
                if total >= nsamples:
                    return
        if count == 0:
            return
        epoch += 1


# -- mixing


def compute_sample_weights(n_w_pairs: Iterable[Tuple[float, float]]) -> "np.ndarray":
    """Relative sampling probabilities from ``(count, weight)`` pairs: count * weight, scaled to max 1."""
    import numpy as np

    pairs = list(n_w_pairs)
    if not pairs:
        raise ValueError("compute_sample_weights needs at least one (count, weight) pair")
    weighted = np.array([n for n, _ in pairs], dtype=float) * np.array([w for _, w in pairs], dtype=float)
    if not np.all(np.isfinite(weighted)) or (weighted < 0).any() or weighted.max() <= 0:
        raise ValueError(f"compute_sample_weights needs finite, non-negative products with one positive, "
                         f"got {weighted.tolist()}")
    return weighted / weighted.max()


# -- the security flag, read when it is asked for
#
# A module-level __getattr__ (PEP 562) would serve the reads, but not the assignment: that
# would store a plain attribute which then shadows __getattr__, and wdsmp's checks, which
# read WDS_SECURE, would never see it. Setting the module's __class__ to a ModuleType subclass is the way
# the language reference gives for customising attribute assignment on a module.


class _UtilsModule(types.ModuleType):
    """This module's type: it makes ``enforce_security`` a view of ``WDS_SECURE``."""

    @property
    def enforce_security(self) -> bool:
        """``WDS_SECURE=1`` now (webdataset: at import); see the module docstring."""
        return env.secure()

    @enforce_security.setter
    def enforce_security(self, value: object) -> None:
        if not isinstance(value, (bool, int)):
            raise TypeError(f"wdsmp.utils.enforce_security takes True or False, not {value!r}")
        env.set_secure(bool(value))

    def __dir__(self) -> List[str]:
        return sorted({*super().__dir__(), "enforce_security"})


sys.modules[__name__].__class__ = _UtilsModule
