/* The two filter passes of wdsmp._imgops's crop_resize_flip (src/ext/_imgops.pyx), in C
   because the horizontal pass needs SSE2's multiply-add of int16 pairs and both are built
   per CPU (target_clones), neither of which Cython can express. The arithmetic is NOTE
   [resize arithmetic] in _imgops.pyx; the pure-Python twin does the same. */
#ifndef WDSMP_IMGOPS_KERNELS_H
#define WDSMP_IMGOPS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The vertical pass for one output row: row[j] = (sum_k w[k] src[k stride + j] + 64) >> 7
   for j < n, over count source rows stride bytes apart. acc is scratch for n int32. */
void imgops_vertical(const uint8_t* src, ptrdiff_t stride, int n, int count,
                     const int16_t* w, int32_t* acc, int16_t* row);

/* The horizontal pass for one output row of one or three channels, in plain C:
   out = (sum_k w[k] row[k] + 2^20) >> 21 clipped to 0..255. Output pixel x reads stride
   taps from w + x stride, starting at pixel first[x] of row. */
void imgops_horizontal(const int16_t* row, int channels, int out_w, int stride,
                       const int* first, const int16_t* w, uint8_t* out);

/* imgops_horizontal for three channels, with SSE2 where there is SSE2; the same pixels.
   stride must be even (taps are taken in pairs), and row must have room past its last
   pixel for one tap set more: the SSE2 loads read a little beyond the taps they use. */
void imgops_horizontal3(const int16_t* row, int out_w, int stride,
                        const int* first, const int16_t* w, uint8_t* out);

#endif
