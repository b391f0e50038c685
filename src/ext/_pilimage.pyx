# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Native: a Pillow image over pixels decoded elsewhere, without copying them.

Pillow (11.2 and later) builds an image over memory exported through the
Arrow C data interface (``PIL.Image.fromarrow``), keeping the exporter's
memory alive until the image is gone. An ``RGB`` image's pixels are four
bytes in Pillow (red, green, blue, and a pad byte Pillow's own decoders set
to 255), which is libjpeg-turbo's ``RGBX`` output: a JPEG decoded as
``RGBX`` into a numpy array becomes an image with no copy and no unpacking,
byte for byte what Pillow's own JPEG decoder makes. ``L`` images are one byte
a pixel.

The pure-Python twin is ``wdsmp/native/pilimage_py.py`` (``PIL.Image.frombytes``: the
same image, copied).

NOTE [arrow export]: ``__arrow_c_array__`` returns two capsules, named
``arrow_schema`` and ``arrow_array``, each owning a malloc'ed struct that the
capsule frees when it is collected. What the struct points to (its child and
buffer lists, and for the array a reference to the numpy array) is a separate
block in ``private_data``, freed by ``release``: a consumer may move the
struct out of its capsule (copy it, and mark the capsule's copy released), as
Pillow does with the array, and call ``release`` on its copy when the image's
memory goes; a capsule still holding an unreleased struct releases it itself.
``release`` may be called without the GIL, so it takes it before dropping the
reference.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free

import numpy as np

# The Arrow C data interface (an ABI: https://arrow.apache.org/docs/format/CDataInterface.html).
cdef struct ArrowSchema:
    const char* format
    const char* name
    const char* metadata
    int64_t flags
    int64_t n_children
    ArrowSchema** children
    ArrowSchema* dictionary
    void (*release)(ArrowSchema*) noexcept nogil
    void* private_data

cdef struct ArrowArray:
    int64_t length
    int64_t null_count
    int64_t offset
    int64_t n_buffers
    int64_t n_children
    const void** buffers
    ArrowArray** children
    ArrowArray* dictionary
    void (*release)(ArrowArray*) noexcept nogil
    void* private_data

# What a schema's or an array's release frees: its child and buffer lists (and for an array the
# reference to the pixels). Apart from the struct itself, which a consumer may move elsewhere.
cdef struct SchemaPrivate:
    ArrowSchema child
    ArrowSchema* children[1]

cdef struct ArrayPrivate:
    PyObject* owner
    ArrowArray child
    ArrowArray* children[1]
    const void* buffers[2]
    const void* child_buffers[2]


cdef void _release_child_schema(ArrowSchema* schema) noexcept nogil:
    schema.release = NULL  # freed with its parent's SchemaPrivate


cdef void _release_schema(ArrowSchema* schema) noexcept nogil:
    cdef SchemaPrivate* private = <SchemaPrivate*>schema.private_data
    schema.release = NULL
    if private != NULL:
        if private.child.release != NULL:
            private.child.release(&private.child)
        free(private)
        schema.private_data = NULL


cdef void _release_child_array(ArrowArray* array) noexcept nogil:
    array.release = NULL  # freed with its parent's ArrayPrivate


cdef void _release_array(ArrowArray* array) noexcept nogil:
    cdef ArrayPrivate* private = <ArrayPrivate*>array.private_data
    array.release = NULL
    if private != NULL:
        if private.child.release != NULL:
            private.child.release(&private.child)
        with gil:
            Py_XDECREF(private.owner)
        free(private)
        array.private_data = NULL


cdef void _schema_capsule_gone(object capsule) noexcept:
    cdef ArrowSchema* schema = <ArrowSchema*>PyCapsule_GetPointer(capsule, "arrow_schema")
    if schema.release != NULL:  # not moved out by a consumer
        schema.release(schema)
    free(schema)


cdef void _array_capsule_gone(object capsule) noexcept:
    cdef ArrowArray* array = <ArrowArray*>PyCapsule_GetPointer(capsule, "arrow_array")
    if array.release != NULL:
        array.release(array)
    free(array)


cdef object _schema(bint rgb):
    """An ``arrow_schema`` capsule: ``C`` (uint8), or for RGB ``+w:4`` (four uint8 a pixel)."""
    cdef ArrowSchema* schema = <ArrowSchema*>calloc(1, sizeof(ArrowSchema))
    cdef SchemaPrivate* private = NULL
    if schema == NULL:
        raise MemoryError()
    schema.name = b""
    schema.format = b"C"
    if rgb:
        private = <SchemaPrivate*>calloc(1, sizeof(SchemaPrivate))
        if private == NULL:
            free(schema)
            raise MemoryError()
        private.child.format = b"C"
        private.child.name = b""
        private.child.release = _release_child_schema
        private.children[0] = &private.child
        schema.format = b"+w:4"
        schema.n_children = 1
        schema.children = private.children
        schema.private_data = private
    schema.release = _release_schema
    try:
        return PyCapsule_New(schema, "arrow_schema", _schema_capsule_gone)
    except BaseException:
        _release_schema(schema)
        free(schema)
        raise


cdef object _array(object pixels, const uint8_t* data, int64_t npixels, bint rgb):
    """An ``arrow_array`` capsule over ``data``, holding a reference to ``pixels``."""
    cdef ArrowArray* array = <ArrowArray*>calloc(1, sizeof(ArrowArray))
    cdef ArrayPrivate* private = <ArrayPrivate*>calloc(1, sizeof(ArrayPrivate))
    if array == NULL or private == NULL:
        free(array)
        free(private)
        raise MemoryError()
    array.length = npixels
    if rgb:
        private.child.length = npixels * 4
        private.child.n_buffers = 2
        private.child_buffers[1] = data
        private.child.buffers = private.child_buffers
        private.child.release = _release_child_array
        private.children[0] = &private.child
        array.n_buffers = 1
        array.n_children = 1
        array.children = private.children
    else:
        array.n_buffers = 2
        private.buffers[1] = data
    array.buffers = private.buffers
    Py_INCREF(pixels)
    private.owner = <PyObject*>pixels
    array.private_data = private
    array.release = _release_array
    try:
        return PyCapsule_New(array, "arrow_array", _array_capsule_gone)
    except BaseException:
        _release_array(array)
        free(array)
        raise


cdef class _Pixels:
    """A C-contiguous uint8 array exported through the Arrow C data interface."""

    cdef object pixels
    cdef bint rgb

    def __cinit__(self, pixels, bint rgb):
        self.pixels, self.rgb = pixels, rgb

    def __arrow_c_array__(self, requested_schema=None):
        cdef const uint8_t[::1] flat = self.pixels.reshape(-1)
        npixels = flat.shape[0] // 4 if self.rgb else flat.shape[0]
        return _schema(self.rgb), _array(self.pixels, &flat[0], npixels, self.rgb)


def pil_image(pixels, mode):
    """A Pillow image of ``mode`` ``"RGB"`` (``pixels`` HxWx4 uint8, the fourth byte 255) or
    ``"L"`` (HxW uint8) over the array's memory, which it keeps alive; C-contiguous, not empty.
    None when Pillow cannot build images over shared memory (before 11.2)."""
    import PIL.Image

    if not hasattr(PIL.Image, "fromarrow"):
        return None
    rgb = _check(pixels, mode)
    return PIL.Image.fromarrow(_Pixels(pixels, rgb), mode, (pixels.shape[1], pixels.shape[0]))


def _check(pixels, mode):
    """Whether ``pixels`` are RGB; ValueError unless they suit ``mode``."""
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' or 'L', not {mode!r}")
    shape = (None, None, 4) if mode == "RGB" else (None, None)
    if (not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != len(shape)
            or (mode == "RGB" and pixels.shape[2] != 4) or not pixels.flags.c_contiguous or pixels.size == 0):
        raise ValueError(f"a {mode} image needs a C-contiguous, non-empty uint8 array of shape "
                         f"{'HxWx4' if mode == 'RGB' else 'HxW'}, not {getattr(pixels, 'dtype', type(pixels))} "
                         f"{getattr(pixels, 'shape', '')}")
    return mode == "RGB"
