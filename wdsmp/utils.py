"""Small helpers shared by the pipeline: who am I (node, worker), seeds, stage bases.

``pytorch_worker_info`` is the one place that decides which node and which
DataLoader worker the current process is; the shard splitters and the seeded
samplers all ask it, so they always agree.

``enforce_security`` is read-only here: it reports ``WDS_SECURE`` at the
moment it is read (webdataset reads it once, at import, into a flag that code
may overwrite). Assigning to it raises, because wdsmp's checks read the
environment, so a silently ignored assignment would leave a program that
asked for security without it.
"""

import functools
import hashlib
import importlib
import itertools
import re
import struct
import sys
import types
import warnings

from . import _env
from ._braces import fnmatch_with_braces, glob_with_braces
from .errors import WdsmpError

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


def _distributed_rank_world(group):
    """(rank, world_size) from torch.distributed when it is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group=group), dist.get_world_size(group=group)


def _dataloader_worker():
    """(worker, num_workers) inside a DataLoader worker process, else None."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return None
    info = get_worker_info()
    if info is None:
        return None
    return info.id, info.num_workers


def pytorch_worker_info(group=None):
    """``(rank, world_size, worker, num_workers)`` of the calling process.

    Node: torch.distributed when initialised, else ``RANK``/``WORLD_SIZE``
    (torchrun sets them before the process group exists), else ``(0, 1)``.
    Worker: the DataLoader's worker info, else ``WORKER``/``NUM_WORKERS``
    (webdataset's override), else ``(0, 1)``.
    """
    node = _distributed_rank_world(group) or _env.rank_world_size() or (0, 1)
    worker = _dataloader_worker() or _env.worker_num_workers() or (0, 1)
    return node[0], node[1], worker[0], worker[1]


def pytorch_worker_seed(group=None):
    """A seed distinct per node and worker, and the same on every run (webdataset's formula)."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def _encode(arg):
    """Bytes that name ``arg`` and its type, the same in every process."""
    if arg is None:
        return b"n"
    if isinstance(arg, bool):
        return b"t" if arg else b"f"
    if isinstance(arg, int):
        return b"i" + str(arg).encode()
    if isinstance(arg, float):
        return b"d" + struct.pack("<d", arg)
    if isinstance(arg, str):
        return b"s" + arg.encode("utf-8", "surrogatepass")
    if isinstance(arg, (bytes, bytearray, memoryview)):
        return b"b" + bytes(arg)
    if isinstance(arg, (tuple, list)):
        return b"(" + b"".join(_frame(a) for a in arg) + b")"
    raise TypeError(f"make_seed: cannot hash {type(arg).__name__} values deterministically")


def _frame(arg):
    data = _encode(arg)
    return struct.pack("<Q", len(data)) + data


def make_seed(*args):
    """A 31-bit seed from ints, strings, bytes, floats (and tuples of them).

    Unlike webdataset's, it never uses ``hash()``: string hashes are salted
    per process, so spawned workers would disagree on every seed.
    """
    digest = hashlib.blake2b(b"".join(_frame(a) for a in args), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def is_iterable(obj):
    """Whether ``obj`` can be iterated as a sequence of items (strings and bytes cannot)."""
    if isinstance(obj, (str, bytes, bytearray)):
        return False
    return hasattr(obj, "__iter__")


class PipelineStage:
    """Base of stage objects that ``DataPipeline`` calls as ``stage.run(upstream)``."""

    def run(self, *args, **kw):
        raise NotImplementedError(f"{type(self).__name__}.run")

    def invoke(self, *args, **kw):
        return self.run(*args, **kw)


def identity(x):
    """Return the argument: a picklable stand-in for ``lambda x: x``."""
    return x


def repeatedly0(loader, nepochs=sys.maxsize, nbatches=sys.maxsize):
    """Up to ``nbatches`` items from each of ``nepochs`` passes over ``loader``."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def guess_batchsize(batch):
    """The batch size of a tuple/list batch: the length of its first field."""
    return len(batch[0])


def repeatedly(source, nepochs=None, nbatches=None, nsamples=None, batchsize=guess_batchsize):
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


# -- names to objects


def lookup_sym(sym, modules):
    """Attribute ``sym`` of the first module in ``modules`` that has it (not None), else None.

    Relative module names (``".filters"``) are taken inside wdsmp, as
    webdataset takes them inside webdataset.
    """
    for name in modules:
        result = getattr(importlib.import_module(name, package=__package__), sym, None)
        if result is not None:
            return result
    return None


_SAFE_WORD = re.compile(r"[A-Za-z0-9_]*")
# Pure constructors and arithmetic: all an expression template may call.
_SAFE_BUILTINS = {f.__name__: f for f in (abs, bool, complex, dict, float, frozenset, int, len, list,
                                           max, min, round, set, str, tuple)}


def safe_eval(s, expr="{}"):
    """Evaluate ``expr`` with ``s`` put in its ``{}``, where ``s`` may come from data.

    ``s`` must be letters, digits and underscores (else ValueError), so it can
    only add a number or a name to the template. The expression sees no module
    globals and only a few pure builtins (``int``, ``float``, ``str``,
    ``tuple``, ...): a name in ``s`` cannot reach ``os``, ``open`` or
    ``__import__``. webdataset evaluates in its module's globals instead.
    """
    if not isinstance(s, str) or not _SAFE_WORD.fullmatch(s):
        raise ValueError(f"safe_eval: {s!r} may only hold letters, digits and underscores")
    if "__" in s:
        raise ValueError(f"safe_eval: {s!r} may not hold a double underscore")
    return eval(expr.format(s), {"__builtins__": _SAFE_BUILTINS}, {})  # noqa: S307 (restricted above)


# -- deprecation


def deprecated(arg=None):
    """Decorator: calls warn with a DeprecationWarning; ``@deprecated`` or ``@deprecated("reason")``."""
    reason = None if callable(arg) else arg

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kw):
            message = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                message += f" Reason: {reason}"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return func(*args, **kw)

        return wrapper

    return decorator(arg) if callable(arg) else decorator


class ObsoleteException(WdsmpError):
    """A function marked ``@obsolete`` was called without ``ALLOW_OBSOLETE=1``."""


def obsolete(func=None, *, reason=None):
    """Decorator: calls raise ObsoleteException unless the environment has ``ALLOW_OBSOLETE=1``."""
    if func is None:
        return functools.partial(obsolete, reason=reason)

    @functools.wraps(func)
    def wrapper(*args, **kw):
        if not _env.allow_obsolete():
            message = f"Call to obsolete function {func.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                message += f" Reason: {reason}"
            raise ObsoleteException(message)
        return func(*args, **kw)

    return wrapper


# -- mixing


def compute_sample_weights(n_w_pairs):
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


class _UtilsModule(types.ModuleType):
    """This module's type: it makes ``enforce_security`` a read-only view of ``WDS_SECURE``."""

    @property
    def enforce_security(self):
        """``WDS_SECURE=1`` now (webdataset: at import); see the module docstring."""
        return _env.secure()

    @enforce_security.setter
    def enforce_security(self, value):
        raise AttributeError("wdsmp.utils.enforce_security follows the WDS_SECURE environment variable; "
                             "set WDS_SECURE=1 (or pass secure=True where offered) instead of assigning it")

    def __dir__(self):
        return sorted({*super().__dir__(), "enforce_security"})


sys.modules[__name__].__class__ = _UtilsModule
