"""Synthetic photograph-like images, made in a moment from a seed: no files, no scikit-image.

For the image kernels' tests, their benchmark and the JPEG fuzz target's seeds:
1/f noise over several octaves, hard-edged discs and grain, so that resizing
meets edges and texture as well as smooth areas, and every DCT coefficient of
a JPEG matters (noise alone or gradients alone decode at unrealistic speeds).
The benchmark corpus (``make_corpus.py``) uses real photographs instead.
"""

import numpy as np
import PIL.Image

__all__ = ["photo"]


def photo(height, width, seed=0):
    """A photograph-like ``(height, width, 3)`` uint8 image, the same for the same seed."""
    rng = np.random.default_rng(seed)
    image = np.zeros((height, width, 3))
    for cell in (64, 16, 4):
        small = rng.random((height // cell + 2, width // cell + 2, 3)).astype(np.float32)
        layer = np.stack([np.asarray(PIL.Image.fromarray(small[:, :, c], "F").resize(
            (width, height), PIL.Image.BICUBIC)) for c in range(3)], axis=2)
        image += layer * cell
    image = image / image.max() * 200
    yy, xx = np.mgrid[:height, :width]
    for _ in range(4):
        cy, cx, r = rng.random() * height, rng.random() * width, rng.random() * min(height, width) / 3
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.random(3) * 255
    image += rng.normal(0, 4, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)
