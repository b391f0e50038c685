/* The filter passes of wdsmp._imgops (see imgops_kernels.h). On x86-64 Linux the hot ones
   are built twice, for AVX2 and for the baseline, and target_clones picks one per CPU when
   the module loads; elsewhere they are plain C. Built with -ffp-contract=off like the rest
   of the extension (setup.py), though only integer arithmetic is done here. */
#include "imgops_kernels.h"

#include <string.h>
#if defined(__SSE2__)
#  include <emmintrin.h>
#endif

#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#  if __has_attribute(target_clones)
#    define IMGOPS_CLONES __attribute__((target_clones("avx2", "default")))
#  endif
#endif
#ifndef IMGOPS_CLONES
#  define IMGOPS_CLONES
#endif

/* Taps are taken in pairs so acc[] is read and written half as often. */
IMGOPS_CLONES void imgops_vertical(const uint8_t* src, ptrdiff_t stride, int n, int count,
                                   const int16_t* w, int32_t* acc, int16_t* row)
{
    int j, k;
    const int32_t w0 = w[0];
    if (count >= 2) {
        const uint8_t* s0 = src;
        const uint8_t* s1 = src + stride;
        const int32_t w1 = w[1];
        for (j = 0; j < n; j++) acc[j] = 64 + w0 * s0[j] + w1 * s1[j];
        k = 2;
    } else {
        for (j = 0; j < n; j++) acc[j] = 64 + w0 * src[j];
        k = 1;
    }
    for (; k + 1 < count; k += 2) {
        const uint8_t* s0 = src + k * stride;
        const uint8_t* s1 = s0 + stride;
        const int32_t a = w[k], b = w[k + 1];
        for (j = 0; j < n; j++) acc[j] += a * s0[j] + b * s1[j];
    }
    if (k < count) {
        const uint8_t* s0 = src + k * stride;
        const int32_t a = w[k];
        for (j = 0; j < n; j++) acc[j] += a * s0[j];
    }
    for (j = 0; j < n; j++) row[j] = (int16_t)(acc[j] >> 7);
}

/* An accumulated sum with 21 fractional bits as a pixel value. */
static inline uint8_t imgops_clip(int32_t a)
{
    a >>= 21;
    return (uint8_t)(a < 0 ? 0 : (a > 255 ? 255 : a));
}

/* A fixed number of taps per pixel, so the loop branches alike for every pixel. */
void imgops_horizontal(const int16_t* row, int channels, int out_w, int stride,
                       const int* first, const int16_t* w, uint8_t* out)
{
    for (int x = 0; x < out_w; x++) {
        const int16_t* wx = w + (ptrdiff_t)x * stride;
        const int16_t* p = row + (ptrdiff_t)first[x] * channels;
        int32_t a0 = 1 << 20, a1 = 1 << 20, a2 = 1 << 20;
        if (channels == 3) {
            for (int k = 0; k < stride; k++, p += 3) {
                a0 += wx[k] * p[0];
                a1 += wx[k] * p[1];
                a2 += wx[k] * p[2];
            }
            out[3 * x] = imgops_clip(a0);
            out[3 * x + 1] = imgops_clip(a1);
            out[3 * x + 2] = imgops_clip(a2);
        } else {
            for (int k = 0; k < stride; k++)
                a0 += wx[k] * p[k];
            out[x] = imgops_clip(a0);
        }
    }
}

#if defined(__SSE2__)
/* One RGB pixel, two taps per multiply-add: [R_k R_k+1 G_k G_k+1 B_k B_k+1 . .] x [w_k w_k+1]. */
static inline __m128i imgops_pixel3(const int16_t* p, const int16_t* w, int stride)
{
    __m128i a = _mm_set1_epi32(1 << 20);
    for (int k = 0; k < stride; k += 2) {
        int32_t pair;
        memcpy(&pair, w + k, sizeof pair);
        __m128i u = _mm_loadl_epi64((const __m128i*)(p + 3 * k));
        __m128i v = _mm_loadl_epi64((const __m128i*)(p + 3 * k + 3));
        a = _mm_add_epi32(a, _mm_madd_epi16(_mm_unpacklo_epi16(u, v), _mm_set1_epi32(pair)));
    }
    return _mm_srai_epi32(a, 21);
}

/* Four pixels packed at once, each stored as 4 bytes whose last byte the next pixel
   overwrites (the row's last pixel is stored as 3). */
IMGOPS_CLONES void imgops_horizontal3(const int16_t* row, int out_w, int stride,
                                      const int* first, const int16_t* w, uint8_t* out)
{
    int x = 0;
    int32_t v;
    for (; x + 4 < out_w; x += 4) {
        const int16_t* wx = w + (ptrdiff_t)x * stride;
        __m128i a0 = imgops_pixel3(row + 3 * first[x], wx, stride);
        __m128i a1 = imgops_pixel3(row + 3 * first[x + 1], wx + stride, stride);
        __m128i a2 = imgops_pixel3(row + 3 * first[x + 2], wx + 2 * stride, stride);
        __m128i a3 = imgops_pixel3(row + 3 * first[x + 3], wx + 3 * stride, stride);
        __m128i b = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
        uint8_t* o = out + 3 * x;
        v = _mm_cvtsi128_si32(b);
        memcpy(o, &v, 4);
        v = _mm_cvtsi128_si32(_mm_srli_si128(b, 4));
        memcpy(o + 3, &v, 4);
        v = _mm_cvtsi128_si32(_mm_srli_si128(b, 8));
        memcpy(o + 6, &v, 4);
        v = _mm_cvtsi128_si32(_mm_srli_si128(b, 12));
        memcpy(o + 9, &v, 4);
    }
    for (; x < out_w; x++) {
        __m128i a = imgops_pixel3(row + 3 * first[x], w + (ptrdiff_t)x * stride, stride);
        __m128i b = _mm_packs_epi32(a, a);
        v = _mm_cvtsi128_si32(_mm_packus_epi16(b, b));
        memcpy(out + 3 * x, &v, 3);
    }
}
#else
void imgops_horizontal3(const int16_t* row, int out_w, int stride,
                        const int* first, const int16_t* w, uint8_t* out)
{
    imgops_horizontal(row, 3, out_w, stride, first, w, out);
}
#endif
