"""Tenbin: webdataset's binary format for lists of arrays (the ``.ten`` extension).

Byte-compatible with webdataset's ``tenbin``, so ``.ten`` members move freely
between the two libraries. A buffer is a sequence of chunks::

    b"~TenBin~"   8 bytes of magic
    length        int64, the number of payload bytes
    payload       padded with NULs to a multiple of 64 bytes

Each array is two chunks: a header, then its raw C-order data. The header is
int64s: the dtype code (``"f4"``, ``"u1"``, ... as 8 NUL-padded ASCII bytes),
an info string (at most 8 ASCII bytes, same encoding), the rank, the shape.

Integers and data are little-endian, which is what webdataset writes on every
machine it runs on (it uses native order). The framing keeps every payload
16-byte aligned relative to the buffer, so decoded arrays are zero-copy views of
it (read-only when the buffer is ``bytes``). Unlike webdataset, ``uint32`` works.
"""

import os
import struct
import sys
from typing import IO, TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, SupportsInt, Tuple, Union

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "bytedata",
    "bytelen",
    "check_acceptable_input_type",
    "check_infos",
    "decode_buffer",
    "decode_chunks",
    "decode_header",
    "decode_list",
    "encode_buffer",
    "encode_chunks",
    "encode_header",
    "encode_list",
    "load",
    "long_to_short",
    "magic",
    "magic_bytes",
    "magic_str",
    "read",
    "read_chunk",
    "roundup",
    "save",
    "short_to_long",
    "str64",
    "unstr64",
    "write",
    "write_chunk",
]

# dtype name -> code written in the header; the set webdataset supports (its
# table misspells uint32, so webdataset cannot store it; this one can).
long_to_short = {
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
}
short_to_long = {code: name for name, code in long_to_short.items()}
_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in long_to_short.items()}
_I64 = np.dtype("<i8")
_WIDE = frozenset({"float64", "int64", "uint64"})

_Buffer = Union[bytes, bytearray, memoryview]
_Infos = Union[None, bool, Sequence[str]]  # the infos= convention: see check_infos
_Decoded = Union[List[np.ndarray], Tuple[List[np.ndarray], List[str]]]
_Path = Union[str, "os.PathLike[str]"]


def bytelen(a: Any) -> int:
    """The size in bytes of an array or a bytes-like object."""
    if hasattr(a, "nbytes"):
        return a.nbytes
    if isinstance(a, (bytes, bytearray)):
        return len(a)
    raise ValueError(f"cannot tell the size in bytes of a {type(a).__name__}")


def bytedata(a: Any) -> _Buffer:
    """The raw data of an array (its buffer) or of a bytes-like object (itself)."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return a
    if hasattr(a, "data"):
        return a.data
    raise ValueError(f"cannot get the raw data of a {type(a).__name__}")


def check_acceptable_input_type(data: Iterable[np.ndarray], allow64: bool) -> None:
    """Refuse arrays tenbin cannot store, and 64-bit ones unless ``allow64``.

    webdataset's version has the 64-bit test inverted (it refuses every
    narrower type); this one refuses what the docstring there says it should.
    """
    for a in data:
        name = a.dtype.name
        if name not in long_to_short:
            raise ValueError(f"tenbin cannot store dtype {name} (supported: {', '.join(long_to_short)})")
        if not allow64 and name in _WIDE:
            raise ValueError(f"64-bit dtype {name} is not allowed unless allow64=True")


def roundup(n: int, k: int = 64) -> int:
    """``n`` rounded up to a multiple of ``k``: chunks are padded to 64 bytes."""
    return -(-n // k) * k


def str64(s: Union[str, bytes], what: str = "string") -> int:
    """An ASCII string of at most 8 bytes as the int64 it occupies in a header."""
    raw = s.encode("ascii") if isinstance(s, str) else bytes(s)
    if len(raw) > 8:
        raise ValueError(f"tenbin {what} {s!r} is longer than 8 bytes")
    return struct.unpack("<q", raw.ljust(8, b"\0"))[0]


def unstr64(i: SupportsInt) -> str:
    """The string a header int64 holds (inverse of ``str64``)."""
    return struct.pack("<q", int(i)).rstrip(b"\0").decode("ascii")


magic_str = "~TenBin~"
magic_bytes = magic_str.encode("ascii")
magic = str64(magic_str)  # the magic as the int64 it reads as


def encode_header(a: np.ndarray, info: Union[str, bytes] = "") -> bytes:
    """The header chunk of array ``a``: dtype code, info, rank, shape."""
    check_acceptable_input_type([a], allow64=True)
    values = [str64(long_to_short[a.dtype.name], "dtype"), str64(info, "info"), a.ndim, *a.shape]
    return np.array(values, dtype=_I64).tobytes()


def decode_header(h: _Buffer) -> Tuple[Tuple[int, ...], np.dtype, str]:
    """Parse a header chunk into ``(shape, dtype, info)``."""
    if len(h) < 24 or len(h) % 8:
        raise ValueError(f"tenbin header of {len(h)} bytes is malformed")
    values = np.frombuffer(h, dtype=_I64)
    try:
        code = unstr64(values[0])
        info = unstr64(values[1])
    except UnicodeDecodeError as exn:
        raise ValueError("tenbin header holds non-ASCII dtype or info") from exn
    if code not in _DTYPES:
        raise ValueError(f"tenbin header has unknown dtype code {code!r}")
    rank = int(values[2])
    if rank < 0 or len(values) < 3 + rank or (values[3:3 + rank] < 0).any():
        raise ValueError(f"tenbin header has a bad rank or shape ({values.tolist()})")
    return tuple(int(d) for d in values[3:3 + rank]), _DTYPES[code], info


def encode_list(l: Sequence["npt.ArrayLike"], infos: Optional[Sequence[Union[str, bytes]]] = None) -> List[bytes]:  # noqa: E741 (webdataset's parameter name)
    """Arrays -> chunks, alternating header and data; ``infos`` names each array."""
    if infos is None:
        infos = [""] * len(l)
    elif len(infos) != len(l):
        raise ValueError(f"tenbin got {len(l)} arrays but {len(infos)} infos")
    chunks = []
    for a, info in zip(l, infos):
        a = np.asarray(a)
        header = encode_header(a, info)
        data = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        chunks += [header, data.tobytes()]
    return chunks


def check_infos(data: List[np.ndarray], infos: List[str], required_infos: _Infos = None) -> _Decoded:
    """Apply webdataset's ``infos=`` convention to decoded arrays.

    False or None -> the arrays; True -> ``(arrays, infos)``; a list or tuple ->
    the arrays, after checking that the infos start with it (webdataset's
    version raises for any list, matching or not).
    """
    if required_infos is None or required_infos is False:
        return data
    if required_infos is True:
        return data, infos
    if not isinstance(required_infos, (list, tuple)):
        raise ValueError("infos must be a bool, a list or a tuple")
    if list(required_infos) != list(infos[:len(required_infos)]):
        raise ValueError(f"tenbin infos {infos} do not match the required {list(required_infos)}")
    return data


def decode_list(l: Sequence[_Buffer], infos: _Infos = False) -> _Decoded:  # noqa: E741 (webdataset's parameter name)
    """Chunks (header, data, header, data, ...) -> arrays."""
    if len(l) % 2:
        raise ValueError("tenbin data ends after a header without its data chunk")
    arrays: List[np.ndarray] = []
    names: List[str] = []
    for header, data in zip(l[0::2], l[1::2]):
        shape, dtype, info = decode_header(header)
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(data) != expected:
            raise ValueError(f"tenbin array {shape} {dtype.name} needs {expected} bytes, chunk has {len(data)}")
        arrays.append(np.frombuffer(data, dtype=dtype).reshape(shape))
        names.append(info)
    return check_infos(arrays, names, infos)


def encode_chunks(l: Iterable[_Buffer]) -> bytearray:  # noqa: E741 (webdataset's parameter name)
    """Frame chunks with magic, length and padding into one bytearray."""
    result = bytearray()
    for chunk in l:
        n = len(memoryview(chunk).cast("B"))
        result += magic_bytes
        result += struct.pack("<q", n)
        result += chunk
        result += bytes(roundup(n) - n)
    return result


def decode_chunks(buf: _Buffer) -> List[memoryview]:
    """Split a framed buffer into chunks (memoryviews, no copies)."""
    view = memoryview(buf).cast("B")
    chunks: List[memoryview] = []
    offset = 0
    while offset < len(view):
        if view[offset:offset + 8] != magic_bytes or offset + 16 > len(view):
            raise ValueError(f"tenbin magic missing at byte {offset}")
        (n,) = struct.unpack("<q", view[offset + 8:offset + 16])
        start = offset + 16
        if n < 0 or start + n > len(view):
            raise ValueError(f"tenbin chunk at byte {offset} claims {n} bytes, buffer is truncated")
        chunks.append(view[start:start + n])
        offset = start + roundup(n)
    return chunks


def encode_buffer(l: Sequence["npt.ArrayLike"], infos: Optional[Sequence[Union[str, bytes]]] = None) -> bytearray:  # noqa: E741 (webdataset's parameter name)
    """A list of arrays as one tenbin buffer (a bytearray)."""
    if not isinstance(l, (list, tuple)):
        raise ValueError(f"tenbin encode_buffer needs a list of arrays, got {type(l).__name__}")
    return encode_chunks(encode_list(l, infos=infos))


def decode_buffer(buf: _Buffer, infos: _Infos = False) -> _Decoded:
    """A tenbin buffer back into a list of arrays (views of ``buf``)."""
    return decode_list(decode_chunks(buf), infos=infos)


def write_chunk(stream: IO[bytes], buf: _Buffer) -> None:
    """Write one framed chunk to a binary stream."""
    stream.write(encode_chunks([buf]))


def read_chunk(stream: IO[bytes]) -> Optional[bytes]:
    """Read one framed chunk from a binary stream; None at a clean end of stream."""
    head = stream.read(16)
    if not head:
        return None
    if len(head) < 16 or head[:8] != magic_bytes:
        raise ValueError("tenbin magic missing in stream")
    (n,) = struct.unpack("<q", head[8:])
    if n < 0:
        raise ValueError(f"tenbin chunk claims {n} bytes")
    data = stream.read(n)
    padding = roundup(n) - n
    if len(data) != n or len(stream.read(padding)) != padding:
        raise ValueError("tenbin stream is truncated")
    return data


def write(stream: IO[bytes], l: Sequence["npt.ArrayLike"], infos: Optional[Sequence[Union[str, bytes]]] = None) -> None:  # noqa: E741 (webdataset's parameter name)
    """Write a list of arrays to a binary stream."""
    for chunk in encode_list(l, infos=infos):
        write_chunk(stream, chunk)


def read(stream: IO[bytes], n: int = sys.maxsize, infos: _Infos = False) -> _Decoded:
    """Read up to ``n`` arrays from a binary stream."""
    chunks: List[_Buffer] = []
    for _ in range(n):
        header = read_chunk(stream)
        if header is None:
            break
        data = read_chunk(stream)
        if data is None:
            raise ValueError("tenbin stream ends after a header without its data chunk")
        chunks += [header, data]
    return decode_list(chunks, infos=infos)


def _check_name(fname: _Path, nocheck: bool) -> None:
    if not nocheck and not str(fname).endswith(".ten"):
        raise ValueError(f"tenbin file name {fname!r} should end in .ten (or pass nocheck=True)")


def save(fname: _Path, *args: "npt.ArrayLike", infos: Optional[Sequence[Union[str, bytes]]] = None,
         nocheck: bool = False) -> None:
    """Save arrays to a ``.ten`` file."""
    _check_name(fname, nocheck)
    with open(fname, "wb") as stream:
        write(stream, args, infos=infos)


def load(fname: _Path, infos: _Infos = False, nocheck: bool = False) -> _Decoded:
    """Load the list of arrays in a ``.ten`` file."""
    _check_name(fname, nocheck)
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
