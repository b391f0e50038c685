# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Native image kernel: resize a sub-pixel crop box, optionally mirrored, straight into an output row.

The pure-Python twin is ``wdsmp/native/imgops_py.py``: the same filter taps (the
same double arithmetic, see ``-ffp-contract=off`` in setup.py) and the same
integer arithmetic afterwards, so both give the same pixels.

NOTE [resize arithmetic]: a separable triangle filter whose support widens by
the scale factor when shrinking (Pillow's BILINEAR with ``reducing_gap=None``).
Each axis gets fixed-point taps: ``first[i]`` and ``stride`` int16 weights,
zero-padded to an even stride, each the step between rounded running sums of
the exact weights: none is negative and they sum to exactly ``1 << 14``, so a
flat image stays flat and no sum below can overflow, whatever the scale. The vertical pass runs first, one output row at a time: ``row = (sum w *
src + 64) >> 7`` (int16, 7 fractional bits); the horizontal pass then gives
``out = (sum w * row + (1 << 20)) >> 21``. Vertical first because its inner
loop runs over contiguous bytes and vectorises, and because it leaves the
costlier horizontal pass only ``out_h`` rows to filter instead of every source
row of the box; the intermediate is one row, which stays in L1.

The two passes are C (``imgops_kernels.c``), not Cython: the horizontal pass
needs SSE2's multiply-add of int16 pairs (two taps of one RGB pixel per
instruction), and on x86-64 Linux both are built twice, for AVX2 and for the
baseline, with ``target_clones`` choosing one per CPU when the module loads;
Cython can express neither. Elsewhere they are plain C.
"""

from libc.math cimport ceil, floor
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int16_t, int32_t, uint8_t
from libc.stdlib cimport calloc, free, malloc

cdef extern from "imgops_kernels.h":
    void imgops_vertical(const uint8_t* src, ptrdiff_t stride, int n, int count,
                         const int16_t* w, int32_t* acc, int16_t* row) nogil
    void imgops_horizontal(const int16_t* row, int channels, int out_w, int stride,
                           const int* first, const int16_t* w, uint8_t* out) nogil
    void imgops_horizontal3(const int16_t* row, int out_w, int stride,
                            const int* first, const int16_t* w, uint8_t* out) nogil

cdef enum:
    WBITS = 14  # a tap set's weights sum to 1 << WBITS


cdef int _taps(int in_size, double in0, double length, int out_size, int bound, bint reverse,
               int* first, int* count, double* k, int16_t* weights) noexcept nogil:
    """Fixed-point taps of one axis (NOTE [resize arithmetic]); returns their stride.

    ``k`` is scratch for ``out_size * bound`` doubles, ``weights`` room for as
    many int16. Output ``i``'s taps land at ``out_size - 1 - i`` when ``reverse``.
    """
    cdef double scale = length / out_size
    cdef double support = scale if scale > 1.0 else 1.0
    cdef double ss = 1.0 / support
    cdef double center, total, cum, d
    cdef double* ki
    cdef int16_t* wi
    cdef int i, j, lo, hi, n, r, cur, prev, stride = 0
    for i in range(out_size):
        center = in0 + (i + 0.5) * scale
        lo = <int>floor(center - support + 0.5)
        if lo < 0:
            lo = 0
        hi = <int>floor(center + support + 0.5)
        if hi > in_size:
            hi = in_size
        n = hi - lo
        ki = k + i * bound
        for j in range(n):
            d = (j + lo - center + 0.5) * ss
            if d < 0:
                d = -d
            ki[j] = 1.0 - d if d < 1.0 else 0.0
        first[i] = lo
        count[i] = n
        if n > stride:
            stride = n
    stride += stride & 1  # the SSE2 pass takes taps in pairs
    for i in range(out_size):
        r = out_size - 1 - i if reverse else i
        ki = k + i * bound
        wi = weights + r * stride
        n = count[i]
        total = 0.0
        for j in range(n):
            total += ki[j]
        # Each weight is the step between rounded running sums: never negative, and
        # the last sum is total / total, so they add up to exactly 1 << WBITS.
        cum = 0.0
        prev = 0
        for j in range(stride):
            if j < n:
                cum += ki[j]
                cur = <int>floor(cum / total * (1 << WBITS) + 0.5)
                wi[j] = <int16_t>(cur - prev)
                prev = cur
            else:
                wi[j] = 0
    if reverse:
        for i in range(out_size // 2):
            lo = first[i]
            first[i] = first[out_size - 1 - i]
            first[out_size - 1 - i] = lo
            n = count[i]
            count[i] = count[out_size - 1 - i]
            count[out_size - 1 - i] = n
    return stride


def crop_resize_flip(const uint8_t[:, :, ::1] src not None, double y0, double x0, double h, double w,
                     uint8_t[:, :, ::1] out not None, bint flip=False):
    """Resize the box ``(y0, x0, h, w)`` of ``src`` (source pixels, sub-pixel) to fill ``out``.

    Antialiased when shrinking, bilinear when enlarging (NOTE [resize
    arithmetic]); ``flip`` mirrors the result left to right. Taps near the
    box's edges may read pixels just outside it (never outside the image), as
    a crop of a resized image would. ``src`` and ``out`` are C-contiguous
    HxWxC uint8 arrays with the same C, 1 or 3; ``out`` may be a view into
    shared memory. The GIL is released while it runs.
    """
    cdef int in_h = src.shape[0], in_w = src.shape[1], channels = src.shape[2]
    cdef int out_h = out.shape[0], out_w = out.shape[1]
    if channels != 1 and channels != 3:
        raise ValueError(f"src has {channels} channels; 1 or 3 are supported")
    if out.shape[2] != channels:
        raise ValueError(f"out has {out.shape[2]} channels, src has {channels}")
    if in_h == 0 or in_w == 0 or out_h == 0 or out_w == 0:
        raise ValueError(f"empty image: src is {in_h}x{in_w}, out is {out_h}x{out_w}")
    if not (h > 0 and w > 0):
        raise ValueError(f"crop box size {h}x{w} is not positive")
    if not (y0 >= 0 and x0 >= 0 and y0 + h <= in_h and x0 + w <= in_w):
        raise ValueError(f"crop box (y0={y0}, x0={x0}, h={h}, w={w}) is not inside the {in_h}x{in_w} image")
    # Most taps an output pixel can have: 2 ceil(support) + 1 (+1 to pad to even).
    cdef int by = 2 * <int>ceil(h / out_h if h > out_h else 1.0) + 2
    cdef int bx = 2 * <int>ceil(w / out_w if w > out_w else 1.0) + 2
    cdef const uint8_t* s = &src[0, 0, 0]
    cdef uint8_t* o = &out[0, 0, 0]
    cdef Py_ssize_t pitch = <Py_ssize_t>in_w * channels
    cdef int* fy = <int*>malloc(2 * <size_t>out_h * sizeof(int))
    cdef int* fx = <int*>malloc(2 * <size_t>out_w * sizeof(int))
    cdef double* k = <double*>malloc((<size_t>out_h * by + <size_t>out_w * bx) * sizeof(double))
    cdef int16_t* wy = <int16_t*>malloc(<size_t>out_h * by * sizeof(int16_t))
    cdef int16_t* wx = <int16_t*>malloc(<size_t>out_w * bx * sizeof(int16_t))
    cdef int32_t* acc = <int32_t*>malloc(pitch * sizeof(int32_t))
    # Room for the horizontal pass's zero-weight reads past the last pixel.
    cdef int16_t* row = <int16_t*>calloc(pitch + (<size_t>bx + 2) * channels, sizeof(int16_t))
    cdef int sy, sx, xlo, n, x, yy
    try:
        if not (fy and fx and k and wy and wx and acc and row):
            raise MemoryError()
        with nogil:
            sy = _taps(in_h, y0, h, out_h, by, False, fy, fy + out_h, k, wy)
            sx = _taps(in_w, x0, w, out_w, bx, flip, fx, fx + out_w, k + <size_t>out_h * by, wx)
            # The vertical pass covers only the columns the horizontal taps read.
            xlo = fx[out_w - 1] if flip else fx[0]
            n = (fx[0] + fx[out_w]) if flip else (fx[out_w - 1] + fx[2 * out_w - 1])
            n -= xlo
            for x in range(out_w):
                fx[x] -= xlo
            for yy in range(out_h):
                imgops_vertical(s + fy[yy] * pitch + <Py_ssize_t>xlo * channels, pitch, n * channels,
                                fy[out_h + yy], wy + yy * sy, acc, row)
                if channels == 3:
                    imgops_horizontal3(row, out_w, sx, fx, wx, o + <Py_ssize_t>yy * out_w * 3)
                else:
                    imgops_horizontal(row, 1, out_w, sx, fx, wx, o + <Py_ssize_t>yy * out_w)
    finally:
        free(fy)
        free(fx)
        free(k)
        free(wy)
        free(wx)
        free(acc)
        free(row)
