"""Fuzz target: the native image kernel crop_resize_flip (src/ext/_imgops.pyx) against its twin.

A FuzzedDataProvider chooses the channels (1 or 3, sometimes 2 or 4, which both must
refuse), the source and output sizes (up to 4096 a side, at most 65536 source and
4096 output pixels, output rows times source columns at most 65536 to keep the twin
quick: shrinks by thousands, enlargements from one pixel), the crop box
(inside the image in all kinds of ways, on its edges, or any doubles at all: negative,
NaN, infinite, subnormal), the flip, and the pixels (the rest of the input, repeated).
The native kernel and the twin must both fail with the same ValueError, or both write
the same pixels. The source is its own allocation, so ASan sees any read past it;
the output is the middle row of three, so a write past it is seen in its neighbours.

    tests/fuzz/run.sh imgops -max_total_time=600 CORPUS_DIR
    python tests/fuzz/fuzz_imgops.py -runs=100000       # the installed wdsmp, Python coverage only
"""

import struct
import sys

import numpy as np

import atheris
import fuzzsupport

SENTINEL = 0xA5
MAX_SIDE = 4096
MAX_SRC_PIXELS = 1 << 16
MAX_OUT_PIXELS = 1 << 12
MAX_ROWS_BY_SRC_WIDTH = 1 << 16  # out_h x in_w: the size of the twin's vertical pass


def _side(fdp, limit):
    """A side length in 1..limit, small ones more often."""
    if fdp.ConsumeBool():
        return fdp.ConsumeIntInRange(1, min(limit, 16))
    return fdp.ConsumeIntInRange(1, max(1, limit))


def _box_axis(fdp, size):
    """``(start, length)`` of the box on an axis of ``size`` pixels."""
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind == 0:  # whole pixels
        start = fdp.ConsumeIntInRange(0, size - 1)
        return float(start), float(fdp.ConsumeIntInRange(1, size - start))
    if kind == 1:  # anywhere inside, sub-pixel
        length = size * fdp.ConsumeProbability()
        return (size - length) * fdp.ConsumeProbability(), length
    if kind == 2:  # touching the far edge: start + length == size, or just past it by rounding
        length = size * fdp.ConsumeProbability()
        return size - length, length
    if kind == 3:  # tiny, anywhere
        length = fdp.ConsumeProbability() * 2.0 ** -fdp.ConsumeIntInRange(0, 1074)
        return (size - length) * fdp.ConsumeProbability(), length
    if kind == 4:  # any doubles
        return fdp.ConsumeFloat(), fdp.ConsumeFloat()
    return fdp.ConsumeRegularFloat(), fdp.ConsumeRegularFloat()


def case(data):
    """The kernel's arguments, from the fuzzer's bytes."""
    fdp = atheris.FuzzedDataProvider(data)
    channels = fdp.PickValueInList([1, 3, 1, 3, 1, 3, 2, 4])
    in_h = _side(fdp, MAX_SIDE)
    in_w = _side(fdp, min(MAX_SIDE, MAX_SRC_PIXELS // in_h))
    out_h = _side(fdp, min(MAX_SIDE, MAX_ROWS_BY_SRC_WIDTH // in_w))
    out_w = _side(fdp, min(MAX_SIDE, MAX_OUT_PIXELS // out_h))
    y0, h = _box_axis(fdp, in_h)
    x0, w = _box_axis(fdp, in_w)
    flip = fdp.ConsumeBool()
    out_channels = channels if fdp.ConsumeIntInRange(0, 15) else 4 - channels  # sometimes a mismatch
    pixels = fdp.ConsumeBytes(fdp.remaining_bytes()) or b"\x80"
    src = np.empty((in_h, in_w, channels), np.uint8)  # exactly its pixels: ASan guards its ends
    src.reshape(-1)[:] = np.resize(np.frombuffer(pixels, np.uint8), src.size)
    return src, (y0, x0, h, w), (out_h, out_w, out_channels), flip


def run(kernel, src, box, shape, flip):
    """``(pixels, None)`` or ``(None, error)``; checks that nothing around ``out`` was written."""
    slab = np.full((3,) + shape, SENTINEL, np.uint8)
    try:
        kernel(src, *box, slab[1], flip)
    except ValueError as exn:
        result = None, str(exn)
    else:
        result = slab[1].copy(), None
    if (slab[0] != SENTINEL).any() or (slab[2] != SENTINEL).any():
        raise AssertionError(f"{kernel.__module__}: wrote outside out")
    if result[1] is not None and (slab[1] != SENTINEL).any():
        raise AssertionError(f"{kernel.__module__}: wrote into out, then raised {result[1]}")
    return result


def main():
    argv = list(sys.argv)
    (native, twin), coverage = fuzzsupport.load_wdsmp(argv, ["_imgops", "_imgops_py"])
    if coverage is not None:
        coverage.add(native)

    def test_one_input(data):
        src, box, shape, flip = case(data)
        a_pixels, a_error = run(native.crop_resize_flip, src, box, shape, flip)
        b_pixels, b_error = run(twin.crop_resize_flip, src, box, shape, flip)
        if a_error != b_error:
            raise AssertionError(f"errors differ for {src.shape} box {box} -> {shape} flip={flip}:\n"
                                 f" native: {a_error}\n twin:   {b_error}")
        if a_error is None and not np.array_equal(a_pixels, b_pixels):
            where = np.argwhere(a_pixels != b_pixels)[:5].tolist()
            raise AssertionError(f"pixels differ for {src.shape} box {box!r} -> {shape} flip={flip} at {where}")

    fuzzsupport.fuzz(argv, test_one_input, seeds(), coverage)


def seeds():
    """Hand-made FuzzedDataProvider inputs would be brittle; random ones reach every kind of
    box within a few hundred runs. These are just a start of each length."""
    rng = np.random.default_rng(0)
    return [struct.pack("<Q", i) + rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            for i, n in enumerate((8, 64, 300, 1000, 4000))]


if __name__ == "__main__":
    main()
