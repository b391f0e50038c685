"""Decoding sample fields by extension: webdataset's ``autodecode``, with its names.

A *handler* is a callable ``handler(key, data)`` that gets a field name with a
dot in front (``".jpg"``, ``".seg.png"``) and its bytes, and returns the
decoded value, None for "not mine", or :class:`Continue` for "I rewrote this
field, let the next handlers have it" (how ``.gz`` fields are unpacked). A
:class:`Decoder` runs each field of a sample through its handlers, in order,
until one takes it; a field none takes stays bytes.

Images come out as webdataset's do, Pillow's pixels and all; JPEGs are decoded
by libjpeg-turbo where that gives the same, faster (``wdsmp/images/specdecode.py``, NOTE
[same pixels]).

Where webdataset differs, on purpose:

- pickles (``.pyd``, ``.pickle``, ``.pkl``) are refused unless the decoder is
  built with ``unsafe=True``, and ``.pth`` is loaded with ``torch.load(...,
  weights_only=True)`` unless it is; see NOTE [unsafe decoders];
- a failing field raises :class:`DecodingError` (a :class:`wdsmp.DecodeError`,
  so a ``ValueError``) whose message names the shard, the sample key and the
  field, the cause chained;
- ``handle_extension(".png", f)`` matches ``input.png`` (the documented
  example), not only a field named exactly ``png``;
- image specs are case-insensitive (``"PIL"``), a missing torchvision or
  torchaudio is a DecodeError naming the package, and ``.msgpack`` is decoded
  as the writer encodes it;
- what one field may cost is bounded: a ``.gz`` field expanding past
  ``max_field_size`` bytes (default ``WDSMP_MAX_MEMBER_SIZE``, else 1 GiB) and
  an image of more pixels than ``max_image_pixels`` (default
  ``WDSMP_MAX_IMAGE_PIXELS``, else 64 Mi; see :mod:`wdsmp.images.size`) are
  refused before they are decompressed or decoded.

NOTE [unsafe decoders]: unpickling runs whatever code the data names, so a
shard from anywhere could take over the process. wdsmp decodes pickles only
for a caller who said the data is trusted (``Decoder(..., unsafe=True)``,
``wds.decode(..., unsafe=True)``); without it such a field raises a
DecodeError saying how to opt in. ``WDS_SECURE=1`` refuses them even then, and
refuses ``.pth`` altogether: ``weights_only`` loading is itself an unpickler,
and it has had holes (CVE-2025-32434).
"""

import importlib
import io
import json
import os
import pickle
import tempfile
import zlib
from collections.abc import Mapping
from typing import Any, Callable, Dict, FrozenSet, Iterable, NoReturn, Optional, Tuple, Union

import numpy as np

from ._internal import env
from .images.specdecode import decode_image
from .errors import DecodeError
from .images.size import image_pixel_budget
from .formats.tar import member_size_limit

__all__ = [
    "IMAGE_EXTENSIONS",
    "BasicHandlers",
    "Continue",
    "DecodedSamples",
    "Decoder",
    "DecodingError",
    "GzipFilter",
    "ImageHandler",
    "basichandlers",
    "call_extension_handler",
    "cbor_loads",
    "decoders",
    "default_decoder",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "pytorch_weights_only",
    "tenbin_loads",
    "torch_audio",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
]

# The extensions Pillow can open (as webdataset lists them; ``mpg``/``mpeg`` too,
# so an image spec claims those before torch_video does, as in webdataset).
IMAGE_EXTENSIONS = sorted("""
    jpg jpeg jpe jfif png apng gif bmp dib webp tif tiff ppm pgm pbm pnm
    blp bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr grib h5 hdf
    jp2 j2k jpc jpf jpx j2c icns ico im iim mpg mpeg msp pcd pxr psd
    bw rgb rgba sgi ras tga icb vda vst wmf emf xbm xpm
""".split())

# A handler: ``handler(".ext", data)`` -> the decoded value, None ("not mine") or a Continue.
_Handler = Callable[[str, Any], Any]

# Kept for code that reads webdataset's flag: wdsmp always loads ``.pth``
# weights-only unless the Decoder is unsafe (NOTE [unsafe decoders]).
pytorch_weights_only = True

_SECURE_REFUSAL = ("WDS_SECURE=1 forbids unpickling (.pyd, .pickle, .pkl fields) and torch.load "
                   "(.pth fields); unset it to decode trusted data")


def _refuse_if_secure() -> None:
    if env.secure():
        raise DecodeError(_SECURE_REFUSAL)


# Basic types.


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


def torch_loads(data: bytes, weights_only: bool = True) -> Any:
    """``torch.load`` of bytes onto the CPU; weights-only unless asked otherwise.

    Refused when ``WDS_SECURE=1`` (NOTE [unsafe decoders]).
    """
    _refuse_if_secure()
    import torch

    return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")


def _torch_loads_unpickling(data: bytes) -> Any:
    return torch_loads(data, weights_only=False)


def unpickle_loads(data: bytes) -> Any:
    """``pickle.loads``: only for trusted data; refused when ``WDS_SECURE=1``."""
    _refuse_if_secure()
    return pickle.loads(data)


def _refuse_unpickling(data: bytes) -> NoReturn:
    """The safe table's entry for pickles: NOTE [unsafe decoders]."""
    _refuse_if_secure()
    raise DecodeError("refusing to unpickle a .pyd/.pickle/.pkl field: unpickling runs arbitrary "
                      "code; if the data is trusted, pass unsafe=True to Decoder() or decode()")


def tenbin_loads(data: bytes) -> Any:
    """A list of arrays from tenbin bytes."""
    from . import tenbin

    return tenbin.decode_buffer(data)


def msgpack_loads(data: bytes) -> Any:
    """A value from msgpack bytes."""
    import msgpack

    return msgpack.unpackb(data)


def npy_loads(data: bytes) -> np.ndarray:
    """An array from ``.npy`` bytes; object arrays (pickles) are refused."""
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def npz_loads(data: bytes) -> Dict[str, np.ndarray]:
    """A dict of arrays from ``.npz`` bytes; object arrays (pickles) are refused."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return dict(archive)


def cbor_loads(data: bytes) -> Any:
    """A value from CBOR bytes (with cbor2)."""
    import cbor2

    return cbor2.loads(data)


# Extension (the last dot-component, case as written) -> decoder of the bytes.
# Callers may add entries; basichandlers reads the table at each call.
decoders: Dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(["txt", "text", "transcript"], _utf8),
    **dict.fromkeys(["cls", "cls2", "index", "inx", "id"], int),
    **dict.fromkeys(["json", "jsn"], json.loads),
    **dict.fromkeys(["pyd", "pickle", "pkl"], _refuse_unpickling),
    "pth": torch_loads,
    **dict.fromkeys(["ten", "tb"], tenbin_loads),
    **dict.fromkeys(["mp", "msg", "msgpack"], msgpack_loads),
    "npy": npy_loads,
    "npz": npz_loads,
    "cbor": cbor_loads,
}

# What an unsafe decoder uses in place of the entries above.
_UNSAFE_DECODERS: Dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(["pyd", "pickle", "pkl"], unpickle_loads),
    "pth": _torch_loads_unpickling,
}


class BasicHandlers:
    """Decodes the basic types of :data:`decoders` by the field's last extension.

    A class rather than webdataset's function so that an unsafe Decoder can
    carry its opt-in to pickles (NOTE [unsafe decoders]) and still pickle.
    """

    def __init__(self, unsafe: bool = False) -> None:
        self.unsafe = bool(unsafe)

    def __call__(self, key: str, data: bytes) -> Any:
        extension = key.rpartition(".")[2]
        if self.unsafe:
            f = _UNSAFE_DECODERS.get(extension)
            if f is not None:
                return f(data)
        f = decoders.get(extension)
        return None if f is None else f(data)

    def __repr__(self) -> str:
        return f"BasicHandlers(unsafe={self.unsafe})"


basichandlers = BasicHandlers()
_unsafe_basichandlers = BasicHandlers(unsafe=True)


# Matching by extension.


def _ends_with_extension(lkey: str, exact: FrozenSet[str], suffixes: Tuple[str, ...]) -> bool:
    """Whether a lowercased field name is one of ``exact`` or ends with one of ``suffixes``.

    The same as comparing the last dot-components of the name with those of
    each target, without splitting the name for each target.
    """
    return lkey in exact or lkey.endswith(suffixes)


def _targets(extensions: Union[str, Iterable[str]]) -> Tuple[FrozenSet[str], Tuple[str, ...]]:
    """Lowercased targets without leading dots, as (exact set, "."-prefixed suffixes)."""
    if isinstance(extensions, str):
        extensions = extensions.split()
    targets = [t.lower().lstrip(".") for t in extensions]
    return frozenset(targets), tuple("." + t for t in targets)


def call_extension_handler(key: str, data: Any, f: Callable[[Any], Any], extensions: Union[str, Iterable[str]]) -> Any:
    """``f(data)`` if the field name ``key`` ends with one of ``extensions``, else None."""
    exact, suffixes = _targets(extensions)
    return f(data) if _ends_with_extension(key.lower(), exact, suffixes) else None


class _ExtensionHandler:
    """The handler :func:`handle_extension` returns: targets parsed once, picklable."""

    def __init__(self, extensions: Union[str, Iterable[str]], f: Callable[[Any], Any]) -> None:
        self.exact, self.suffixes = _targets(extensions)
        self.f = f

    def __call__(self, key: str, data: Any) -> Any:
        return self.f(data) if _ends_with_extension(key.lower(), self.exact, self.suffixes) else None

    def __repr__(self) -> str:
        return f"handle_extension({' '.join(sorted(self.exact))!r}, {self.f!r})"


def handle_extension(extensions: Union[str, Iterable[str]], f: Callable[[Any], Any]) -> _Handler:
    """A handler calling ``f(data)`` for fields ending with one of ``extensions``.

    ``extensions`` is a space-separated string (or a list); a multi-part
    target such as ``"seg.png"`` needs all its parts at the end of the name
    (``x.seg.png``, not ``x.png``). Case is ignored, as is a leading dot.
    """
    return _ExtensionHandler(extensions, f)


# Images.

imagespecs = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

class ImageHandler:
    """Decodes image fields as an image spec says (see :data:`imagespecs`).

    ``l8``/``rgb8``/``rgba8``: numpy uint8, HxW for ``l``, HxWxC otherwise;
    ``l``/``rgb``/``rgba``: the same as float32 in [0, 1]; ``torch*``: torch
    tensors, CxHxW (HxW for ``l``), uint8 for the ``8`` specs, float32 for the
    rest (``torch`` is ``torchrgb``); ``pil``/``pilrgb``/``pill``/``pilrgba``:
    PIL images in mode RGB, L, RGBA. An image of more than ``max_pixels`` pixels
    (default: ``imagesize.image_pixel_budget()``) is refused before it is decoded.
    """

    def __init__(self, imagespec: str, extensions: Union[str, Iterable[str]] = IMAGE_EXTENSIONS,
                 max_pixels: Optional[int] = None) -> None:
        spec = imagespec.lower() if isinstance(imagespec, str) else imagespec
        if spec not in imagespecs:
            raise ValueError(f"unknown image spec {imagespec!r}; known: {', '.join(imagespecs)}")
        self.imagespec = spec
        if isinstance(extensions, str):
            extensions = extensions.split()
        self.extensions = frozenset(e.lower() for e in extensions)
        self._spec: Tuple[str, Any, str] = imagespecs[spec]  # (array type, element type or None, mode)
        self.max_pixels = max_pixels
        image_pixel_budget(max_pixels)  # a bad value fails here, not at the first image

    def __call__(self, key: str, data: bytes) -> Any:
        if key.rpartition(".")[2].lower() not in self.extensions:
            return None
        return decode_image(data, *self._spec, image_pixel_budget(self.max_pixels))

    def __repr__(self) -> str:
        return f"ImageHandler({self.imagespec!r})"


def imagehandler(imagespec: str, extensions: Union[str, Iterable[str]] = IMAGE_EXTENSIONS,
                 max_pixels: Optional[int] = None) -> ImageHandler:
    """An :class:`ImageHandler` (webdataset's lowercase spelling)."""
    return ImageHandler(imagespec, extensions, max_pixels)


# Video and audio, through a temporary file as their readers want a path.

_VIDEO_EXTENSIONS = frozenset("mp4 ogv mjpeg avi mov h264 mpg webm wmv".split())
_AUDIO_EXTENSIONS = frozenset("flac mp3 sox wav m4a ogg wma".split())


def _read_with(key: str, data: bytes, extensions: FrozenSet[str], module: str, reader: str, **kw: Any) -> Any:
    """``module.reader(path, **kw)`` of a field with one of ``extensions``, written to a
    temporary file (the readers want a path); None for other fields."""
    extension = key.rpartition(".")[2]
    if extension not in extensions:
        return None
    package = module.partition(".")[0]
    try:
        read = getattr(importlib.import_module(module), reader)
    except ImportError as exn:
        raise DecodeError(f"decoding a .{extension} field needs {package}, which is not installed "
                          f"(pip install {package})") from exn
    with tempfile.TemporaryDirectory() as dirname:
        path = os.path.join(dirname, "file." + extension)
        with open(path, "wb") as stream:
            stream.write(data)
        return read(path, **kw)


def torch_video(key: str, data: bytes) -> Any:
    """Video fields (mp4, avi, webm, ...) through ``torchvision.io.read_video``."""
    return _read_with(key, data, _VIDEO_EXTENSIONS, "torchvision.io", "read_video", pts_unit="sec")


def torch_audio(key: str, data: bytes) -> Any:
    """Audio fields (flac, mp3, wav, ...) through ``torchaudio.load``."""
    return _read_with(key, data, _AUDIO_EXTENSIONS, "torchaudio", "load")


# Continuing and decompressing.


_GUNZIP_STEP = 16 << 20


class Continue:
    """What a handler returns to hand on a rewritten field (new name, new bytes).

    The handlers after it see ``key`` and ``data`` in place of the original,
    as :func:`gzfilter` does with ``x.txt.gz`` -> ``x.txt``.
    """

    def __init__(self, key: str, data: Any) -> None:
        self.key, self.data = key, data


def gunzip(data: bytes, limit: int) -> bytes:
    """The bytes of gzip ``data`` (members concatenated, zero padding between them allowed),
    decompressed 16 MiB at a time and refused with a DecodeError once they pass ``limit``
    bytes, so that a bomb costs at most ``limit``."""
    parts, size = [], 0
    while data:
        unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = data
        while not unpacker.eof:
            part = unpacker.decompress(pending, min(limit + 1 - size, _GUNZIP_STEP))
            pending = unpacker.unconsumed_tail
            if not part and not pending:
                raise EOFError("compressed data ended before the end-of-stream marker was reached")
            size += len(part)
            if size > limit:
                raise DecodeError(f"the .gz field expands to more than {limit} bytes (max_field_size, or "
                                  f"WDSMP_MAX_MEMBER_SIZE): refusing to decompress it")
            parts.append(part)
        data = unpacker.unused_data.lstrip(b"\0")
    return b"".join(parts)


class GzipFilter:
    """Unpacks ``.gz`` fields and hands them on under the name without ``.gz``; a field that
    would expand past ``max_size`` bytes (default: ``WDSMP_MAX_MEMBER_SIZE``, else 1 GiB) is
    refused (see :func:`gunzip`)."""

    def __init__(self, max_size: Optional[int] = None) -> None:
        self.max_size = max_size
        member_size_limit(max_size, "max_field_size")  # a bad value fails here

    def __call__(self, key: str, data: bytes) -> Optional[Continue]:
        if key[-3:].lower() != ".gz":
            return None
        return Continue(key[:-3], gunzip(data, member_size_limit(self.max_size, "max_field_size")))

    def __repr__(self) -> str:
        return f"GzipFilter(max_size={self.max_size!r})"


gzfilter = GzipFilter()


default_pre_handlers = [gzfilter]
default_post_handlers = [basichandlers]


# Whole samples.


class DecodingError(DecodeError):
    """A field of a sample failed to decode.

    A :class:`wdsmp.DecodeError` (so a ``ValueError``) with webdataset's
    attributes: ``url`` (the shard), ``key`` (the sample key), ``k`` (the
    field) and ``sample``; the message names all three places. ``sample`` is
    dropped when the error is pickled (it may be large, or not picklable).
    """

    def __init__(self, url: Optional[str] = None, key: Optional[str] = None, k: Optional[str] = None,
                 sample: Optional[Mapping[str, Any]] = None, problem: str = "cannot decode") -> None:
        self.key, self.k, self.sample = key, k, sample
        member = k if key is None else key if k is None else f"{key}.{k}"
        super().__init__(problem, url=url, member=member)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.url, self.key, self.k, None, self.problem))


def _handler(h: Any, unsafe: bool, max_field_size: Optional[int], max_image_pixels: Optional[int]) -> _Handler:
    """A handler from a Decoder argument: an image spec string or a callable; the defaults
    exchanged for ones that carry the Decoder's opt-in to pickles and its limits."""
    if isinstance(h, str):
        return imagehandler(h, max_pixels=max_image_pixels)
    if not callable(h):
        raise TypeError(f"a decoder handler must be callable or an image spec string, not {h!r}")
    if unsafe and h is basichandlers:
        return _unsafe_basichandlers
    if max_field_size is not None and h is gzfilter:
        return GzipFilter(max_field_size)
    return h


class Decoder:
    """Decodes each field of a sample with the first handler that takes it.

    ``Decoder([h1, h2])``, ``Decoder(h1, h2)`` and ``Decoder(handlers=[h1, h2])``
    are the same; a string is an image spec (``"rgb"`` is
    ``imagehandler("rgb")``). The handlers run after ``pre`` (default:
    :func:`gzfilter`) and before ``post`` (default:
    :data:`basichandlers`). ``only`` (names, or a space-separated string)
    limits decoding to those fields. A field that is not bytes is an error
    unless ``partial=True``, which leaves it as it is; a field no handler
    takes stays bytes either way. ``unsafe=True`` allows pickles (NOTE
    [unsafe decoders]). ``max_field_size`` caps what a ``.gz`` field may expand
    to, ``max_image_pixels`` the pixels of an image given as a spec string
    (defaults: module docstring). As in webdataset, the positional form
    ``Decoder(handlers, pre, post, only, partial)`` works with a list first.

    Keys starting with ``__`` are metadata: passed on, bytes made str when
    they are UTF-8, as webdataset does.

    ``decoder(sample)`` decodes one sample (a new dict); ``decoder(dataset)``
    (webdataset's older form) returns a DataPipeline of decoded samples.
    """

    def __init__(self, *handlers: Any, pre: Optional[Iterable[_Handler]] = None,
                 post: Optional[Iterable[_Handler]] = None, only: Optional[Union[str, Iterable[str]]] = None,
                 partial: bool = False, unsafe: bool = False, max_field_size: Optional[int] = None,
                 max_image_pixels: Optional[int] = None, **kw: Any) -> None:
        if "handlers" in kw:  # Decoder(handlers=[...]), webdataset's keyword
            if handlers:
                raise TypeError("give Decoder handlers as arguments or as handlers=, not both")
            handlers = (list(kw.pop("handlers")),)
        if kw:
            raise TypeError(f"Decoder() got unexpected keyword arguments {sorted(kw)}")
        if handlers and isinstance(handlers[0], (list, tuple)):
            positional = handlers[1:]
            if len(positional) > 4:
                raise TypeError(f"Decoder(handlers, pre, post, only, partial) takes at most 5 "
                                f"positional arguments, got {len(handlers)}")
            handlers = tuple(handlers[0])
            given = dict(zip(("pre", "post", "only", "partial"), positional))
            pre, post = given.get("pre", pre), given.get("post", post)
            only, partial = given.get("only", only), given.get("partial", partial)
        pre = default_pre_handlers if pre is None else pre
        post = default_post_handlers if post is None else post
        self.handlers = tuple(_handler(h, unsafe, max_field_size, max_image_pixels)
                              for h in [*pre, *handlers, *post])
        if isinstance(only, str):
            only = only.split()
        self.only = None if only is None else frozenset(only)
        self.partial = bool(partial)
        self.unsafe = bool(unsafe)

    def decode1(self, key: str, data: Any) -> Any:
        """One field through the handlers; the bytes themselves if none takes it."""
        key = "." + key
        for f in self.handlers:
            result = f(key, data)
            if result is None:
                continue
            if isinstance(result, Continue):
                key, data = result.key, result.data
                continue
            return result
        return data

    def decode(self, sample: Mapping[str, Any]) -> Dict[str, Any]:
        """A new dict with the sample's fields decoded; errors name shard, key and field."""
        result = {}
        only, partial = self.only, self.partial
        for k, v in sample.items():
            if k.startswith("__"):
                if isinstance(v, bytes):
                    try:
                        v = v.decode("utf-8")
                    except UnicodeDecodeError:
                        pass  # not text: passed on as bytes
                result[k] = v
            elif (only is not None and k not in only) or (partial and not isinstance(v, bytes)):
                result[k] = v
            elif not isinstance(v, bytes):
                raise DecodingError(sample.get("__url__"), sample.get("__key__"), k, sample,
                                    f"the field holds {type(v).__name__}, not bytes (decoded twice? "
                                    f"partial=True leaves such fields alone)")
            else:
                try:
                    result[k] = self.decode1(k, v)
                except Exception as exn:
                    if isinstance(exn, DecodeError):
                        detail = exn.problem
                    else:
                        detail = f"{type(exn).__name__}: {exn}"
                    raise DecodingError(sample.get("__url__"), sample.get("__key__"), k, sample,
                                        f"cannot decode: {detail}") from exn
        return result

    def __call__(self, sample: Any) -> Any:
        """Decode a sample (a dict), or wrap a dataset (an iterable of samples)."""
        if isinstance(sample, Mapping):
            return self.decode(sample)
        if isinstance(sample, (str, bytes)) or not (hasattr(sample, "__iter__") or callable(sample)):
            raise TypeError(f"a Decoder takes a sample (a dict) or a dataset of samples, "
                            f"not {type(sample).__name__}")
        from .images.decoded import DecodedSamples

        return DecodedSamples(sample, self)

    def __repr__(self) -> str:
        return (f"Decoder({list(self.handlers)!r}, only={self.only!r}, partial={self.partial}, "
                f"unsafe={self.unsafe})")


default_decoder = Decoder([])


def __getattr__(name: str) -> Any:
    """``DecodedSamples`` (a torch dataset) is imported on first use, so that decoding samples,
    as FastLoader's workers do in their stages, does not import torch."""
    if name == "DecodedSamples":
        from .images.decoded import DecodedSamples

        return DecodedSamples
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
