# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native JPEG region decoder: only the rows and columns of a JPEG that a crop needs.

libjpeg-turbo's libjpeg API decodes a region of a JPEG at any DCT scale n/8:
``jpeg_skip_scanlines`` passes over the rows above it (their Huffman data is
still read, but nothing is transformed or converted), ``jpeg_crop_scanline``
limits every row to the region's columns (the others are entropy-decoded only),
and decoding stops after the region's last row, so the rows below it are never
read at all. FastLoader's train crops cover about half an image, so about half
of the inverse DCT, upsampling and colour conversion, and part of the entropy
decoding, is skipped (benchmarks/bench_kernels.py measures it). ``decode("pil")``'s
lazy JPEG images (``wdsmp/images/lazyjpeg.py``) decode the region a crop or a resize reads
with ``decode_region_into``, at full size, into the whole image's layout, and
make lazy only a JPEG whose tables ``check_start`` finds libjpeg-turbo accepts and whose
image data ``find_marker`` finds holds no marker.

Built only where libjpeg-turbo 2.1 or later and its headers are found (see
setup.py; earlier releases have bugs in ``jpeg_skip_scanlines``); without it
``wdsmp.native.core.jpeg_region_module()`` is None and whole images are decoded with
simplejpeg. There is no pure-Python twin: the fallback is that decoder.

NOTE [jpeg region errors]: libjpeg reports errors by calling ``error_exit``,
which must not return. It is replaced by one that formats the library's message
and ``longjmp``s back to the ``setjmp`` at the top of the C function that made
the call, which returns -1; every libjpeg call is made from such a function (in
``jpegregion.c``), never from Cython code, so no Python state is ever jumped over.
Warnings (corrupt but decodable data, e.g. a file cut short) are treated as
errors, as simplejpeg does, so damaged files go to the caller's fallback
decoder instead of coming back with made-up pixels. The decompressor is
destroyed on every path, started or not, by the caller's ``finally``.
"""

from libc.stdint cimport uint8_t
from libc.string cimport memchr, memset

import numpy as np

cdef extern from "jpegregion.h":
    ctypedef struct jpegregion_state:
        pass
    int jpegregion_start(jpegregion_state* s, const unsigned char* data, size_t size, int scale_num,
                         int top, int height, int* left, int* width, int rgbx, int exact,
                         unsigned long long max_side, unsigned long long max_pixels) nogil
    void jpegregion_image_size(const jpegregion_state* s, int* height, int* width) nogil
    int jpegregion_read(jpegregion_state* s, int top, int height, unsigned char* out, size_t pitch) nogil
    const char* jpegregion_message(const jpegregion_state* s) nogil
    void jpegregion_destroy(jpegregion_state* s) nogil


def decode_region(const unsigned char[:] data not None, int scale_num, int top, int left, int height,
                  int width, *, unsigned long long max_side, unsigned long long max_pixels):
    """Decode rows ``[top, top + height)`` and at least columns ``[left, left + width)``
    of a JPEG scaled by ``scale_num / 8``; returns ``(pixels, top, left)``.

    ``pixels`` is an RGB ``height x w x 3`` uint8 array (grayscale JPEGs expanded
    to RGB) whose top-left pixel is at ``(top, left)`` of the scaled image:
    ``left`` is moved down to an iMCU boundary (a multiple of n pixels, 2n with
    horizontally subsampled chroma) and ``w`` widened to match. The accurate
    integer IDCT and fancy upsampling are used, as simplejpeg uses them, so the
    pixels equal a whole decode's, except that fancy upsampling of 4:2:x chroma
    may differ in the first and last column of a cropped row (libjpeg-turbo's
    libjpeg.txt, "Partial image decompression"), and in every column of a row
    cropped to one or two columns (libjpeg-turbo then upsamples plainly).

    Raises ValueError with libjpeg's message for damaged or unsupported data
    (including its warnings, NOTE [jpeg region errors]), for CMYK and YCCK
    images, for progressive images that lack some of their scans (libjpeg-turbo
    smooths their blocks, a cropped region's unlike a whole decode's), for
    colour images sampled other than 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 or 4:4:1
    (libjpeg-turbo crops some such layouts wrongly), for a region outside the
    scaled image, and for headers over ``max_side`` per side or ``max_pixels``
    in all, which are refused before anything is allocated.
    """
    if not 1 <= scale_num <= 8:
        raise ValueError(f"scale_num {scale_num} is not in 1..8")
    if top < 0 or left < 0 or height < 1 or width < 1:
        raise ValueError(f"region (top={top}, left={left}, height={height}, width={width}) is empty or negative")
    if data.shape[0] == 0:
        raise ValueError("the JPEG data is empty")
    cdef jpegregion_state state
    cdef const unsigned char* src = &data[0]
    cdef size_t size = data.shape[0]
    cdef int rc
    cdef uint8_t[:, :, ::1] out
    memset(&state, 0, sizeof(state))
    try:
        with nogil:
            rc = jpegregion_start(&state, src, size, scale_num, top, height, &left, &width, 0, 0,
                                  max_side, max_pixels)
        if rc != 0:
            raise ValueError(jpegregion_message(&state).decode("utf-8", "replace"))
        pixels = np.empty((height, width, 3), np.uint8)
        out = pixels
        with nogil:
            rc = jpegregion_read(&state, top, height, &out[0, 0, 0], <size_t>width * 3)
        if rc != 0:
            raise ValueError(jpegregion_message(&state).decode("utf-8", "replace"))
    finally:
        jpegregion_destroy(&state)
    return pixels, top, left


def decode_region_into(const unsigned char[:] data not None, uint8_t[:, :, ::1] out not None, int top, int left,
                       int height, int width, *, unsigned long long max_side, unsigned long long max_pixels):
    """Decode rows ``[top, top + height)`` and columns ``[left, left + width)`` of a JPEG, at
    full size, as RGBX (the fourth byte 255) into ``out``, an ``H x W x 4`` uint8 array of the
    whole image's size, each pixel in its own place; returns ``(left, width)``, the columns
    written (a few more than asked for).

    Every pixel asked for equals a whole decode's (the accurate integer IDCT and fancy
    upsampling, as simplejpeg's ``RGBX`` decode): the columns are widened by one iMCU on each
    side that is not the image's edge before libjpeg-turbo crops the rows (fancy upsampling
    may make the first and last column of a cropped row differ), then moved out to iMCU
    boundaries. Nothing of ``out`` outside those rows and columns is written, so the pixels
    of a whole-image layout that a caller reads only there need no other decoding.

    Raises ValueError as :func:`decode_region` does, and when ``out`` is not the image's size.
    """
    if top < 0 or left < 0 or height < 1 or width < 1:
        raise ValueError(f"region (top={top}, left={left}, height={height}, width={width}) is empty or negative")
    if data.shape[0] == 0:
        raise ValueError("the JPEG data is empty")
    if out.shape[2] != 4:
        raise ValueError(f"out must be H x W x 4, not {out.shape[0]} x {out.shape[1]} x {out.shape[2]}")
    cdef jpegregion_state state
    cdef const unsigned char* src = &data[0]
    cdef size_t size = data.shape[0]
    cdef int rc, image_height, image_width
    memset(&state, 0, sizeof(state))
    try:
        with nogil:
            rc = jpegregion_start(&state, src, size, 8, top, height, &left, &width, 1, 1, max_side, max_pixels)
        if rc != 0:
            raise ValueError(jpegregion_message(&state).decode("utf-8", "replace"))
        jpegregion_image_size(&state, &image_height, &image_width)
        if out.shape[0] != image_height or out.shape[1] != image_width:
            raise ValueError(f"out is {out.shape[1]}x{out.shape[0]}, the JPEG image {image_width}x{image_height}")
        with nogil:
            rc = jpegregion_read(&state, top, height, &out[top, left, 0], <size_t>image_width * 4)
        if rc != 0:
            raise ValueError(jpegregion_message(&state).decode("utf-8", "replace"))
    finally:
        jpegregion_destroy(&state)
    return left, width


def check_start(const unsigned char[:] data not None, *, unsigned long long max_side, unsigned long long max_pixels):
    """Read a JPEG's header and tables and start decompressing it as a region decode does,
    decoding no pixels: raises ValueError as :func:`decode_region_into` would for any region,
    where the error lies before the image data (a damaged Huffman or quantization table, a
    scan naming a table never defined, which ``PIL.Image.open`` does not read)."""
    if data.shape[0] == 0:
        raise ValueError("the JPEG data is empty")
    cdef jpegregion_state state
    cdef const unsigned char* src = &data[0]
    cdef size_t size = data.shape[0]
    cdef int rc, left = 0, width = 1
    memset(&state, 0, sizeof(state))
    try:
        with nogil:
            rc = jpegregion_start(&state, src, size, 8, 0, 1, &left, &width, 1, 0, max_side, max_pixels)
        if rc != 0:
            raise ValueError(jpegregion_message(&state).decode("utf-8", "replace"))
    finally:
        jpegregion_destroy(&state)


def find_marker(const unsigned char[:] data not None, Py_ssize_t start, Py_ssize_t end):
    """The offset of the first marker in ``data[start:end]``, both of its bytes inside: 0xFF
    followed by a byte other than the stuffed 0x00 or a restart marker's 0xD0-0xD7, which
    are all a scan's entropy-coded data may hold; -1 when there is none. A memchr walk over
    the 0xFF bytes, 10x a regular expression's speed on a 110 KB photo."""
    cdef Py_ssize_t size = data.shape[0]
    cdef const unsigned char* base
    cdef const unsigned char* at
    cdef const unsigned char* last
    start, end = max(start, 0), min(end, size)
    if end - start < 2:
        return -1
    base = &data[0]
    at = base + start
    last = base + end - 1  # a marker's first byte lies before this
    with nogil:
        while at < last:
            at = <const unsigned char*>memchr(at, 0xFF, last - at)
            if at == NULL:
                break
            if at[1] != 0x00 and not (0xD0 <= at[1] <= 0xD7):
                break
            at += 1
    return -1 if at == NULL or at >= last else at - base
