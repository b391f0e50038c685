"""``make_seed``: seeds that every process computes alike, from the values they are made of."""

import hashlib
import struct

__all__ = ["make_seed"]


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
