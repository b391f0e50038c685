/* wdsmp._jpegregion's libjpeg-turbo calls (see jpegregion.h). Errors: libjpeg's error_exit
   is replaced by one that formats the message and longjmps back to the setjmp at the top
   of the function that made the call, which returns -1. */
#include "jpegregion.h"

#include <string.h>

/* Must not return: jumps back to the setjmp of the call under way (see above). */
static void jpegregion_error_exit(j_common_ptr cinfo)
{
    jpegregion_error* err = (jpegregion_error*)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Level -1 is a warning about corrupt data, an error here (damaged files go to the caller's
   fallback decoder, as with simplejpeg); trace messages (levels >= 0) are dropped. */
static void jpegregion_emit_message(j_common_ptr cinfo, int level)
{
    if (level < 0)
        jpegregion_error_exit(cinfo);
}

int jpegregion_start(jpegregion_state* s, const unsigned char* data, size_t size,
                     int scale_num, int top, int height, int* left, int* width, int rgbx, int exact,
                     unsigned long long max_side, unsigned long long max_pixels)
{
    struct jpeg_decompress_struct* cinfo = &s->cinfo;
    jpeg_component_info* comp;
    JDIMENSION xoffset, xwidth;
    int ci, k, h, v, imcu, right;
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
    /* grayscale sources are expanded by libjpeg-turbo; RGBX's fourth byte is 255 */
    cinfo->out_color_space = rgbx ? JCS_EXT_RGBX : JCS_RGB;
    cinfo->scale_num = (unsigned)scale_num;
    cinfo->scale_denom = 8;
    cinfo->dct_method = JDCT_ISLOW;  /* simplejpeg's defaults: accurate IDCT, fancy upsampling */
    cinfo->do_fancy_upsampling = TRUE;
    jpeg_calc_output_dimensions(cinfo);
    s->scaled_height = (int)cinfo->output_height;
    s->scaled_width = (int)cinfo->output_width;
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
    if (cinfo->output_components != (rgbx ? 4 : 3)) {
        snprintf(s->err.message, sizeof s->err.message, "libjpeg gave %d channels, not %s",
                 cinfo->output_components, rgbx ? "RGBX" : "RGB");
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
    /* Fancy upsampling may make the first and last column of a cropped row differ from a whole
       decode's: exact widens the crop by one iMCU on each side that is not the image's edge, so
       that both lie outside the columns asked for. */
    if (exact) {
#if JPEG_LIB_VERSION >= 70
        imcu = cinfo->max_h_samp_factor * cinfo->min_DCT_h_scaled_size;
#else
        imcu = cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
#endif
        right = *left + *width + imcu;
        *left = *left > imcu ? *left - imcu : 0;
        *width = (right < (int)cinfo->output_width ? right : (int)cinfo->output_width) - *left;
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

int jpegregion_read(jpegregion_state* s, int top, int height, unsigned char* out, size_t pitch)
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

void jpegregion_image_size(const jpegregion_state* s, int* height, int* width)
{
    *height = s->scaled_height;
    *width = s->scaled_width;
}

const char* jpegregion_message(const jpegregion_state* s)
{
    return s->err.message;
}

void jpegregion_destroy(jpegregion_state* s)
{
    if (s->created)
        jpeg_destroy_decompress(&s->cinfo);
    s->created = 0;
}
