"""FastLoader's arguments, checked once when the loader is made: ``LoaderOptions`` and the
crop settings inside it, ``DecodeOptions``.

Both are frozen dataclasses, made by their ``of`` constructor, which checks and normalises
the arguments: a value made so is valid, so what runs per batch or per image (the workers,
``imagedecode``) takes it as it is. Arguments that another part checks where it consumes
them are stored as given: ``rank``, ``world_size``, ``policy`` and ``epoch_batches``
(``wdsmp.epochs.plan``, run by the loader's constructor), ``fields`` (the loader's slot
layout).
"""

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

from .. import handlers
from ..images.size import loader_pixel_budget
from .._internal.validation import is_int, positive_int
from .. import utils
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


@dataclass(frozen=True)
class DecodeOptions:
    """How images are cropped (``imagedecode.decode_into``'s arguments): a random resized crop
    (``scale``, ``ratio``) flipped with probability ``flip`` when ``train``, else the centre
    crop of the image resized to ``size / resize_ratio``; ``dct_scaling`` and ``region``
    let JPEGs be decoded smaller and in part (NOTE [jpeg regions]); ``max_pixels`` is the most
    pixels one image may decode to (None: ``imagesize.loader_pixel_budget``). :meth:`of` checks
    and normalises the arguments; the constructor takes values known to be valid."""

    train: bool = True
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    resize_ratio: float = 0.875
    dct_scaling: bool = True
    region: bool = True
    max_pixels: Optional[int] = None

    @classmethod
    def of(cls, train: object = True, scale: Any = (0.08, 1.0), ratio: Any = (3 / 4, 4 / 3), flip: Any = 0.5,
           resize_ratio: Any = 0.875, dct_scaling: object = True, region: object = True,
           max_pixels: Optional[int] = None) -> "DecodeOptions":
        """The options, checked (ValueError naming the argument) and normalised: floats, tuples, bools."""
        return cls(bool(train), positive_range(scale, "scale"), positive_range(ratio, "ratio"),
                   unit_fraction(flip, "flip probability"), unit_fraction(resize_ratio, "resize_ratio", zero=False),
                   bool(dct_scaling), bool(region),
                   None if max_pixels is None else positive_int(max_pixels, "max_image_pixels"))


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


# A function of one sample dict: a label, a field's array, the stages' elements.
Sample = Dict[str, Any]
Stage = Callable[[Iterator[Sample]], Iterator[Sample]]


def _image_size(value: Any) -> Tuple[int, int]:
    size = (value, value) if isinstance(value, int) else tuple(value)
    if len(size) != 2 or not all(is_int(v, 1) for v in size):
        raise ValueError(f"image_size must be a positive int or (height, width), not {value!r}")
    return int(size[0]), int(size[1])


def _extensions(value: Any, name: str) -> Tuple[str, ...]:
    keys = tuple(value.split(";")) if isinstance(value, str) else tuple(value)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{name} must name extensions, as 'jpg;png' or a list, not {value!r}")
    return keys


def _label(value: Any) -> Any:
    if not (value is None or callable(value) or (isinstance(value, str) and value)):
        raise ValueError(f"label must be an extension name, a function or None, not {value!r}")
    return value


def _stages(value: Any) -> Tuple[Stage, ...]:
    stages = tuple(value)
    for stage in stages:
        if not callable(stage):
            raise ValueError(f"stages must be callables (iterator -> iterator), not {stage!r}")
    return stages


def _handler(value: Any) -> Callable[[Exception], Any]:
    if not callable(value):
        raise ValueError(f"handler must be callable, not {value!r}")
    return value  # type: ignore[no-any-return]  # callable() narrows to a callable of any signature


def _shuffle_buffer(value: Any, shuffle: bool) -> int:
    buffer = (256 if shuffle else 0) if value is None else value
    if not is_int(buffer, 0):
        raise ValueError(f"shuffle_buffer must be an int >= 0, not {value!r}")
    return int(buffer)


def _seconds(value: Any, name: str) -> Optional[float]:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError(f"{name} must be None or a positive number of seconds, not {value!r}")
    return value


def _start_method(value: Any) -> str:
    if value not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, not {value!r}")
    return "fork" if value == "fork" else "spawn"


def _progress(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return 10.0 if value else None
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"progress must be a bool or seconds between reports, not {value!r}")
    return float(value)


def _exact(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"exact must be True or False, not {value!r}")
    return value


def _order(value: Any, shuffle: bool, resampled: bool, exact: bool) -> str:
    if value not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {value!r}")
    if value == "global" and (resampled or not exact or not shuffle):
        raise ValueError("order='global' shuffles every sample of an exact epoch: it needs shuffle=True "
                         "(the default when train=True), exact=True and resampled=False")
    return str(value)


@dataclass(frozen=True)
class LoaderOptions:
    """Every setting of ``FastLoader`` but the data (``urls``, ``index``): the one place they
    are defined. ``FastLoader(urls, batch_size, **options)`` passes its keywords to :meth:`of`,
    which checks them and fills in the defaults that depend on the machine, the ranks or other
    settings (those given as None below); the constructor takes values known to be valid.

    The types are those the settings hold once made; ``image_size`` may also be given as one
    int, ``image_keys`` as ``"jpg;png"``, ``stages`` as any sequence, ``progress`` as a bool.

    Args:
        batch_size: Images per batch.
        num_workers: Worker processes. None: the CPUs this process may use, divided among the
            node's ranks under torchrun (``LOCAL_WORLD_SIZE``).
        image_size: The output's size: an int, or ``(height, width)``.
        train: Random resized crops and flips; False: the centre crop, as torchvision's eval
            transforms take it.
        seed: With the epoch, fixes the order, the shuffle buffers and every crop.
        label: The extension that holds each sample's integer label (``.cls`` text: ASCII
            digits, an optional sign), a function ``sample -> int``, or None for no labels.
        image_keys: The extensions an image may have (a list, or ``"jpg;png"``); the first
            present is the sample's image.
        keys: Give each batch its samples' keys (``batch.keys``).
        key_length: With ``keys``, the longest key in bytes.
        fields: Fixed-shape arrays per sample, ``{name: (source, shape, dtype)}``; ``source``
            is an extension holding ``.npy`` bytes or numbers as text, or a function
            ``sample -> array``; values must fit the dtype as they are.
        stages: Functions iterator -> iterator (``wdsmp.select(...)``, ``wdsmp.map(...)``) run
            on the sample dicts in the workers, before decoding; they must pickle.
        handler: What a bad sample does: raise a ``WorkerError`` naming the worker, shard and
            member (the default), or, with ``wdsmp.warn_and_continue``, be skipped and counted.
        shuffle: Shuffle the epoch's order. None: as ``train``.
        shuffle_buffer: Samples each worker shuffles among. None: 256 in shard order, 0 in the
            global order.
        rank: This process's rank. None: torch.distributed's, else ``RANK``.
        world_size: The number of ranks. None: torch.distributed's, else ``WORLD_SIZE``.
        policy: How ranks are evened out: "drop" leaves out the few samples left over, "pad"
            repeats a few.
        resampled: Draw shards with replacement for ever, ``epoch_batches`` per epoch.
        epoch_batches: With ``resampled``, the batches of an epoch.
        scale: With ``train``, RandomResizedCrop's range of area fractions.
        ratio: With ``train``, RandomResizedCrop's range of aspect ratios (width / height).
        flip: With ``train``, the probability of a horizontal flip.
        resize_ratio: Without ``train``, the short side is resized to ``image_size /
            resize_ratio`` before the centre crop.
        dct_scaling: Let libjpeg-turbo decode a JPEG at 1/2, 1/4 or 1/8 of its size where the
            crop is that much smaller than the output (nearly the same image, less work).
        channels_first: NCHW image views instead of NHWC.
        copy: Copy each batch out of shared memory, to keep it past the next one.
        prefetch: Batches each worker keeps in flight in the ring.
        timeout: Seconds to wait for any one batch; None: no limit.
        stall_timeout: Seconds a worker may show no sign of life before it is killed and
            reported; None: never.
        start_method: "spawn" (fresh interpreters that import neither your script's code nor
            torch) or "fork" (quicker to start; copies every lock of your process).
        progress: Print the rate and the bottleneck to stderr: every 10 s (True) or every so
            many seconds.
        cache_dir: Where remote shards are fetched, each once, and where local shards' counts
            are kept. None: remote shards are streamed, counts kept in the user's cache.
        max_image_pixels: The most pixels one image may decode to, else a ``DecodeError``.
            None: ``WDSMP_MAX_IMAGE_PIXELS``, else the larger of 64 Mi and 256 times the
            output's pixels.
        exact: Refuse, on several ranks, shards whose counts are unknown; False: deal whole
            shards to the ranks instead.
        order: "auto" (every sample shuffled where the shards allow it, else shard by shard),
            "global" (every sample shuffled, remote shards fetched into ``cache_dir`` first)
            or "shards" (shard by shard, as webdataset reads).
    """

    batch_size: int = 256
    num_workers: int = None  # type: ignore[assignment]  # None until of() fills it in
    image_size: Tuple[int, int] = (224, 224)
    train: bool = True
    seed: Any = 0
    label: Union[str, Callable[[Sample], int], None] = "cls"
    image_keys: Tuple[str, ...] = IMAGE_KEYS
    keys: bool = False
    key_length: int = 128
    fields: Optional[Dict[str, Tuple[Any, Tuple[int, ...], Any]]] = None
    stages: Tuple[Stage, ...] = ()
    handler: Callable[[Exception], Any] = handlers.reraise_exception
    shuffle: bool = None  # type: ignore[assignment]  # None until of() fills it in
    shuffle_buffer: int = None  # type: ignore[assignment]  # None until of() fills it in
    rank: int = None  # type: ignore[assignment]  # None until of() fills it in
    world_size: int = None  # type: ignore[assignment]  # None until of() fills it in
    policy: str = "drop"
    resampled: bool = False
    epoch_batches: Optional[int] = None
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    resize_ratio: float = 0.875
    dct_scaling: bool = True
    channels_first: bool = False
    copy: bool = False
    prefetch: int = 2
    timeout: Optional[float] = None
    stall_timeout: Optional[float] = 120.0
    start_method: str = "spawn"
    progress: Optional[float] = False
    cache_dir: Optional[str] = None
    max_image_pixels: Optional[int] = None
    exact: bool = True
    order: str = "auto"

    @classmethod
    def of(cls, **given: Any) -> "LoaderOptions":
        """The settings ``given`` (FastLoader's keywords), checked, with every default filled in:
        TypeError for a keyword that is no setting, ValueError naming the setting for a bad
        value."""
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = [name for name in given if name not in names]
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"FastLoader got an unexpected keyword argument {unknown[0]!r}{hint}")
        raw = cls(**given)
        decode = DecodeOptions.of(raw.train, raw.scale, raw.ratio, raw.flip, raw.resize_ratio, raw.dct_scaling,
                                  max_pixels=raw.max_image_pixels)
        image_size = _image_size(raw.image_size)
        shuffle = decode.train if raw.shuffle is None else bool(raw.shuffle)
        node_rank, node_world = utils.pytorch_worker_info()[:2]
        return cls(
            batch_size=positive_int(raw.batch_size, "batch_size"),
            num_workers=default_workers() if raw.num_workers is None else positive_int(raw.num_workers, "num_workers"),
            image_size=image_size, train=decode.train, seed=raw.seed, label=_label(raw.label),
            image_keys=_extensions(raw.image_keys, "image_keys"), keys=bool(raw.keys),
            key_length=positive_int(raw.key_length, "key_length") if raw.keys else raw.key_length,
            fields=raw.fields, stages=_stages(raw.stages), handler=_handler(raw.handler), shuffle=shuffle,
            shuffle_buffer=_shuffle_buffer(raw.shuffle_buffer, shuffle),
            rank=node_rank if raw.rank is None else raw.rank,
            world_size=node_world if raw.world_size is None else raw.world_size,
            policy=raw.policy, resampled=bool(raw.resampled), epoch_batches=raw.epoch_batches,
            scale=decode.scale, ratio=decode.ratio, flip=decode.flip, resize_ratio=decode.resize_ratio,
            dct_scaling=decode.dct_scaling, channels_first=bool(raw.channels_first), copy=bool(raw.copy),
            prefetch=positive_int(raw.prefetch, "prefetch"), timeout=_seconds(raw.timeout, "timeout"),
            stall_timeout=_seconds(raw.stall_timeout, "stall_timeout"), start_method=_start_method(raw.start_method),
            progress=_progress(raw.progress), cache_dir=raw.cache_dir,
            # The pixel budget resolved once, here (WDSMP_MAX_IMAGE_PIXELS read as the loader is
            # made), not for every image in the workers.
            max_image_pixels=loader_pixel_budget(decode.max_pixels, *image_size),
            exact=_exact(raw.exact), order=_order(raw.order, shuffle, bool(raw.resampled), raw.exact))

    @property
    def decode(self) -> DecodeOptions:
        """The crop settings and the pixel budget, as the workers' image decoding takes them."""
        return DecodeOptions(self.train, self.scale, self.ratio, self.flip, self.resize_ratio, self.dct_scaling,
                             max_pixels=self.max_image_pixels)
