/* libjpeg-turbo calls of wdsmp._jpegregion's decode_region (src/ext/_jpegregion.pyx), in C
   because libjpeg reports errors by longjmp: every libjpeg call is made here, below a
   setjmp in the same function, so no Cython or Python state is ever jumped over (NOTE
   [jpeg region errors] in _jpegregion.pyx). */
#ifndef WDSMP_JPEGREGION_H
#define WDSMP_JPEGREGION_H

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <jpeglib.h>

/* libjpeg's error manager, extended with where to jump and the message. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX + 80];
} jpegregion_error;

/* One decode; the caller zeroes it before jpegregion_start and always ends with
   jpegregion_destroy, whatever the calls between returned. */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    jpegregion_error err;
    int created;  /* jpeg_create_decompress was called: jpeg_destroy_decompress is due */
    int scaled_height, scaled_width;  /* the scaled image's size, before any crop */
} jpegregion_state;

/* Reads the header, checks it, and starts decompressing at scale_num/8 as RGB (rgbx: RGBX,
   four bytes a pixel), limited to the columns [*left, *left + *width) of the scaled image;
   libjpeg moves *left down to an iMCU boundary and widens *width to match (exact: the
   columns are first widened by one iMCU on each side that is not the image's edge, so
   that every column asked for equals a whole decode's). The rows [top, top + height) are
   only checked here. Returns 0, or -1 with the message set. */
int jpegregion_start(jpegregion_state* s, const unsigned char* data, size_t size,
                     int scale_num, int top, int height, int* left, int* width, int rgbx, int exact,
                     unsigned long long max_side, unsigned long long max_pixels);

/* After jpegregion_start: the scaled image's height and width, before any crop. */
void jpegregion_image_size(const jpegregion_state* s, int* height, int* width);

/* After jpegregion_start: skips to row top and decodes height rows into out (pitch
   bytes per row). Returns 0, or -1 with the message set. */
int jpegregion_read(jpegregion_state* s, int top, int height, unsigned char* out, size_t pitch);

/* Why the last call returned -1 (libjpeg's message or wdsmp's own). */
const char* jpegregion_message(const jpegregion_state* s);

/* Frees everything libjpeg holds, started or not; rows below the region are never read. */
void jpegregion_destroy(jpegregion_state* s);

#endif
