"""Decompression bombs for the memory tests, and a child process to meet them in.

A bomb is made in a fraction of a second however much it claims: one deflate block of
zeros, flushed so that it refers to nothing before it, is repeated. The memory tests run
the reading in a child process whose address space is limited to what it has after
importing wdsmp plus a little, so that a bomb that gets through is a MemoryError there, not
gigabytes here; they check the error's text.
"""

import os
import struct
import subprocess
import sys
import textwrap
import zlib

_CHUNK = 16 << 20


def deflate_of_zeros(head, size):
    """A raw deflate stream (not finished) of ``head`` then ``size`` zero bytes (a multiple of 16 MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    start = packer.compress(head) + packer.flush(zlib.Z_FULL_FLUSH)
    zeros = packer.compress(bytes(_CHUNK)) + packer.flush(zlib.Z_FULL_FLUSH)
    return start + zeros * (size // _CHUNK)


def gzip_of_zeros(head, size, tail=b"", crc=False):
    """A gzip file of ``head``, ``size`` zero bytes and ``tail``; the trailer's CRC is not that
    of the content (computing it would read it all): only a reader that reads everything
    notices, and these tests refuse long before. ``crc=True`` for a reader that does read to
    the end (a sample count checks the CRC): the real one, at about 0.4 s a GiB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate_of_zeros(head, size) + packer.compress(tail) + packer.flush()
    length = (len(head) + size + len(tail)) & 0xFFFFFFFF
    checksum = 0
    if crc:
        checksum, zeros = zlib.crc32(head), bytes(_CHUNK)
        for _ in range(size // _CHUNK):
            checksum = zlib.crc32(zeros, checksum)
        checksum = zlib.crc32(tail, checksum)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + body + struct.pack("<II", checksum, length)


def run_limited(code, headroom=512 << 20, timeout=300):
    """Run ``code`` in a child Python whose address space may grow ``headroom`` bytes past
    what importing wdsmp, Pillow and simplejpeg took; ``(status, stdout + stderr)``."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        import pytest

        pytest.skip("under AddressSanitizer, which reserves terabytes of address space, no address-space "
                    "limit can be set; the plain build runs this test")
    preamble = textwrap.dedent(f"""\
        import resource, wdsmp, wdsmp.autodecode, wdsmp.fast.imagedecode, PIL.Image, simplejpeg
        _size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (_size + {headroom}, _size + {headroom}))
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-"], input=preamble + textwrap.dedent(code), capture_output=True,
                          text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr


def png_of_zeros(width, height):
    """A valid grayscale PNG of ``width x height`` black pixels, kilobytes for any size."""
    rows = 64
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = packer.compress(bytes((width + 1) * rows)) + packer.flush(zlib.Z_FULL_FLUSH)  # filter 0, zeros
    rest = packer.compress(bytes((width + 1) * (height % rows))) + packer.flush()
    checksum = 1
    for n in [rows] * (height // rows) + [height % rows]:
        checksum = zlib.adler32(bytes((width + 1) * n), checksum)
    idat = b"\x78\xda" + block * (height // rows) + rest + struct.pack(">I", checksum)

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def webp_of_zeros(width, height):
    """A lossless WebP of ``width x height`` black pixels in 28 bytes: every prefix code has
    one symbol, so each pixel takes no bits at all."""
    bits = []

    def put(value, n):
        bits.extend((value >> i) & 1 for i in range(n))

    put(width - 1, 14)
    put(height - 1, 14)
    put(0, 4)  # no alpha, version 0
    put(0, 3)  # no transform, no colour cache, no meta prefix codes
    for _ in range(5):  # green, red, blue, alpha, distance: simple codes of one 1-bit symbol, 0
        put(0b0001, 4)
    bits.extend([0] * (-len(bits) % 8))
    body = b"\x2f" + bytes(sum(b << i for i, b in enumerate(bits[k:k + 8])) for k in range(0, len(bits), 8))
    body += b"\0" * (len(body) % 2)
    chunk = b"VP8L" + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def _progressive_jpeg(width, height, seed=0):
    """A progressive JPEG (Pillow's: 10 scans) of noise."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    stream = io.BytesIO()
    Image.fromarray(pixels).save(stream, "JPEG", progressive=True, quality=85)
    return stream.getvalue()


def progressive_jpeg_claiming(width, height):
    """A small progressive JPEG whose frame header (SOF2) claims ``width x height``: libjpeg-turbo
    allocates coefficients for the whole claim before it reads a scan."""
    data = _progressive_jpeg(64, 48)
    at = data.index(b"\xff\xc2")
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


def progressive_jpeg_with_repeated_scans(extra, width=512, height=512):
    """A valid progressive JPEG with its last scan repeated ``extra`` more times before the
    end-of-image marker: each repeat is decoded in full, at a few bytes of file each."""
    data = _progressive_jpeg(width, height)
    last = data.rindex(b"\xff\xda")
    return data[:-2] + data[last:-2] * extra + data[-2:]
