"""Images, before and while they are decoded.

``size`` reads an image's size from its header and enforces the pixel budget before any pixel
is decoded; ``jpeg`` is the one JPEG decode, under that budget, that both image paths call;
``lazyjpeg`` gives a Pillow image that decodes only what its first crop needs;
``specdecode`` decodes image bytes as an ``autodecode`` image spec says; ``decoded`` is the torch
dataset that ``Decoder(...)(dataset)`` returns. Used by :mod:`wdsmp.autodecode` and by
FastLoader's image decoding.
"""
