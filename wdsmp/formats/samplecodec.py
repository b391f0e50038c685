"""Samples as bytes without pickle, for the sample caches (``DBCache``, ``LMDBCached``).

A cache file can come from elsewhere (a shared directory, a copied run), and unpickling it
runs whatever code it names. :class:`SampleCodec` stores what samples are made of in a
format whose reading runs nothing: None, bool, int, float, str, bytes, lists, tuples and
dicts of them, numpy arrays and scalars (not of object dtype), torch tensors (on the CPU
when read) and PIL images without a palette, with their ``info`` (dpi, exif, icc_profile:
what a pickled image keeps) where it is made of those values. Anything else is pickled as before, and
pickles are read as before (old cache files stay readable), except in secure mode
(``WDS_SECURE=1``), which refuses both: such a sample, or such a cache file, is a
``ValueError`` saying so.

Layout: ``MAGIC`` then one value; a value is a tag byte and its content, lengths and
counts little-endian; a pickle starts with ``\\x80``, never with ``MAGIC``.
"""

import pickle
import struct
from types import ModuleType
from typing import Any, List, Optional, Union

import numpy as np

from .._internal import env

__all__ = ["MAGIC", "SampleCodec", "decode_plain", "encode_plain"]

MAGIC = b"WDSP1"
_MAX_DEPTH = 64
_LENGTH = struct.Struct("<Q")
_INT = struct.Struct("<q")
_FLOAT = struct.Struct("<d")

_Buffer = Union[bytes, bytearray, memoryview]


class NotPlain(TypeError):
    """A value the plain format does not hold."""


def encode_plain(value: Any) -> bytes:
    """``value`` in the plain format (``MAGIC`` first); NotPlain when it holds anything else."""
    out = [MAGIC]
    _encode(value, out, 0)
    return b"".join(out)


def _text(out: List[bytes], text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    out += [_LENGTH.pack(len(data)), data]


def _encode(value: Any, out: List[bytes], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise NotPlain("nested too deeply")
    kind = type(value)
    if value is None or kind is bool:
        out.append({None: b"N", True: b"T", False: b"F"}[value])
    elif kind is int:
        if -(1 << 63) <= value < 1 << 63:
            out += [b"i", _INT.pack(value)]
        else:
            out.append(b"I")
            _text(out, str(value))
    elif kind is float:
        out += [b"f", _FLOAT.pack(value)]
    elif kind is str:
        out.append(b"s")
        _text(out, value)
    elif kind is bytes:
        out += [b"b", _LENGTH.pack(len(value)), value]
    elif kind in (list, tuple):
        out += [b"l" if kind is list else b"t", _LENGTH.pack(len(value))]
        for item in value:
            _encode(item, out, depth + 1)
    elif kind is dict:
        out += [b"d", _LENGTH.pack(len(value))]
        for key, item in value.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    elif isinstance(value, (np.ndarray, np.generic)):
        out.append(b"a" if isinstance(value, np.ndarray) else b"g")
        _array(out, np.asarray(value))
    elif _is_tensor(value):
        import torch

        tensor = value.detach().cpu().contiguous()
        out.append(b"p")
        _text(out, str(tensor.dtype).removeprefix("torch."))
        as_numpy = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
        _array(out, as_numpy.numpy())
    elif _is_image(value) and value.palette is None:
        out.append(b"M" if value.info else b"m")  # "m": no info (and records written before it was kept)
        _text(out, value.mode)
        out += [_LENGTH.pack(value.width), _LENGTH.pack(value.height)]
        data = value.tobytes()
        out += [_LENGTH.pack(len(data)), data]
        if value.info:
            _encode(dict(value.info), out, depth + 1)
    else:
        raise NotPlain(f"a {kind.__module__}.{kind.__qualname__}")


def _array(out: List[bytes], array: np.ndarray) -> None:
    if array.dtype.hasobject:
        raise NotPlain("an array of Python objects")
    _text(out, array.dtype.str)
    out.append(_LENGTH.pack(array.ndim))
    out += [_LENGTH.pack(n) for n in array.shape]
    data = np.ascontiguousarray(array).tobytes()
    out += [_LENGTH.pack(len(data)), data]


def _is_tensor(value: object) -> bool:
    torch = _loaded("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_image(value: object) -> bool:
    image = _loaded("PIL.Image")
    return image is not None and isinstance(value, image.Image)


def _loaded(name: str) -> Optional[ModuleType]:
    """A module, if the program imported it (a value of its types cannot exist otherwise)."""
    import sys

    return sys.modules.get(name)


class _Reader:
    """Reads a plain value from bytes; every length is checked against what is there."""

    def __init__(self, data: _Buffer) -> None:
        self.data, self.pos = memoryview(data), len(MAGIC)

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("a plain sample record that ends too soon")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def length(self) -> int:
        return _LENGTH.unpack(self.take(8))[0]

    def text(self) -> str:
        return bytes(self.take(self.length())).decode("utf-8", "surrogatepass")

    def array(self) -> np.ndarray:
        dtype = np.dtype(self.text())
        if dtype.hasobject:
            raise ValueError("a plain sample record with an object array")
        shape = tuple(self.length() for _ in range(self.length()))
        data = bytes(self.take(self.length()))
        return np.frombuffer(data, dtype).reshape(shape).copy()

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("a plain sample record nested too deeply")
        tag = bytes(self.take(1))
        if tag in (b"N", b"T", b"F"):
            return {b"N": None, b"T": True, b"F": False}[tag]
        if tag == b"i":
            return _INT.unpack(self.take(8))[0]
        if tag == b"I":
            return int(self.text())
        if tag == b"f":
            return _FLOAT.unpack(self.take(8))[0]
        if tag == b"s":
            return self.text()
        if tag == b"b":
            return bytes(self.take(self.length()))
        if tag in (b"l", b"t"):
            items = [self.value(depth + 1) for _ in range(self.length())]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            return {self.value(depth + 1): self.value(depth + 1) for _ in range(self.length())}
        if tag == b"a":
            return self.array()
        if tag == b"g":
            return self.array()[()]
        if tag == b"p":
            import torch

            dtype = getattr(torch, self.text())
            if not isinstance(dtype, torch.dtype):
                raise ValueError("a plain sample record with an unknown tensor type")
            tensor = torch.from_numpy(self.array())
            return tensor.view(dtype) if dtype == torch.bfloat16 else tensor.to(dtype)
        if tag in (b"m", b"M"):
            import PIL.Image

            mode, size = self.text(), (self.length(), self.length())
            data = bytes(self.take(self.length()))
            if size[0] * size[1] > 8 * len(data):  # more pixels than any mode packs in the bytes
                raise ValueError("a plain sample record with an image larger than its data")
            image = PIL.Image.frombytes(mode, size, data)
            if tag == b"M":
                info = self.value(depth + 1)
                if not isinstance(info, dict):
                    raise ValueError("a plain sample record with an image whose info is not a dict")
                image.info = info
            return image
        raise ValueError(f"a plain sample record with an unknown tag {tag!r}")


def decode_plain(data: _Buffer) -> Any:
    """The value ``encode_plain`` wrote; ValueError for anything else."""
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a plain sample record")
    reader = _Reader(data)
    value = reader.value()
    if reader.pos != len(reader.data):
        raise ValueError("a plain sample record with bytes after its value")
    return value


class SampleCodec:
    """``dumps``/``loads`` as pickle has them: the plain format where a sample fits it, pickle
    otherwise, and no pickle at all in secure mode (see the module docstring). ``where``
    names the cache in errors."""

    def __init__(self, where: str = "the cache") -> None:
        self.where = where

    def dumps(self, sample: Any) -> bytes:
        try:
            return encode_plain(sample)
        except NotPlain as exn:
            if env.secure():
                raise ValueError(f"{self.where}: WDS_SECURE=1 stores only plain samples (None, numbers, str, "
                                 f"bytes, lists, tuples, dicts, numpy arrays, tensors, images), and this one "
                                 f"holds {exn}, which would need pickle") from exn
            return pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: _Buffer) -> Any:
        if bytes(data[:len(MAGIC)]) == MAGIC:
            return decode_plain(data)
        if env.secure():
            raise ValueError(f"{self.where} holds pickled samples (written by an older wdsmp, or samples of "
                             f"other types); WDS_SECURE=1 refuses to unpickle them: delete it to rebuild it")
        return pickle.loads(data)
