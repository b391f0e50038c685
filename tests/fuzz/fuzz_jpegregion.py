"""Fuzz target: the JPEG region decoder decode_region (src/ext/_jpegregion.pyx).

Each input is a 9-byte region request and a JPEG. The seeds are real JPEGs that the
script makes with Pillow (colour 4:4:4, 4:2:2 and 4:2:0, grayscale, progressive, with
restart markers, optimised Huffman tables, odd and tiny sizes, CMYK), which the fuzzer
mutates. The request is the DCT scale (1..8, /8), then top, left, height and width,
each a 16-bit fraction of the scaled image's size (what the header says), or raw
pixel counts when the scale byte's top bit is set, to ask for regions outside it.

decode_region must return the region (an RGB uint8 array, the rows asked for, at
least the columns asked for, starting on an iMCU boundary, inside the image) or raise
ValueError; anything else, and any crash or ASan report, is a finding. Where it
returns pixels and the same library decodes the whole image without complaint, the
region must equal that decode but for the first and last column of a cropped row
(fancy upsampling, as decode_region documents; rows cropped to one or two columns
are not compared), and so must simplejpeg's whole decode, which FastLoader falls back
to, where that succeeds too. The limits on image size are smaller than FastLoader's,
so that no input allocates much.

libjpeg-turbo is the system's library, not instrumented: coverage guidance sees
decode_region's own code, and each distinct outcome (libjpeg-turbo's error message
with its numbers blanked, or which edges a returned region touches) as a feature.

    tests/fuzz/run.sh jpegregion -max_total_time=600 CORPUS_DIR
    python tests/fuzz/fuzz_jpegregion.py -runs=10000   # the installed wdsmp (no coverage of the decoder)
"""

import io
import os
import re
import struct
import sys

import numpy as np
import PIL.Image
import simplejpeg

import fuzzsupport

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # after any wdsmp
from benchmarks.photos import photo  # noqa: E402

REQUEST = struct.Struct("<BHHHH")
SOF_MARKERS = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers; not DHT, JPG, DAC
LIMITS = {"max_side": 2048, "max_pixels": 1 << 20}


def header_size(jpeg):
    """``(height, width)`` from the first frame header (SOFn) before the first scan, or None.

    Read here rather than with simplejpeg.decode_jpeg_header, which raises KeyError for
    chroma subsampling its table lacks (4:4:1, crashes/README.md)."""
    pos = 2
    while pos + 4 <= len(jpeg) and jpeg[pos] == 0xFF:
        marker = jpeg[pos + 1]
        if marker == 0xFF:  # a fill byte
            pos += 1
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
        elif marker in (0xD9, 0xDA):  # end of image, or a scan before any frame header
            return None
        elif marker in SOF_MARKERS:
            if pos + 9 > len(jpeg):
                return None
            return int.from_bytes(jpeg[pos + 5:pos + 7], "big"), int.from_bytes(jpeg[pos + 7:pos + 9], "big")
        else:
            pos += 2 + int.from_bytes(jpeg[pos + 2:pos + 4], "big")
    return None


def scaled(size, n):
    """libjpeg's size at n/8: ceil(side n / 8)."""
    return -(-size[0] * n // 8), -(-size[1] * n // 8)


def request(data):
    """``(jpeg, n, top, left, height, width)`` from the fuzzer's bytes; None when too short."""
    if len(data) < REQUEST.size:
        return None
    scale, top, left, height, width = REQUEST.unpack_from(data)
    jpeg = data[REQUEST.size:]
    n = (scale & 7) + 1
    size = header_size(jpeg)
    if scale & 0x80 or size is None:
        return jpeg, n, top, left, height, width
    sh, sw = scaled(size, n)
    top, left = top * sh >> 16, left * sw >> 16
    height, width = 1 + (height * (sh - top) >> 16), 1 + (width * (sw - left) >> 16)
    return jpeg, n, top, left, height, width


def _label(exn):
    """libjpeg-turbo's message without its numbers: one label per kind of complaint."""
    return re.sub(r"0x[0-9a-fA-F]+|[0-9]+", "#", str(exn))


def check(module, jpeg, n, top, left, height, width, feedback):
    try:
        pixels, top2, left2 = module.decode_region(jpeg, n, top, left, height, width, **LIMITS)
    except ValueError as exn:
        feedback(("region", _label(exn)))
        return  # refused: damaged, unsupported, too large, or a region outside the image
    feedback(("region", n, top > 0, left2 > 0, left2 + pixels.shape[1] < (header_size(jpeg) or (0, 1 << 30))[1]))
    where = f"region (n={n}, top={top}, left={left}, height={height}, width={width})"
    assert isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8, where
    assert pixels.ndim == 3 and pixels.shape[2] == 3 and pixels.flags.c_contiguous, (where, pixels.shape)
    assert top2 == top and pixels.shape[0] == height, (where, top2, pixels.shape)
    assert 0 <= left2 <= left and left2 + pixels.shape[1] >= left + width, (where, left2, pixels.shape)
    size = header_size(jpeg)
    if size is None:
        return
    sh, sw = scaled(size, n)
    assert top + height <= sh and left2 + pixels.shape[1] <= sw, (where, left2, pixels.shape, (sh, sw))
    # The whole image from the same library: no row skipped, no column cropped.
    try:
        whole, _, _ = module.decode_region(jpeg, n, 0, 0, sh, sw, **LIMITS)
    except ValueError as exn:
        feedback(("whole", _label(exn)))
        return  # damage outside the region, which the region decoder never read
    compare(pixels, whole, top, left2, f"{where} against the same library's whole decode")
    if n != 8 and max(size) < 8:
        return  # simplejpeg would decode so small an image at another scale (see imagedecode.dct_scale)
    try:
        reference = simplejpeg.decode_jpeg(jpeg, "RGB", **({} if n == 8 else {"min_height": sh, "min_width": sw}))
    except (ValueError, KeyError):  # simplejpeg's KeyError: see header_size
        return
    if reference.shape == whole.shape:
        compare(pixels, reference, top, left2, f"{where} against simplejpeg's whole decode")


def compare(pixels, whole, top, left, what):
    """The region equals the whole decode where decode_region says it does."""
    width = pixels.shape[1]
    want = whole[top:top + pixels.shape[0], left:left + width]
    cropped_right = left + width < whole.shape[1]
    if width > 2 or not (left > 0 or cropped_right):
        inner = slice(1 if left > 0 else 0, -1 if cropped_right else None)
        if not np.array_equal(pixels[:, inner], want[:, inner]):
            bad = np.argwhere(pixels[:, inner] != want[:, inner])[:5].tolist()
            raise AssertionError(f"{what}: pixels differ at {bad} (rows, columns from column "
                                 f"{inner.start or 0} of the region)")


def main():
    argv = list(sys.argv)
    (native,), coverage = fuzzsupport.load_wdsmp(argv, ["_jpegregion"])
    if coverage is not None:
        coverage.add(native)
    # libjpeg-turbo itself is not instrumented: its outcomes stand in for its coverage.
    feedback = fuzzsupport.Feedback()

    def test_one_input(data):
        parsed = request(data)
        if parsed is not None:
            check(native, *parsed, feedback)

    fuzzsupport.fuzz(argv, test_one_input, seeds(), coverage)


def seeds():
    """Request + JPEG: small real files of every kind the decoder meets."""
    kinds = [
        ((40, 56), {"subsampling": 0}),
        ((37, 61), {"subsampling": 1}),
        ((48, 33), {"subsampling": 2}),
        ((29, 45), {"mode": "L"}),
        ((40, 52), {"progressive": True}),
        ((33, 41), {"progressive": True, "mode": "L"}),
        ((45, 64), {"restart_marker_blocks": 2}),
        ((40, 40), {"restart_marker_rows": 1, "subsampling": 2}),
        ((35, 47), {"optimize": True, "quality": 30}),
        ((17, 9), {"quality": 100}),
        ((1, 75), {}),
        ((75, 1), {"subsampling": 2}),
        ((1, 1), {}),
        ((24, 24), {"mode": "CMYK"}),
    ]
    out = []
    for i, ((height, width), options) in enumerate(kinds):
        options = dict(options)
        image = PIL.Image.fromarray(photo(height, width, i))
        image = image.convert(options.pop("mode", "RGB"))
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=options.pop("quality", 85), **options)
        jpeg = buf.getvalue()
        out.append(REQUEST.pack(7, 1 << 14, 1 << 14, 1 << 15, 1 << 15) + jpeg)  # the middle, at 8/8
        out.append(REQUEST.pack(i % 3, 0, 40000, 65535, 20000) + jpeg)  # scaled, the right edge
    return out


if __name__ == "__main__":
    main()
