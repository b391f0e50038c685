"""The byte layout of a ring of batches: arrays, offsets, slot size and the ring header.

A ``BatchLayout`` says where each batch array (images, labels, keys, the declared
fields) lives inside a slot. Every array starts on a 64-byte boundary (a cache
line, and what SIMD stores and ``torch.from_numpy`` like), and a slot is a whole
number of 4 KiB pages, so each slot can be pinned or registered with CUDA on its own.

A ring is ``HEADER_SIZE`` bytes of header and then the slots. The header holds
a magic, a format version, the layout's digest and a readable description of
the layout, so a process that attaches with another layout (another wdsmp, a
changed crop size) fails with a message naming both, instead of reading
garbage. Everything here is pure: buffers in, arrays out; no processes, no
shared memory.
"""

import hashlib
import json
import math
import operator
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

import numpy as np

from .._internal.validation import positive_int

__all__ = [
    "ARRAY_ALIGN",
    "HEADER_SIZE",
    "MAGIC",
    "SLOT_ALIGN",
    "VERSION",
    "BatchLayout",
    "ArraySpec",
]

ARRAY_ALIGN = 64
SLOT_ALIGN = 4096
HEADER_SIZE = 4096
MAGIC = b"WDSMPRNG"
VERSION = 1

# magic, version, header size, layout digest, slot size, slot count, description length
_HEADER = struct.Struct("<8sII16sQQI")
_DESCRIPTION_ROOM = HEADER_SIZE - _HEADER.size
# bool, signed and unsigned ints, floats, complex, fixed-size bytes (keys): what a slot can hold.
_KINDS = "biufcS"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _dtype_str(dtype: Any, name: str) -> str:
    """The canonical string of a dtype a slot can hold (``"|u1"``, ``"<f4"``, ``"|S32"``)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exn:
        raise ValueError(f"array {name!r}: {dtype!r} is not a numpy dtype") from exn
    if dt.kind not in _KINDS or dt.fields is not None or dt.subdtype is not None:
        raise ValueError(f"array {name!r}: dtype {dt} cannot live in shared memory; "
                         f"use bool, ints, floats, complex or fixed-size bytes ('S<n>')")
    if dt.itemsize == 0:
        raise ValueError(f"array {name!r}: dtype {dt} has no size; give one, as in 'S32'")
    if not dt.isnative:
        raise ValueError(f"array {name!r}: dtype {dt.str} is not in native byte order (torch needs it)")
    return dt.str


@dataclass(frozen=True)
class ArraySpec:
    """One array of a batch: its name, the shape of one sample's array, and its dtype.

    The batch array is ``(batch_size, *shape)``; ``shape=()`` is one scalar per
    sample (a label). ``dtype`` is stored as numpy's canonical string.
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an array name must be a non-empty string, not {self.name!r}")
        shape = (self.shape,) if isinstance(self.shape, int) else self.shape
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError as exn:
            raise ValueError(f"array {self.name!r}: shape {self.shape!r} is not a tuple of ints") from exn
        if any(isinstance(d, bool) for d in shape) or any(d < 1 for d in dims):
            raise ValueError(f"array {self.name!r}: sizes in shape {self.shape!r} must be positive")
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", _dtype_str(self.dtype, self.name))

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample's array."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class BatchLayout:
    """Where each batch array lives in a slot, and how big a slot is.

    Derived attributes: ``offsets`` (array name -> byte offset in a slot, each
    a multiple of ``ARRAY_ALIGN``), ``slot_size`` (a multiple of
    ``SLOT_ALIGN``) and ``digest`` (16 bytes naming the layout and the format
    version; equal layouts have equal digests in every process).
    """

    batch_size: int
    arrays: Tuple[ArraySpec, ...]
    offsets: dict = field(init=False, repr=False, compare=False)
    slot_size: int = field(init=False, repr=False, compare=False)
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "batch_size")
        arrays = tuple(self.arrays)
        if not arrays:
            raise ValueError("a BatchLayout needs at least one array")
        for spec in arrays:
            if not isinstance(spec, ArraySpec):
                raise TypeError(f"arrays must be ArraySpec instances, not {type(spec).__name__}: {spec!r}")
        names = [spec.name for spec in arrays]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate array names in layout: {duplicates}")
        offsets: Dict[str, int] = {}
        end = 0
        for spec in arrays:
            offsets[spec.name] = _round_up(end, ARRAY_ALIGN)
            end = offsets[spec.name] + self.batch_size * spec.sample_bytes
        object.__setattr__(self, "arrays", arrays)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "slot_size", _round_up(end, SLOT_ALIGN))
        object.__setattr__(self, "digest", hashlib.blake2b(self.describe().encode(), digest_size=16).digest())

    def describe(self) -> str:
        """A JSON text naming everything the bytes depend on: version, batch size, arrays, offsets."""
        return json.dumps({
            "version": VERSION,
            "batch_size": self.batch_size,
            "arrays": [[s.name, list(s.shape), s.dtype, self.offsets[s.name]] for s in self.arrays],
            "slot_size": self.slot_size,
        }, separators=(",", ":"))

    def ring_size(self, nslots: int) -> int:
        """Bytes of a ring of ``nslots`` slots, header included."""
        positive_int(nslots, "nslots")
        return HEADER_SIZE + nslots * self.slot_size

    def write_header(self, buffer: Any, nslots: int) -> None:
        """Write the ring header for ``nslots`` slots of this layout at the start of ``buffer``."""
        size = self.ring_size(nslots)
        with memoryview(buffer) as view:
            if view.nbytes < size:
                raise ValueError(f"buffer of {view.nbytes} bytes is too small for a ring of {size} bytes")
            description = self.describe().encode()[:_DESCRIPTION_ROOM]
            view[:_HEADER.size] = _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, self.digest, self.slot_size,
                                               nslots, len(description))
            view[_HEADER.size:_HEADER.size + len(description)] = description

    def read_header(self, buffer: Any) -> int:
        """The slot count of the ring in ``buffer``; ValueError unless it was written with this layout."""
        with memoryview(buffer) as view:
            if view.nbytes < HEADER_SIZE:
                raise ValueError(f"buffer of {view.nbytes} bytes is too small to hold a wdsmp ring header")
            magic, version, header_size, digest, slot_size, nslots, length = _HEADER.unpack_from(view)
            theirs = bytes(view[_HEADER.size:_HEADER.size + min(length, _DESCRIPTION_ROOM)])
            nbytes = view.nbytes
        if magic != MAGIC:
            raise ValueError(f"not a wdsmp ring (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION or header_size != HEADER_SIZE:
            raise ValueError(f"ring format version {version} (header {header_size} bytes), but this wdsmp "
                             f"reads version {VERSION} ({HEADER_SIZE} bytes): is another wdsmp writing it?")
        if digest != self.digest or slot_size != self.slot_size:
            raise ValueError(f"ring was created with a different layout: it holds "
                             f"{theirs.decode(errors='replace')}, this process expects {self.describe()}")
        if nbytes < HEADER_SIZE + nslots * slot_size:
            raise ValueError(f"ring header says {nslots} slots of {slot_size} bytes, "
                             f"but the buffer holds only {nbytes} bytes")
        return nslots

    def slot_offset(self, slot: int) -> int:
        """Byte offset of ``slot`` from the start of the ring."""
        return HEADER_SIZE + slot * self.slot_size

    def views(self, buffer: Any, slot: int) -> Dict[str, np.ndarray]:
        """``{name: array}`` over slot ``slot`` of the ring in ``buffer``: zero-copy, writable if it is.

        Each array is ``(batch_size, *shape)``. They keep ``buffer`` alive (and,
        for an mmap, mapped) for as long as they live.
        """
        with memoryview(buffer) as view:
            nslots = (view.nbytes - HEADER_SIZE) // self.slot_size
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < nslots:
            raise ValueError(f"slot {slot!r} is not in range(0, {max(nslots, 0)}) for this buffer")
        base = self.slot_offset(int(slot))
        arrays: Dict[str, np.ndarray] = {}
        for spec in self.arrays:
            count = self.batch_size * math.prod(spec.shape)
            array = np.frombuffer(buffer, dtype=spec.dtype, count=count, offset=base + self.offsets[spec.name])
            arrays[spec.name] = array.reshape((self.batch_size, *spec.shape))
        return arrays
