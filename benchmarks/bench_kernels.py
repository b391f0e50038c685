"""Per-image cost of FastLoader's image step: the crop/resize/flip kernel (native,
twin, Pillow), JPEG decoding at each libjpeg-turbo DCT scale, and ``decode_into``
with and without the JPEG region decoder (whole JPEG vs only the crop's rows
and columns, on the same boxes).

Single-threaded, so the figures are per core. Each figure is the best of
``--rounds`` rounds of ``--repeat`` calls, the contenders interleaved, so the
ratios hold on a busy machine. The images are synthetic, photograph-like
(1/f noise, hard edges, grain) unless ``--image`` names real ones; ``--corpus``
adds the mean over the first images of a corpus from ``make_corpus.py``. Usage::

    python benchmarks/bench_kernels.py [--rounds 30] [--repeat 10] [--image photo.jpg ...]
        [--corpus DIR [--corpus-images 500] [--corpus-boxes 2]]
"""

import argparse
import glob
import io
import os
import random
import sys
import tarfile
import time

import numpy as np
import PIL.Image
import simplejpeg

from wdsmp.native import imgops_py as _imgops_py
from wdsmp.fast.imagedecode import decode_into
from wdsmp.native.core import imgops_module, jpeg_region_available, native_available

from photos import photo  # beside this script

OUT = (224, 224)


def jpeg_bytes(pixels, quality=95):
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def best_us(fns, rounds, repeat):
    """Best per-call microseconds of each ``name: fn``, interleaved over rounds."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / repeat * 1e6)
    return best


def kernel_table(rounds, repeat):
    src = photo(500, 450)
    image = PIL.Image.fromarray(src)
    out = np.empty(OUT + (3,), np.uint8)
    native = imgops_module().crop_resize_flip
    cases = [
        ("400x350 crop -> 224x224 (shrink 1.8x)", (37.25, 12.5, 400.0, 350.0)),
        ("whole 500x450 -> 224x224 (shrink 2.2x)", (0.0, 0.0, 500.0, 450.0)),
        ("150x120 crop -> 224x224 (enlarge 1.6x)", (100.0, 80.0, 150.0, 120.0)),
    ]
    print("| case | native µs | twin µs | Pillow µs | Pillow / native |")
    print("|---|---:|---:|---:|---:|")
    for name, (y0, x0, h, w) in cases:
        best = best_us({
            "native": lambda: native(src, y0, x0, h, w, out, True),
            "twin": lambda: _imgops_py.crop_resize_flip(src, y0, x0, h, w, out, True),
            "pillow": lambda: image.resize(OUT[::-1], PIL.Image.BILINEAR, box=(x0, y0, x0 + w, y0 + h),
                                           reducing_gap=None).transpose(PIL.Image.FLIP_LEFT_RIGHT),
        }, rounds, repeat)
        print(f"| {name} | {best['native']:.0f} | {best['twin']:.0f} | {best['pillow']:.0f} | "
              f"{best['pillow'] / best['native']:.1f}x |")


def decode_table(images, rounds, repeat):
    print("| JPEG (q95 unless named) | bytes | " + " | ".join(f"{n}/8 µs" for n in range(1, 9)) + " |")
    print("|---|---:|" + "---:|" * 8)
    for name, data in images:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        fns = {}
        for n in range(1, 9):
            scaled = {} if n == 8 else {"min_height": -(-height * n // 8), "min_width": -(-width * n // 8)}
            fns[n] = lambda scaled=scaled: simplejpeg.decode_jpeg(data, "RGB", **scaled)
        best = best_us(fns, rounds, repeat)
        print(f"| {name} | {len(data):,} | " + " | ".join(f"{best[n]:.0f}" for n in range(1, 9)) + " |")


def pillow_train(data, rng):
    """torchvision's RandomResizedCrop + RandomHorizontalFlip on a PIL image: the baseline."""
    image = PIL.Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    h, w = int(height * rng.uniform(0.3, 1.0)), int(width * rng.uniform(0.3, 1.0))
    y0, x0 = rng.randrange(height - h + 1), rng.randrange(width - w + 1)
    image = image.resize(OUT[::-1], PIL.Image.BILINEAR, box=(x0, y0, x0 + w, y0 + h), reducing_gap=None)
    return image.transpose(PIL.Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else image


def end_to_end_table(images, rounds, repeat):
    out = np.empty(OUT + (3,), np.uint8)
    print("| JPEG | eval, DCT-scaled µs | eval, full decode µs | train µs | Pillow train µs |")
    print("|---|---:|---:|---:|---:|")
    for name, data in images:
        rng = random.Random(0)
        best = best_us({
            "eval": lambda: decode_into(data, out, False, None),
            "eval_full": lambda: decode_into(data, out, False, None, dct_scaling=False),
            "train": lambda: decode_into(data, out, True, rng),
            "pillow": lambda: pillow_train(data, rng),
        }, rounds, repeat)
        print(f"| {name} | {best['eval']:.0f} | {best['eval_full']:.0f} | {best['train']:.0f} | {best['pillow']:.0f} |")


def region_table(rows):
    """``decode_into`` to 224x224 decoding whole JPEGs vs only the region the crop needs.

    ``rows`` is ``[(name, [jpeg bytes, ...], rounds, boxes), ...]``, one table row each.
    Every image is decoded ``boxes`` times per round, train boxes drawn from seeds
    ``0..boxes-1``, so both contenders crop the same boxes; eval repeats the centre
    crop. "area" is the decoded region's share of the (DCT-scaled) image's pixels,
    averaged over the calls.
    """
    out = np.empty(OUT + (3,), np.uint8)
    print("| JPEGs | train, whole ms | train, region ms | saved | eval, whole ms | eval, region ms | saved "
          "| area train / eval |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, images, rounds, boxes in rows:
        def run(train, region, images=images, boxes=boxes):
            def each():
                for data in images:
                    for seed in range(boxes):
                        decode_into(data, out, train, random.Random(seed), region=region)
            return each

        best = best_us({(train, region): run(train, region) for train in (True, False) for region in (False, True)},
                       rounds, 1)
        calls = len(images) * boxes
        cells, areas = [], []
        for train in (True, False):
            whole, part = best[train, False] / calls / 1000, best[train, True] / calls / 1000
            cells += [f"{whole:.3f}", f"{part:.3f}", f"{1 - part / whole:.0%}"]
            fractions = []
            for data in images:
                for seed in range(boxes):
                    full = decode_into(data, out, train, random.Random(seed), region=False).decoded
                    part = decode_into(data, out, train, random.Random(seed), region=True).decoded
                    fractions.append(part[0] * part[1] / (full[0] * full[1]))
            areas.append(f"{np.mean(fractions):.2f}")
        print(f"| {name} | " + " | ".join(cells) + f" | {' / '.join(areas)} |")


def corpus_images(directory, count):
    """The first ``count`` .jpg / .ppm members of a corpus's shards, as bytes."""
    images = []
    for path in sorted(glob.glob(os.path.join(directory, "*.tar"))):
        with tarfile.open(path) as tar:
            for info in tar:
                if info.name.endswith((".jpg", ".ppm")):
                    images.append(tar.extractfile(info).read())
                    if len(images) == count:
                        return images
    return images


def corpus_table(directory, count, rounds):
    images = corpus_images(directory, count)
    if not images:
        raise SystemExit(f"no .jpg or .ppm members in {directory}/*.tar")
    out = np.empty(OUT + (3,), np.uint8)
    rng = random.Random(0)

    def each(fn):
        return lambda: [fn(data) for data in images]

    best = best_us({
        "train": each(lambda data: decode_into(data, out, True, rng)),
        "eval": each(lambda data: decode_into(data, out, False, None)),
        "pillow": each(lambda data: pillow_train(data, rng)),
    }, rounds, 1)
    mean_kb = sum(map(len, images)) / len(images) / 1024
    print(f"| {len(images)} images of {directory} (mean {mean_kb:.1f} KB) | " + " | ".join(
        f"{best[k] / len(images):.0f}" for k in ("train", "eval", "pillow"))
        + f" | {best['pillow'] / best['train']:.2f}x |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--image", action="append", default=[], help="a real image file (repeatable)")
    parser.add_argument("--corpus", help="a make_corpus.py directory")
    parser.add_argument("--corpus-images", type=int, default=500)
    parser.add_argument("--corpus-boxes", type=int, default=2, help="train boxes per corpus image, whole vs region")
    args = parser.parse_args(argv)
    if not native_available():
        raise SystemExit("the native core is not in use (not built, or WDSMP_PUREPYTHON=1)")
    images = [("synthetic 400x350", jpeg_bytes(photo(350, 400, 1))),
              ("synthetic 1024x768", jpeg_bytes(photo(768, 1024, 2)))]
    for path in args.image:
        with open(path, "rb") as stream:
            data = stream.read()
        if not data.startswith(b"\xff\xd8\xff"):  # a PNG photo: make it a q95 JPEG
            data = jpeg_bytes(np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB")))
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        images.append((f"{os.path.basename(path)} {width}x{height}", data))
    print(f"# {' '.join([os.path.basename(sys.argv[0])] + sys.argv[1:])}; best of {args.rounds} rounds "
          f"of {args.repeat} calls, one thread\n")
    print("## crop_resize_flip (flip on), per image\n")
    kernel_table(args.rounds, args.repeat)
    print("\n## simplejpeg decode at each DCT scale n/8, per image\n")
    decode_table(images, args.rounds, max(1, args.repeat // 2))
    print("\n## decode_into to 224x224, per image\n")
    end_to_end_table(images, args.rounds, max(1, args.repeat // 2))
    if args.corpus:
        print("\n## decode_into over a corpus, mean per image\n")
        print("| images | train µs | eval µs | Pillow train µs | Pillow / train |")
        print("|---|---:|---:|---:|---:|")
        corpus_table(args.corpus, args.corpus_images, max(3, args.rounds // 10))
    if not jpeg_region_available():
        print("\n(the JPEG region decoder is not built: no whole vs region comparison)")
        return
    print("\n## decode_into, whole JPEG vs the crop's region only, per image\n")
    rows = [(name, [data], args.rounds, args.repeat) for name, data in images]
    if args.corpus:
        jpegs = [data for data in corpus_images(args.corpus, args.corpus_images) if data[:3] == b"\xff\xd8\xff"]
        rows.append((f"{len(jpegs)} of {args.corpus}", jpegs, max(3, args.rounds // 10), args.corpus_boxes))
    region_table(rows)


if __name__ == "__main__":
    main()
