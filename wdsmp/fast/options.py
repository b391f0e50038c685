"""FastLoader's arguments, checked once when the loader is made: ``LoaderOptions`` and the
crop settings inside it, ``DecodeOptions``.

Both are frozen dataclasses that check and normalise their fields in
``__post_init__`` (as ``remote.RemoteOptions`` does): a value that made one
is valid, so what runs per batch or per image (the workers, ``imagedecode``)
takes them as they are. Arguments that another part checks where it consumes
them are stored as given: ``rank``, ``world_size``, ``policy`` and
``epoch_batches`` (``epochplan.plan_epoch``, run by the loader's constructor),
``fields`` (the loader's slot layout).
"""

import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Tuple, Union

from .. import handlers
from ..images.size import loader_pixel_budget
from .._internal.validation import is_int, positive_int
from ..utils import pytorch_worker_info
from .pool import START_METHODS

__all__ = ["IMAGE_KEYS", "ORDERS", "DecodeOptions", "LoaderOptions", "default_workers", "positive_range",
           "unit_fraction"]

ORDERS = ("auto", "global", "shards")
IMAGE_KEYS = ("jpg", "jpeg", "png", "ppm", "pgm", "npy", "webp", "bmp", "tif", "tiff")


def positive_range(value: Any, name: str) -> Tuple[float, float]:
    """``(low, high)`` as floats with ``0 < low <= high``; ValueError naming ``name`` otherwise."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of numbers, not {value!r}") from None
    if not 0 < low <= high:
        raise ValueError(f"{name} {value!r} is not (low, high) with 0 < low <= high")
    return low, high


def unit_fraction(value: Any, name: str, *, zero: bool = True) -> float:
    """``value`` as a float in [0, 1] (``zero=False``: in (0, 1]); ValueError naming ``name`` otherwise."""
    interval = "[0, 1]" if zero else "(0, 1]"
    number: Optional[float]
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or not (0 <= number <= 1 if zero else 0 < number <= 1):
        raise ValueError(f"{name} must be in {interval}, not {value!r}")
    return number


# The default of a field that ``__post_init__`` fills in (None as given): its type is what it holds then.
_FILLED: Any = None


def _set(options: object, name: str, value: object) -> None:
    object.__setattr__(options, name, value)  # normalising a frozen dataclass in __post_init__


@dataclass(frozen=True)
class DecodeOptions:
    """How images are cropped (``imagedecode.decode_into``'s arguments): a random resized crop
    (``scale``, ``ratio``) flipped with probability ``flip`` when ``train``, else the centre
    crop of the image resized to ``size / resize_ratio``; ``dct_scaling`` and ``region``
    let JPEGs be decoded smaller and in part (NOTE [jpeg regions]); ``max_pixels`` is the most
    pixels one image may decode to (None: ``imagesize.loader_pixel_budget``)."""

    train: bool = True
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    resize_ratio: float = 0.875
    dct_scaling: bool = True
    region: bool = True
    max_pixels: Optional[int] = None

    def __post_init__(self) -> None:
        _set(self, "train", bool(self.train))
        _set(self, "scale", positive_range(self.scale, "scale"))
        _set(self, "ratio", positive_range(self.ratio, "ratio"))
        _set(self, "flip", unit_fraction(self.flip, "flip probability"))
        _set(self, "resize_ratio", unit_fraction(self.resize_ratio, "resize_ratio", zero=False))
        _set(self, "dct_scaling", bool(self.dct_scaling))
        _set(self, "region", bool(self.region))
        if self.max_pixels is not None:
            positive_int(self.max_pixels, "max_image_pixels")


def _image_size(value: Any) -> Tuple[Any, ...]:
    size = (value, value) if isinstance(value, int) else tuple(value)
    if len(size) != 2 or not all(is_int(v, 1) for v in size):
        raise ValueError(f"image_size must be a positive int or (height, width), not {value!r}")
    return size


def _extensions(value: Any, name: str) -> Tuple[Any, ...]:
    keys = tuple(value.split(";")) if isinstance(value, str) else tuple(value)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{name} must name extensions, as 'jpg;png' or a list, not {value!r}")
    return keys


def default_workers(environ: Mapping[str, str] = os.environ) -> int:
    """The default worker count: the CPUs this process may run on (its affinity mask), shared
    among the processes of this node that torchrun started (``LOCAL_WORLD_SIZE``), at least 1.
    Without the share, 8 ranks on a 16-core node would start 128 workers."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    local = environ.get("LOCAL_WORLD_SIZE", "")
    return max(1, cpus // int(local) if local.isdigit() and int(local) > 0 else cpus)


@dataclass(frozen=True)
class LoaderOptions:
    """``FastLoader``'s arguments but the data (``urls``, ``index``), checked, with defaults
    filled in: ``num_workers`` (``default_workers()``), ``shuffle`` (``train``),
    ``shuffle_buffer`` (256 when shuffling, else 0), ``rank`` and ``world_size``
    (torch.distributed's, else ``RANK``/``WORLD_SIZE``); ``order`` "auto", "global" or
    "shards" (the loader resolves "auto" once it knows the shards); ``image_size``
    is ``(height, width)``, ``image_keys`` a tuple, ``progress`` seconds between reports or None,
    ``start_method`` "spawn" or "fork" ("forkserver" is "spawn": NOTE [worker processes] in
    ``pool.py``). ``decode`` holds the crop arguments (``scale``, ``ratio``, ``flip``,
    ``resize_ratio``, ``dct_scaling``), ``train`` and the pixel budget (``max_pixels``, resolved
    by ``imagesize.loader_pixel_budget``). See ``FastLoader`` for what each means."""

    batch_size: int = 256
    decode: DecodeOptions = DecodeOptions()
    num_workers: int = _FILLED
    image_size: Tuple[int, int] = (224, 224)
    seed: object = 0
    label: Union[str, Callable, None] = "cls"
    image_keys: Tuple[str, ...] = IMAGE_KEYS
    keys: bool = False
    key_length: int = 128
    fields: Optional[dict] = None
    stages: Tuple[Callable, ...] = ()
    handler: Callable = handlers.reraise_exception
    shuffle: bool = _FILLED
    shuffle_buffer: int = _FILLED
    rank: int = _FILLED
    world_size: int = _FILLED
    policy: str = "drop"
    resampled: bool = False
    epoch_batches: Optional[int] = None
    channels_first: bool = False
    copy: bool = False
    prefetch: int = 2
    timeout: Optional[float] = None
    stall_timeout: Optional[float] = 120.0
    start_method: str = "spawn"
    progress: Union[bool, float, None] = False
    cache_dir: Optional[str] = None
    exact: bool = True
    order: str = "auto"

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "batch_size")
        if not isinstance(self.decode, DecodeOptions):
            raise TypeError(f"decode must be a DecodeOptions, not {type(self.decode).__name__}")
        _set(self, "num_workers", default_workers() if self.num_workers is None
             else positive_int(self.num_workers, "num_workers"))
        positive_int(self.prefetch, "prefetch")
        _set(self, "image_size", _image_size(self.image_size))
        # The pixel budget resolved once, here (WDSMP_MAX_IMAGE_PIXELS read as the loader is made),
        # not for every image in the workers.
        _set(self, "decode", replace(self.decode, max_pixels=loader_pixel_budget(self.decode.max_pixels,
                                                                                *self.image_size)))
        if not (self.label is None or callable(self.label) or (isinstance(self.label, str) and self.label)):
            raise ValueError(f"label must be an extension name, a function or None, not {self.label!r}")
        _set(self, "image_keys", _extensions(self.image_keys, "image_keys"))
        _set(self, "keys", bool(self.keys))
        if self.keys:
            positive_int(self.key_length, "key_length")
        _set(self, "stages", tuple(self.stages))
        for stage in self.stages:
            if not callable(stage):
                raise ValueError(f"stages must be callables (iterator -> iterator), not {stage!r}")
        if not callable(self.handler):
            raise ValueError(f"handler must be callable, not {self.handler!r}")
        _set(self, "shuffle", self.decode.train if self.shuffle is None else bool(self.shuffle))
        buffer = (256 if self.shuffle else 0) if self.shuffle_buffer is None else self.shuffle_buffer
        if not is_int(buffer, 0):
            raise ValueError(f"shuffle_buffer must be an int >= 0, not {self.shuffle_buffer!r}")
        _set(self, "shuffle_buffer", buffer)
        node = pytorch_worker_info()
        _set(self, "rank", node[0] if self.rank is None else self.rank)
        _set(self, "world_size", node[1] if self.world_size is None else self.world_size)
        _set(self, "resampled", bool(self.resampled))
        _set(self, "channels_first", bool(self.channels_first))
        _set(self, "copy", bool(self.copy))
        for name in ("timeout", "stall_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{name} must be None or a positive number of seconds, not {value!r}")
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, not {self.start_method!r}")
        _set(self, "start_method", "fork" if self.start_method == "fork" else "spawn")
        if not isinstance(self.exact, bool):
            raise ValueError(f"exact must be True or False, not {self.exact!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, not {self.order!r}")
        if self.order == "global" and (self.resampled or not self.exact or not self.shuffle):
            raise ValueError("order='global' shuffles every sample of an exact epoch: it needs shuffle=True "
                             "(the default when train=True), exact=True and resampled=False")
        progress = self.progress
        if isinstance(progress, bool) or progress is None:
            progress = 10.0 if progress else None
        elif not progress > 0:
            raise ValueError(f"progress must be a bool or seconds between reports, not {progress!r}")
        _set(self, "progress", progress)

    @property
    def train(self) -> bool:
        return self.decode.train
