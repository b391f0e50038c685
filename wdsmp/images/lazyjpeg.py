"""A Pillow RGB image of a JPEG that decodes only what its first crop or resize reads.

``decode("pil")`` is mostly followed by a random crop (torchvision's
``RandomResizedCrop``: ``image.crop(box)`` then ``resize``, or ``resize(size,
box=box)``) that reads a part of the image. :class:`LazyJpegImage` knows the
image's size, mode and ``info`` from the header and holds the JPEG bytes; its
``crop`` and ``resize`` decode only the rows and columns Pillow's own
``crop``/``resize`` read, then run them, with the caller's arguments, on an
image of the whole size whose other pixels were never decoded (NOTE [region
geometry]); any other use of the pixels decodes the whole image as
``decode("pil")`` always has, after which the object *is* a plain
``PIL.Image.Image`` (its class is switched), holding no JPEG bytes.

NOTE [region geometry]: the region is decoded by libjpeg-turbo
(``wdsmp.native._jpegregion.decode_region_into``) into an ``H x W x 4`` array laid
out as a whole decode lays out its pixels (RGBX, Pillow's memory for an RGB
image), each pixel at its own place, so Pillow computes its filter
coefficients and bounds exactly as it does on the whole image: the result is
the same by construction, as long as Pillow reads only decoded pixels. Its
resampling (``Resample.c``) reads, per output pixel, the input pixels within
the filter's support times the downscale factor of the pixel's centre
(``precompute_coeffs``), its nearest-neighbour resize and ``crop`` only pixels
inside the box; :func:`resize_region` and :func:`crop_region` give those
pixels, with a margin. The region's pixels equal a whole decode's
(``decode_region_into`` widens the crop past the columns fancy upsampling
treats differently; the rows libjpeg-turbo skips are exact);
tests/test_lazyjpeg.py checks both against Pillow's own decode.

NOTE [damage past the region]: a region decode stops at the region's last row,
so it never sees damage in the data below it, where a whole decode (Pillow's,
webdataset's) would. libjpeg-turbo meets such damage in one of two ways: a
corrupt Huffman code or data ending early is a warning, after which it goes
on, so the rows above come out as in an undamaged file, the same in both; a
marker where image data should be (a corrupt byte makes 0xFF followed by
other than 0x00 or a restart marker) is an error Pillow raises. So only JPEGs
whose image data holds no such marker (:func:`one_clean_scan`, a native byte scan)
and whose tables libjpeg-turbo accepts when it starts decoding (damage there,
which ``PIL.Image.open`` does not read, fails every region and Pillow's
``load``) are lazy, and the region decoder refuses a region whose own data
warns (the whole decode then decides): a damaged file gives a region only
where Pillow gives the same pixels, and an error only where Pillow raises one.

What a caller can tell: ``type(image)`` is this class until the pixels are
first read (``isinstance(image, PIL.Image.Image)`` always holds), and so is
``repr``'s class name. A JPEG whose image data is damaged but holds no marker
decodes (its whole image, where Pillow would) when its pixels are first read;
the rare damage the marker scan cannot see that still makes libjpeg-turbo fail
is raised there, not by ``decode``. Needs Pillow 11.2 or later (images over shared memory, and
``Image.im`` a property, as it is since 11.0).
"""

import threading
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, SupportsIndex, Tuple, Union,
                    cast)

import PIL.Image

from ..native import core as native
from .size import MAX_PIXELS, MAX_SIDE

if TYPE_CHECKING:
    import numpy as np
    from PIL._imaging import ImagingCore, PixelAccess

__all__ = ["LazyJpegImage", "crop_region", "one_clean_scan", "resize_region"]

# Resampling filters and the support of their kernels (Pillow's Resample.c); others decode whole.
_SUPPORT: Dict[int, float] = {
    PIL.Image.Resampling.NEAREST: 0.0,
    PIL.Image.Resampling.BOX: 0.5,
    PIL.Image.Resampling.BILINEAR: 1.0,
    PIL.Image.Resampling.HAMMING: 1.0,
    PIL.Image.Resampling.BICUBIC: 2.0,
    PIL.Image.Resampling.LANCZOS: 3.0,
}
# Pixels added on each side to what the kernel's support reaches: Pillow rounds a bound half a
# pixel out, and its float centres may land a hair further.
_MARGIN = 2
# Regions are decoded while they add up to less than this share of the image; past it the whole
# image is decoded once. On the benchmark corpus a region of 75% of the image still took 0.93x a
# whole decode's time and one of 90% about as long (the rows above a region are entropy-decoded
# too), and several crops of one image must not cost more than one whole decode.
_REGION_SHARE = 0.75


# NOTE [threads]: threads may use one lazy image at once (two crops, a crop and np.asarray). Its
# switch to a plain image (pixels set, JPEG state dropped, class changed) happens under this lock,
# and whatever reads the JPEG state reads it under the lock, first checking the image is still
# lazy; the lock is never held while decoding (two threads may both decode the whole image: the
# first to finish switches it, the other's pixels, the same, are dropped).
_SWITCH = threading.Lock()


def one_clean_scan(data: Union[bytes, bytearray, memoryview]) -> bool:
    """Whether a JPEG's image data is one scan that runs from its only start-of-scan marker
    to the end-of-image marker that ends the file, with no other marker in it (NOTE [damage past
    the region]); False without the region decoder, whose ``find_marker`` scans the data."""
    module = native.jpeg_region_module()
    if module is None:
        return False
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte
            pos += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD9:  # no marker without a length belongs here
            return False
        elif marker == 0xDA:
            start = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
            return bytes(data[end - 2:]) == b"\xff\xd9" and module.find_marker(data, start, end - 2) < 0
        else:
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return False


def _box4(box: Any) -> Optional[Tuple[float, float, float, float]]:
    """``box`` as four floats, or None when it is not four real numbers."""
    try:
        x0, y0, x1, y1 = (float(v) for v in box)
    except (TypeError, ValueError):
        return None
    return x0, y0, x1, y1


def crop_region(size: Tuple[int, int], box: Optional[Sequence[float]]) -> Optional[Tuple[int, int, int, int]]:
    """``(top, left, bottom, right)``: the pixels ``Image.crop(box)`` of an image of ``size``
    reads (Pillow rounds the box, then copies the part inside the image); None when it reads
    none or the box is not one Pillow takes."""
    box = _box4(box)
    if box is None or box[2] < box[0] or box[3] < box[1]:
        return None
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    width, height = size
    top, left, bottom, right = max(y0, 0), max(x0, 0), min(y1, height), min(x1, width)
    return (top, left, bottom, right) if top < bottom and left < right else None


def resize_region(size: Tuple[int, int], out_size: Iterable[Any], resample: Optional[int],
                  box: Optional[Sequence[float]]) -> Optional[Tuple[int, int, int, int]]:
    """``(top, left, bottom, right)``: a region holding every pixel ``Image.resize(out_size,
    resample, box)`` of an RGB image of ``size`` reads (NOTE [region geometry]); None for a
    call it cannot bound (no box, a filter of unknown support, arguments Pillow refuses)."""
    try:
        support = _SUPPORT.get(PIL.Image.Resampling.BICUBIC if resample is None else resample)
        out_width, out_height = (int(v) for v in out_size)
    except (TypeError, ValueError):  # Pillow's own resize says what is wrong
        return None
    box = _box4(box) if box is not None else None
    if support is None or box is None or out_width < 1 or out_height < 1:
        return None
    x0, y0, x1, y1 = box
    width, height = size
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        return None
    reach_x = support * max((x1 - x0) / out_width, 1.0) + _MARGIN
    reach_y = support * max((y1 - y0) / out_height, 1.0) + _MARGIN
    return (max(int(y0 - reach_y), 0), max(int(x0 - reach_x), 0),
            min(int(y1 + reach_y) + 1, height), min(int(x1 + reach_x) + 1, width))


class LazyJpegImage(PIL.Image.Image):
    """An RGB image of a baseline JPEG whose pixels are decoded when first read: regions for
    ``crop`` and ``resize``, the whole image (by ``whole()``, which returns the image
    ``decode("pil")`` gives) for anything else, after which this is a plain image."""

    def __init__(self, jpeg: bytes, size: Tuple[int, int], info: Dict[Union[str, Tuple[int, int]], Any],
                 whole: Callable[[], PIL.Image.Image]) -> None:
        super().__init__()
        self._mode, self._size, self.info = "RGB", cast(Tuple[int, int], tuple(size)), info
        self.readonly = 1  # as the whole decode's image over shared memory: an in-place change copies
        self._jpeg, self._whole, self._region_pixels = jpeg, whole, 0

    # -- the whole image: any use of the pixels but crop and resize --------------------------
    @property
    def im(self) -> "ImagingCore":
        _decode_whole(self)
        return self.im

    @im.setter
    def im(self, im: "ImagingCore") -> None:
        _become_plain(self)
        self.im = im

    def load(self) -> Optional["PixelAccess"]:
        _decode_whole(self)
        return self.load()

    def close(self) -> None:
        _become_plain(self)
        self.close()

    def __eq__(self, other: object) -> bool:
        if other.__class__ not in (PIL.Image.Image, LazyJpegImage):
            return False  # as Pillow's __eq__ says, without decoding
        self.load()
        cast(PIL.Image.Image, other).load()
        return self == other

    __hash__ = None  # type: ignore[assignment]  # unhashable, as Pillow's images are

    def __reduce_ex__(self, protocol: SupportsIndex) -> Union[str, Tuple[Any, ...]]:
        self.load()  # pickles as the plain image it becomes
        return self.__reduce_ex__(protocol)

    # -- regions -----------------------------------------------------------------------------
    def crop(self, box: Optional[Tuple[float, float, float, float]] = None) -> PIL.Image.Image:
        """Pillow's ``crop``, decoding only the pixels inside ``box``."""
        region = None if box is None else crop_region(self.size, box)
        partial = _partial(self, region)
        if partial is None:
            self.load()
            return self.crop(box)
        return PIL.Image.Image.crop(partial, box)

    def resize(self, size: Union[Tuple[int, int], List[int], "np.ndarray"], resample: Optional[int] = None,
               box: Optional[Tuple[float, float, float, float]] = None,
               reducing_gap: Optional[float] = None) -> PIL.Image.Image:
        """Pillow's ``resize``, decoding only the pixels its filter reads around ``box``."""
        region = None if reducing_gap is not None else resize_region(self.size, size, resample, box)
        partial = _partial(self, region)
        if partial is None:
            self.load()
            return self.resize(size, resample, box, reducing_gap)
        return PIL.Image.Image.resize(partial, size, resample, box, reducing_gap)


# A lazy image's state is read and switched by these functions, not its methods: another thread
# may switch its class to the plain one between a method's lookup and its call (NOTE [threads]).

def _decode_whole(image: PIL.Image.Image) -> None:
    """Decode ``image`` whole and make it the plain image it is, unless it already is one."""
    with _SWITCH:
        whole = image._whole if type(image) is LazyJpegImage else None
    if whole is not None:
        _become_plain(image, whole())


def _become_plain(image: PIL.Image.Image, decoded: Optional[PIL.Image.Image] = None) -> None:
    """Make lazy ``image`` a plain image over ``decoded``'s pixels, or over none yet (closing, or
    given new ones); nothing when another thread already made it plain."""
    with _SWITCH:
        if type(image) is not LazyJpegImage:
            return
        if decoded is not None:  # the pixels first: a plain image is never without them
            image._im, image.readonly = decoded.im, decoded.readonly
        del image._jpeg, image._whole, image._region_pixels
        image.__class__ = PIL.Image.Image  # type: ignore[assignment]  # the switch to a plain image


def _partial(image: PIL.Image.Image, region: Optional[Tuple[int, int, int, int]]) -> Optional[PIL.Image.Image]:
    """A plain image of lazy ``image``'s size and ``info`` with ``region`` decoded, the rest never
    written (NOTE [region geometry]); None to decode the whole image instead."""
    if region is None:
        return None
    top, left, bottom, right = region
    width, height = image.size
    pixels = (bottom - top) * (right - left)
    with _SWITCH:
        if type(image) is not LazyJpegImage or image._region_pixels + pixels > _REGION_SHARE * width * height:
            return None
        image._region_pixels += pixels  # counted now, so that threads at once keep to the share too
        jpeg = image._jpeg
    module = native.jpeg_region_module()
    if module is None:
        return None
    import numpy as np

    memory = np.empty((height, width, 4), np.uint8)
    try:
        _, decoded = module.decode_region_into(jpeg, memory, top, left, bottom - top, right - left,
                                               max_side=MAX_SIDE, max_pixels=MAX_PIXELS)
    except ValueError:  # whatever libjpeg-turbo refuses here, the whole decode decides
        return None
    with _SWITCH:
        if type(image) is LazyJpegImage:
            image._region_pixels += (bottom - top) * decoded - pixels  # the columns decoded
    partial = native.pil_image_module().pil_image(memory, "RGB")
    if partial is None:
        return None
    partial.info = image.info
    return partial
