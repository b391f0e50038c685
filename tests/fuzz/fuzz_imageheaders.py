"""Fuzz target: PNG, WebP and progressive JPEG files, headers and scan sequences first, through
both image decoders and their budget.

Each input is one control byte and an image file. The seeds are small PNGs and WebPs that
the script makes with Pillow (grey, RGB, RGBA, palette, 16-bit, interlaced; lossless, lossy,
extended with alpha), progressive JPEGs (Pillow's ten scans), and bombs: a PNG and a 28-byte
WebP claiming far more pixels than the budget, a progressive JPEG whose frame header claims
more coefficients than the budget holds, and one whose last scan is repeated past
``imagesize.MAX_SCANS``, which the fuzzer mutates (headers and scan sequences are where a
bomb says how large it is). The
control byte picks the decoder: FastLoader's ``decode_into`` (eval or train crops into a
small output), or ``autodecode.Decoder`` with an image spec; both with a budget of
``BUDGET`` pixels per image.

What must hold: ``decode_into`` returns, having decoded at most ``BUDGET`` pixels, or raises
DecodeError; the Decoder returns an array of at most ``BUDGET`` pixels or raises
DecodingError: never another error, and never the memory of an image past the budget. Run
it with ``-rss_limit_mb``: an image that gets past the budget is a memory blow-up, which
libFuzzer reports. Pillow and libwebp are not instrumented: each distinct outcome (the
error's type and first words, the format, whether it decoded) counts as a feature.

    tests/fuzz/run.sh imageheaders -max_total_time=600 -rss_limit_mb=2048 CORPUS_DIR
    python tests/fuzz/fuzz_imageheaders.py -runs=10000     # the installed wdsmp, Python coverage only
"""

import io
import os
import random
import sys
import warnings

import numpy as np
import PIL.Image

import fuzzsupport

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # after any wdsmp
from tests.bombs import (png_of_zeros, progressive_jpeg_claiming,  # noqa: E402
                         progressive_jpeg_with_repeated_scans, webp_of_zeros)

BUDGET = 1 << 16
SPECS = ("rgb8", "l8", "torchrgb8", "pil")


def main():
    argv = list(sys.argv)
    (imgops, imagedecode, autodecode, errors), coverage = fuzzsupport.load_wdsmp(
        argv, ["_imgops", "fast.imagedecode", "autodecode", "errors"])
    if coverage is not None:
        coverage.add(imgops)  # the resize kernel every decoded image goes through
    feedback = fuzzsupport.Feedback()
    decoders = {spec: autodecode.Decoder([autodecode.ImageHandler(spec, max_pixels=BUDGET)]) for spec in SPECS}
    warnings.simplefilter("ignore")  # Pillow warns of large images; the budget is what is tested

    def test_one_input(data):
        if not data:
            return
        control, image = data[0], data[1:]
        if control & 1:
            out = np.zeros((16 + (control >> 4), 16, 3), np.uint8)
            options = imagedecode.DecodeOptions(train=bool(control & 2), max_pixels=BUDGET)
            try:
                info = imagedecode.decode_with_options(image, out, options, random.Random(control), url="fuzz.tar",
                                                       member="k.img")
            except errors.DecodeError as exn:
                feedback(("fast", str(exn).split(":")[0][:40]))
                return
            feedback(("fast", info.kind))
            assert info.decoded[0] * info.decoded[1] <= BUDGET, info
        else:
            spec = SPECS[(control >> 1) & 3]
            try:
                value = decoders[spec].decode({"__key__": "k", "__url__": "fuzz.tar", "png": image})["png"]
            except autodecode.DecodingError as exn:
                feedback(("auto", str(exn.__cause__.__class__.__name__), str(exn)[:40]))
                return
            pixels = np.asarray(value)
            feedback(("auto", spec, pixels.ndim))
            assert pixels.size <= 4 * BUDGET, pixels.shape

    fuzzsupport.fuzz(argv, test_one_input, seeds(), coverage)


def seeds():
    rng = np.random.default_rng(0)
    images = []
    for mode, kw in [("L", {}), ("RGB", {}), ("RGBA", {}), ("P", {}), ("I;16", {}), ("RGB", {"interlace": 1}),
                     ("RGB", {"optimize": True})]:
        pixels = rng.integers(0, 256, (9, 13, 4), dtype=np.uint8)
        image = PIL.Image.fromarray(pixels, "RGBA").convert("RGB" if mode == "I;16" else mode)
        if mode == "I;16":
            image = image.convert("L").convert("I;16")
        stream = io.BytesIO()
        image.save(stream, "PNG", **kw)
        images.append(stream.getvalue())
    for mode, kw in [("RGB", {"lossless": True}), ("RGB", {"quality": 50}), ("RGBA", {}),
                     ("RGBA", {"lossless": True, "exact": True})]:
        stream = io.BytesIO()
        PIL.Image.fromarray(rng.integers(0, 256, (11, 7, 4), dtype=np.uint8), "RGBA").convert(mode).save(
            stream, "WEBP", **kw)
        images.append(stream.getvalue())
    images += [png_of_zeros(3000, 2000), png_of_zeros(40, 30), webp_of_zeros(13000, 13000), webp_of_zeros(60, 50)]
    images += [progressive_jpeg_with_repeated_scans(0, 40, 30), progressive_jpeg_claiming(3000, 2000),
               progressive_jpeg_with_repeated_scans(300, 16, 16)]
    return [bytes([control]) + image for image in images for control in (0x00, 0x01, 0x03)]


if __name__ == "__main__":
    main()
