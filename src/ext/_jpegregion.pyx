# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native JPEG region decoder: only the rows and columns of a JPEG that a crop needs.

libjpeg-turbo's libjpeg API decodes a region of a JPEG at any DCT scale n/8:
``jpeg_skip_scanlines`` passes over the rows above it (their Huffman data is
still read, but nothing is transformed or converted), ``jpeg_crop_scanline``
limits every row to the region's columns (the others are entropy-decoded only),
and decoding stops after the region's last row, so the rows below it are never
read at all. FastLoader's train crops cover about half an image, so about half
of the inverse DCT, upsampling and colour conversion, and part of the entropy
decoding, is skipped (benchmarks/bench_kernels.py measures it).

Built only where libjpeg-turbo 2.1 or later and its headers are found (see
setup.py; earlier releases have bugs in ``jpeg_skip_scanlines``); without it
``wdsmp.native.jpeg_region_module()`` is None and whole images are decoded with
simplejpeg. There is no pure-Python twin: the fallback is that decoder.

NOTE [jpeg region errors]: libjpeg reports errors by calling ``error_exit``,
which must not return. It is replaced by one that formats the library's message
and ``longjmp``s back to the ``setjmp`` at the top of the C function that made
the call, which returns -1; every libjpeg call is made from such a function (the
C below), never from Cython code, so no Python state is ever jumped over.
Warnings (corrupt but decodable data, e.g. a file cut short) are treated as
errors, as simplejpeg does, so damaged files go to the caller's fallback
decoder instead of coming back with made-up pixels. The decompressor is
destroyed on every path, started or not, by the caller's ``finally``.
"""

from libc.stdint cimport uint8_t
from libc.string cimport memset

import numpy as np

cdef extern from *:
    """
    #include <setjmp.h>
    #include <stdio.h>
    #include <string.h>
    #include <jpeglib.h>

    /* libjpeg's error manager, extended with where to jump and the message (NOTE [jpeg region errors]). */
    typedef struct {
        struct jpeg_error_mgr pub;
        jmp_buf jump;
        char message[JMSG_LENGTH_MAX + 80];
    } jpegregion_error;

    typedef struct {
        struct jpeg_decompress_struct cinfo;
        jpegregion_error err;
        int created;  /* jpeg_create_decompress was called: jpeg_destroy_decompress is due */
    } jpegregion_state;

    static void jpegregion_error_exit(j_common_ptr cinfo)
    {
        jpegregion_error* err = (jpegregion_error*)cinfo->err;
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->jump, 1);
    }

    /* Level -1 is a warning about corrupt data; trace messages (levels >= 0) are dropped. */
    static void jpegregion_emit_message(j_common_ptr cinfo, int level)
    {
        if (level < 0)
            jpegregion_error_exit(cinfo);
    }

    /* Reads the header, checks it, and starts decompressing at scale_num/8, limited to the
       columns [*left, *left + *width) of the scaled image; libjpeg moves *left down to an
       iMCU boundary and widens *width to match. The rows [top, top + height) are only
       checked here. Returns 0, or -1 with err.message set. */
    static int jpegregion_start(jpegregion_state* s, const unsigned char* data, size_t size,
                                int scale_num, int top, int height, int* left, int* width,
                                unsigned long long max_side, unsigned long long max_pixels)
    {
        struct jpeg_decompress_struct* cinfo = &s->cinfo;
        jpeg_component_info* comp;
        JDIMENSION xoffset, xwidth;
        int ci, k, h, v;
        if (setjmp(s->err.jump))
            return -1;
        cinfo->err = jpeg_std_error(&s->err.pub);
        s->err.pub.error_exit = jpegregion_error_exit;
        s->err.pub.emit_message = jpegregion_emit_message;
        s->created = 1;  /* jpeg_destroy_decompress is safe even if creating fails: s was zeroed */
        jpeg_create_decompress(cinfo);
        if (size > (unsigned long)-1) {
            snprintf(s->err.message, sizeof s->err.message, "the JPEG data is too large (%zu bytes)", size);
            return -1;
        }
        jpeg_mem_src(cinfo, data, (unsigned long)size);
        if (jpeg_read_header(cinfo, TRUE) != JPEG_HEADER_OK) {
            snprintf(s->err.message, sizeof s->err.message, "the JPEG data has no image");
            return -1;
        }
        if (cinfo->image_width > max_side || cinfo->image_height > max_side
                || (unsigned long long)cinfo->image_width * cinfo->image_height > max_pixels) {
            snprintf(s->err.message, sizeof s->err.message,
                     "the JPEG image is %ux%u pixels, outside the limits (sides 1 to %llu, at most %llu pixels)",
                     (unsigned)cinfo->image_width, (unsigned)cinfo->image_height, max_side, max_pixels);
            return -1;
        }
        if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
            snprintf(s->err.message, sizeof s->err.message, "the JPEG image is CMYK or YCCK, not RGB or grayscale");
            return -1;
        }
        /* jpeg_crop_scanline crops some sampling layouts wrongly at reduced scales (libjpeg-turbo
           2.1.5 turns a region of luma 2x2, Cb 1x1, Cr 1x4 at 2/8 into garbage). Only the layouts
           TurboJPEG names, as simplejpeg decodes them, are region-decoded: grayscale, or 1x1
           chroma with 1x1, 2x1, 2x2, 1x2, 4x1 or 1x4 luma (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:4:1). */
        if (cinfo->num_components == 3) {
            comp = cinfo->comp_info;
            h = comp[0].h_samp_factor;
            v = comp[0].v_samp_factor;
            if (comp[1].h_samp_factor != 1 || comp[1].v_samp_factor != 1 || comp[2].h_samp_factor != 1
                    || comp[2].v_samp_factor != 1 || h == 3 || v == 3 || h * v > 4) {
                snprintf(s->err.message, sizeof s->err.message,
                         "the JPEG's sampling factors (%dx%d, %dx%d, %dx%d) are not a layout the region decoder handles",
                         h, v, comp[1].h_samp_factor, comp[1].v_samp_factor, comp[2].h_samp_factor,
                         comp[2].v_samp_factor);
                return -1;
            }
        }
        cinfo->out_color_space = JCS_RGB;  /* grayscale sources are expanded by libjpeg-turbo */
        cinfo->scale_num = (unsigned)scale_num;
        cinfo->scale_denom = 8;
        cinfo->dct_method = JDCT_ISLOW;  /* simplejpeg's defaults: accurate IDCT, fancy upsampling */
        cinfo->do_fancy_upsampling = TRUE;
        jpeg_calc_output_dimensions(cinfo);
        if ((long long)top + height > (long long)cinfo->output_height
                || (long long)*left + *width > (long long)cinfo->output_width) {
            snprintf(s->err.message, sizeof s->err.message,
                     "the region (top=%d, left=%d, height=%d, width=%d) is not inside the %ux%u image decoded at %d/8",
                     top, *left, height, *width, (unsigned)cinfo->output_height,
                     (unsigned)cinfo->output_width, scale_num);
            return -1;
        }
        if (!jpeg_start_decompress(cinfo)) {
            snprintf(s->err.message, sizeof s->err.message, "libjpeg could not start decompressing");
            return -1;
        }
        if (cinfo->output_components != 3) {
            snprintf(s->err.message, sizeof s->err.message, "libjpeg gave %d channels, not RGB",
                     cinfo->output_components);
            return -1;
        }
        /* A progressive JPEG has been read whole by now; coef_bits says, per component and
           coefficient, -1 (never sent) or the last scan's Al (0 when complete). libjpeg-turbo
           smooths the blocks of an incomplete one (block smoothing), and smooths those of a
           cropped row differently from a whole decode's (it reads neighbouring blocks), and
           differently again from one release to the next: the whole-image path decides. */
        if (cinfo->progressive_mode && cinfo->coef_bits != NULL) {
            for (ci = 0; ci < cinfo->num_components; ci++)
                for (k = 0; k < DCTSIZE2; k++)
                    if (cinfo->coef_bits[ci][k] != 0) {
                        snprintf(s->err.message, sizeof s->err.message,
                                 "the progressive JPEG lacks some of its scans (component %d, coefficient %d): "
                                 "its blocks would be smoothed", ci, k);
                        return -1;
                    }
        }
        if (*left > 0 || (JDIMENSION)*width < cinfo->output_width) {
            xoffset = (JDIMENSION)*left;
            xwidth = (JDIMENSION)*width;
            jpeg_crop_scanline(cinfo, &xoffset, &xwidth);
            *left = (int)xoffset;
            *width = (int)xwidth;
        }
        return 0;
    }

    /* Skips to row top and decodes height rows into out (pitch bytes per row). 0, or -1. */
    static int jpegregion_read(jpegregion_state* s, int top, int height, unsigned char* out, size_t pitch)
    {
        struct jpeg_decompress_struct* cinfo = &s->cinfo;
        JSAMPROW row;
        int done = 0;
        if (setjmp(s->err.jump))
            return -1;
        if (top > 0 && jpeg_skip_scanlines(cinfo, (JDIMENSION)top) != (JDIMENSION)top) {
            snprintf(s->err.message, sizeof s->err.message, "libjpeg could not skip %d rows", top);
            return -1;
        }
        while (done < height) {
            row = out + (size_t)done * pitch;
            if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
                snprintf(s->err.message, sizeof s->err.message, "libjpeg stopped at row %d", top + done);
                return -1;
            }
            done++;
        }
        return 0;
    }

    static const char* jpegregion_message(const jpegregion_state* s)
    {
        return s->err.message;
    }

    /* Frees everything libjpeg holds; rows below the region are never read. */
    static void jpegregion_destroy(jpegregion_state* s)
    {
        if (s->created)
            jpeg_destroy_decompress(&s->cinfo);
        s->created = 0;
    }
    """
    ctypedef struct jpegregion_state:
        pass
    int jpegregion_start(jpegregion_state* s, const unsigned char* data, size_t size, int scale_num,
                         int top, int height, int* left, int* width,
                         unsigned long long max_side, unsigned long long max_pixels) nogil
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
            rc = jpegregion_start(&state, src, size, scale_num, top, height, &left, &width, max_side, max_pixels)
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
