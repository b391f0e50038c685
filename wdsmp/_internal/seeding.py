"""``make_seed``: seeds that every process computes alike, from the values they are made of;
``SampleDraws``: random numbers for one item of a seeded stream, alike in every process."""

import hashlib
import struct
from typing import Any

__all__ = ["SampleDraws", "make_seed"]


def _encode(arg: Any) -> bytes:
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


def _frame(arg: Any) -> bytes:
    data = _encode(arg)
    return struct.pack("<Q", len(data)) + data


def make_seed(*args: Any) -> int:
    """A 31-bit seed from ints, strings, bytes, floats (and tuples of them).

    Unlike webdataset's, it never uses ``hash()``: string hashes are salted
    per process, so spawned workers would disagree on every seed.
    """
    digest = hashlib.blake2b(b"".join(_frame(a) for a in args), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit ints that spreads every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class SampleDraws:
    """Uniform floats in [0, 1) (``random()``) for item ``number`` of a stream seeded ``seed``,
    the same in every process: SplitMix64 started from both. FastLoader draws each sample's crop
    and flip from one, so that they follow the sample wherever it is made (a resumed stream, a
    worker making another's streams). Starting one costs a few multiplications, where a
    ``random.Random`` spends about 20 us seeding its Mersenne Twister: a cost per image."""

    __slots__ = ("_state",)

    def __init__(self, seed: int, number: int) -> None:
        self._state = _mix64(_mix64(seed & _MASK) ^ (number & _MASK))

    def random(self) -> float:
        self._state = (self._state + _GOLDEN) & _MASK
        return (_mix64(self._state) >> 11) * (1.0 / (1 << 53))
