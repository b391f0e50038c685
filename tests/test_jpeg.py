"""The one JPEG decode (wdsmp/images/jpeg.py) and the two paths that call it."""

import numpy as np
import pytest
import simplejpeg

from wdsmp import autodecode
from wdsmp.errors import DecodeError
from wdsmp.fast.imagedecode import decode_into
from wdsmp.images.jpeg import decode_jpeg, jpeg_header, scaled_size
from wdsmp.images.size import ImageTooLarge

from tests.bombs import progressive_jpeg_claiming


def _jpeg(height=64, width=96):
    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return simplejpeg.encode_jpeg(pixels, quality=90)


def test_the_header_gives_the_size_and_nothing_for_other_bytes():
    assert jpeg_header(_jpeg(), 1 << 20) == (64, 96)
    assert jpeg_header(b"\x89PNG\r\n\x1a\n" + bytes(32), 1 << 20) is None


@pytest.mark.parametrize("eighths, size", [(1, (8, 12)), (2, (16, 24)), (4, (32, 48)), (8, (64, 96))])
def test_a_scaled_decode_has_the_scaled_size(eighths, size):
    assert scaled_size(64, 96, eighths) == size
    assert decode_jpeg(_jpeg(), (64, 96), 1 << 20, "RGB", eighths).shape == size + (3,)


def test_the_budget_holds_the_decoded_size_not_the_source_size():
    data = _jpeg()
    assert decode_jpeg(data, (64, 96), 32 * 48, "RGB", 4).shape == (32, 48, 3)
    with pytest.raises(ImageTooLarge, match="the JPEG image"):
        decode_jpeg(data, (64, 96), 32 * 48, "RGB", 8)


def test_what_libjpeg_turbo_refuses_after_the_header_is_left_to_the_caller():
    data = _jpeg()
    damaged = data[:data.index(b"\xff\xda") + 20]  # the scan cut short, no end-of-image marker
    assert jpeg_header(damaged, 1 << 20) == (64, 96)
    assert decode_jpeg(damaged, (64, 96), 1 << 20) is None


def test_both_paths_refuse_a_progressive_bomb_before_decoding_with_the_same_words():
    bomb = progressive_jpeg_claiming(8000, 8000)
    budget = 1 << 22
    with pytest.raises(ImageTooLarge) as header:
        jpeg_header(bomb, budget)
    with pytest.raises(DecodeError) as loader:
        decode_into(bomb, np.empty((32, 32, 3), np.uint8), False, None, url="a.tar", member="k.jpg")
    assert "progressive" in str(header.value) and "progressive" in str(loader.value)
    with pytest.raises(ImageTooLarge, match="progressive"):
        autodecode.imagehandler("rgb8")(".jpg", bomb)
