"""Encoding sample fields to bytes by extension, as webdataset's writer does.

A field's extension is the last dot-component of its name, lowercased
(``"input.jpg"`` -> ``jpg``). Bytes are never re-encoded and str becomes UTF-8
whatever the extension; other values go to the handler for the extension.

A field ending in ``.gz`` (``"data.json.gz"``) is encoded by its inner extension,
then gzip-compressed, bytes and str included (as webdataset 1.0.2 does). Unlike
webdataset, the gzip header has mtime 0 and ``.npz`` members have fixed zip
timestamps, so the same sample always encodes to the same bytes; ``.npy``
refuses object arrays, which readers (loading without pickle) could not read;
metadata fields (``_`` prefix) of any type pass through. Every encoder is a
named function or a ``functools.partial``, so encoders pickle into workers.
"""

import functools
import gzip
import io
import json
import pickle
import zipfile
from typing import Any, Callable, Dict, Iterable, Mapping, Union

import numpy as np

__all__ = [
    "imageencoder",
    "bytestr",
    "torch_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "mp_dumps",
    "cbor_dumps",
    "add_handlers",
    "make_handlers",
    "default_handlers",
    "encode_based_on_extension1",
    "encode_based_on_extension",
    "make_encoder",
]

JPEG_QUALITY = 100  # what webdataset writes (through PIL, which also subsamples chroma 4:2:0)
_BYTES_LIKE = (bytes, bytearray, memoryview)

_Encoder = Callable[[Any], bytes]  # a field value -> its bytes
_Sample = Dict[str, Any]
_SampleEncoder = Callable[[_Sample], _Sample]

# Image encoding.


def _image_array(image: Any) -> np.ndarray:
    """An array fit for an image codec: floats in [0, 1] scaled to uint8, HxWx1 squeezed."""
    array = np.asarray(image)
    if array.dtype.kind == "f":
        if array.size and not (np.amin(array) > -0.001 and np.amax(array) < 1.001):
            raise ValueError(f"float image values must lie in [0, 1], got [{np.amin(array)}, {np.amax(array)}]")
        array = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    elif array.dtype == np.bool_:
        array = array.astype(np.uint8) * 255
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ValueError(f"an image array must be HxW, HxWx1, HxWx3 or HxWx4, got shape {array.shape}")
    return np.ascontiguousarray(array)


# Format name -> (Pillow format, mode to convert to or None). Pillow writes
# PBM/PGM/PPM as "PPM" and chooses between them by image mode.
_PIL_FORMATS = {
    "JPG": ("JPEG", None),
    "JPEG": ("JPEG", None),
    "PNG": ("PNG", None),
    "PBM": ("PPM", "1"),
    "PGM": ("PPM", "L"),
    "PPM": ("PPM", "RGB"),
    "IMG": ("PPM", None),
    "IMAGE": ("PPM", None),
    "TIF": ("TIFF", None),
    "TIFF": ("TIFF", None),
}


def imageencoder(image: Any, format: str = "PNG") -> bytes:  # noqa: A002 (webdataset's parameter name)
    """Compress an image (PIL image or array, uint8 or float in [0, 1]) with Pillow."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        array = _image_array(image)
        try:
            image = Image.fromarray(array)
        except TypeError as exn:
            raise ValueError(f"cannot make an image of a {array.dtype} array of shape {array.shape}") from exn
    pil_format, mode = _PIL_FORMATS.get(format.upper(), (format.upper(), None))
    if mode is not None and image.mode != mode:
        image = image.convert(mode)
    options = {"quality": JPEG_QUALITY} if pil_format == "JPEG" else {}
    with io.BytesIO() as result:
        image.save(result, format=pil_format, **options)
        return result.getvalue()


def _encode_jpeg(image: Any) -> bytes:
    """JPEG: arrays through libjpeg-turbo (simplejpeg), PIL images through Pillow."""
    if not isinstance(image, np.ndarray):
        return imageencoder(image, "JPEG")
    import simplejpeg

    array = _image_array(image)
    if array.dtype != np.uint8 or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"JPEG needs a uint8 (or float) HxW or HxWx3 array, got {array.dtype} {array.shape}")
    if array.ndim == 2:
        return simplejpeg.encode_jpeg(array[:, :, None], JPEG_QUALITY, "GRAY", "Gray")
    return simplejpeg.encode_jpeg(array, JPEG_QUALITY, "RGB", "420")


# Other encoders.


def bytestr(data: Any) -> bytes:
    """Bytes as they are, anything else as its ``str`` in ASCII."""
    if isinstance(data, bytes):
        return data
    return str(data).encode("ascii")


def torch_dumps(data: Any) -> bytes:
    """``torch.save`` into bytes; torch is imported only when a ``.pth`` field is written."""
    import torch

    stream = io.BytesIO()
    torch.save(data, stream)
    return stream.getvalue()


def _encode_int(data: Any) -> bytes:
    return str(data).encode("ascii")


def _encode_text(data: str) -> bytes:
    return data.encode("utf-8")


def _encode_json(data: Any) -> bytes:
    return json.dumps(data).encode("utf-8")


def numpy_dumps(data: Any) -> bytes:
    """An array in ``.npy`` format; object arrays are refused (readers load without pickle)."""
    stream = io.BytesIO()
    np.save(stream, np.asanyarray(data), allow_pickle=False)
    return stream.getvalue()


def numpy_npz_dumps(data: Any) -> bytes:
    """A dict of arrays (or one array, as ``arr_0``) in ``.npz`` format.

    Like ``np.savez_compressed``, but with fixed zip timestamps, so the same
    arrays always give the same bytes.
    """
    arrays = data if isinstance(data, dict) else {"arr_0": data}
    for name in arrays:
        if not isinstance(name, str):
            raise TypeError(f".npz array names must be str, got {type(name).__name__} {name!r}")
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return stream.getvalue()


def tenbin_dumps(x: Any) -> bytes:
    """An array, or a list of arrays, in tenbin format (``.ten``), as bytes."""
    from .. import tenbin

    return bytes(tenbin.encode_buffer(list(x) if isinstance(x, (list, tuple)) else [x]))


def mp_dumps(x: Any) -> bytes:
    """MessagePack bytes; msgpack is imported only when a ``.mp`` field is written."""
    import msgpack

    return msgpack.packb(x, use_bin_type=True)


def cbor_dumps(x: Any) -> bytes:
    """CBOR bytes, with cbor2 (webdataset imports the older ``cbor`` package)."""
    import cbor2

    return cbor2.dumps(x)


def add_handlers(d: Dict[str, _Encoder], keys: Union[str, Iterable[str]], value: _Encoder) -> None:
    """Register ``value`` in table ``d`` under each extension in ``keys`` (a list or a spaced string)."""
    for key in keys.split() if isinstance(keys, str) else keys:
        d[key] = value


def make_handlers() -> Dict[str, _Encoder]:
    """A fresh extension -> encoder table (the one ``encoder=True`` uses)."""
    handlers: Dict[str, _Encoder] = {}
    add_handlers(handlers, "cls cls2 class count index inx id", _encode_int)
    add_handlers(handlers, "txt text transcript html htm", _encode_text)
    add_handlers(handlers, "pyd pickle", pickle.dumps)
    add_handlers(handlers, "pth", torch_dumps)
    add_handlers(handlers, "npy", numpy_dumps)
    add_handlers(handlers, "npz", numpy_npz_dumps)
    add_handlers(handlers, "ten tenbin tb", tenbin_dumps)
    add_handlers(handlers, "json jsn", _encode_json)
    add_handlers(handlers, "mp msgpack msg", mp_dumps)
    add_handlers(handlers, "cbor", cbor_dumps)
    add_handlers(handlers, "jpg jpeg img image", _encode_jpeg)
    for extensions, image_format in [("png", "PNG"), ("pbm", "PBM"), ("pgm", "PGM"), ("ppm", "PPM"),
                                     ("tif tiff", "TIFF")]:
        add_handlers(handlers, extensions, functools.partial(imageencoder, format=image_format))
    return handlers


default_handlers = make_handlers()


def encode_based_on_extension1(data: Any, tname: str, handlers: Mapping[str, _Encoder]) -> Any:
    """Encode one value by the extension of its field name ``tname``.

    Bytes pass through untouched, str becomes UTF-8 (whatever the extension, as
    in webdataset); metadata fields (``_`` prefix) are left alone. A ``.gz``
    field is encoded by its inner extension, then gzip-compressed with mtime 0.
    """
    if not isinstance(tname, str):
        raise ValueError(f"field names must be str, got {tname!r}")
    if tname.startswith("_"):
        return data
    if tname.lower().endswith(".gz"):
        return gzip.compress(encode_based_on_extension1(data, tname[:-3], handlers), mtime=0)
    if isinstance(data, _BYTES_LIKE):
        return data
    extension = tname.rsplit(".", 1)[-1].lower()
    if isinstance(data, str):
        return data.encode("utf-8")
    handler = handlers.get(extension)
    if handler is None:
        raise ValueError(
            f"no encoder for extension {extension!r} and a value of type {type(data).__name__}; "
            "give bytes or str, or pass encoder= a dict with a handler for it"
        )
    return handler(data)


def encode_based_on_extension(sample: _Sample, handlers: Mapping[str, _Encoder]) -> _Sample:
    """Encode every field of a sample; errors name the sample key and the field."""
    key = sample.get("__key__")
    result: _Sample = {}
    for field, value in sample.items():
        where = f"cannot encode sample {key!r}, field {field!r}"
        try:
            result[field] = encode_based_on_extension1(value, field, handlers)
        except ValueError as exn:
            raise ValueError(f"{where}: {exn}") from exn
        except TypeError as exn:
            raise TypeError(f"{where}: {exn}") from exn
    return result


def _no_encoding(sample: _Sample) -> _Sample:
    return sample


def make_encoder(spec: Union[bool, None, Dict[str, _Encoder], _SampleEncoder]) -> _SampleEncoder:
    """A sample encoder from True (default handlers), False/None (none), a handler dict, or a callable."""
    if spec is True:
        return functools.partial(encode_based_on_extension, handlers=default_handlers)
    if spec is False or spec is None:
        return _no_encoding
    if isinstance(spec, dict):
        return functools.partial(encode_based_on_extension, handlers=spec)
    if callable(spec):
        return spec
    raise ValueError(f"encoder must be True, False, a dict of handlers or a callable, not {spec!r}")
