"""Generate an ImageNet-like WebDataset corpus for the loader benchmarks.

Usage::

    python benchmarks/make_corpus.py OUTDIR [--images 10000] [--shard-size 1000]
        [--classes 1000] [--seed 0] [--processes N]
    # FFCV's speed recipe: longest side <= 500, JPEG quality 90 (4:2:0, as
    # OpenCV encodes), half of the images stored as raw pixels:
    python benchmarks/make_corpus.py OUTDIR --raw-fraction 0.5 --max-side 500 \\
        --quality 90 --subsampling 420

Each sample is ``{key}.jpg`` (or ``{key}.ppm``, raw 8-bit RGB) plus ``{key}.cls``
(an integer label drawn uniformly from ``--classes``), written with
``wdsmp.ShardWriter`` to ``OUTDIR/train-000000.tar``, ``train-000001.tar``, ...

The images are photographs, not noise or gradients (which decode at unrealistic
speeds): random crops of the colour photographs bundled with scikit-image
(``skimage.data``: astronaut, chelsea, coffee, rocket, hubble_deep_field,
immunohistochemistry and the two stereo_motorcycle views; no network), rescaled
to ImageNet's shapes (longest side mostly 280-480 px, 15% up to 800; 4:3, 3:2
and square, one in five portrait; about 400x350 px on average), flipped half of
the time, with sensor grain (the bundled photographs are cleaner than camera
JPEGs; grain brings the entropy-coded size, which sets decode time, to
ImageNet's ~110 KB average), then encoded with libjpeg-turbo at ImageNet-like
settings: quality 95 for 70% of the images, 90-100 for the rest; 4:4:4 chroma
for 75%, 4:2:0 for the rest.

Everything is drawn from a generator seeded by ``(--seed, image index)``, so a
corpus is the same whatever ``--processes``, and the recipe options change how
the same images are stored, not which images they are (storage vs speed).

``OUTDIR/index.json`` describes the corpus::

    {"shards": [{"url": "train-000000.tar", "samples": 1000}, ...],  # urls relative to OUTDIR
     "samples": 10000, "classes": 1000, "seed": 0, "jpg": 10000, "ppm": 0,
     "mean_bytes": 111000, "mean_width": 405, "mean_height": 351, "total_bytes": ...,
     "command": "make_corpus.py OUTDIR ..."}

Needs scikit-image (``pip install scikit-image``) for the photographs.
"""

import argparse
import hashlib
import importlib.util
import json
import multiprocessing
import os
import sys
import time

import numpy as np
import simplejpeg
from PIL import Image

import wdsmp

SOURCES = ["astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
           "motorcycle_left", "motorcycle_right"]
# Shapes as (short side / long side, probability); one image in five is portrait.
ASPECTS = [(3 / 4, 0.55), (2 / 3, 0.2), (1.0, 0.25)]
PORTRAIT = 0.2
LONG_SIDE = (280, 480)  # most images
LARGE_SIDE = (480, 800)  # LARGE_FRACTION of them
LARGE_FRACTION = 0.15
CROP_SCALE = (0.6, 1.6)  # source pixels per output pixel (upscaled where the source is small)
GRAIN_SIGMA = (3.0, 8.0)  # luminance grain, in 8-bit levels; chroma grain is half of it
QUALITY_MAIN, QUALITY_MAIN_FRACTION, QUALITY_OTHER = 95, 0.7, (90, 100)
SUBSAMPLING_444_FRACTION = 0.75

GRAIN_TILE = 1024  # grain comes from one fixed tile of unit normals, at a random offset

_photos = _grain = None  # per process: the source photographs and the grain tile, made once


def _load_photos():
    import skimage.data

    left, right, _ = skimage.data.stereo_motorcycle()
    photos = {"motorcycle_left": left, "motorcycle_right": right}
    for name in SOURCES:
        if name not in photos:
            photos[name] = getattr(skimage.data, name)()
    return [np.ascontiguousarray(photos[name]) for name in SOURCES]


def _init_worker():
    global _photos, _grain
    _photos = _load_photos()
    # Four planes: chroma grain for R, G, B and a luminance grain shared by all three.
    _grain = np.random.default_rng(0).standard_normal((GRAIN_TILE, GRAIN_TILE, 4), dtype=np.float32)


def _shape(rng):
    """An ImageNet-like (width, height)."""
    low, high = LARGE_SIDE if rng.random() < LARGE_FRACTION else LONG_SIDE
    long_side = int(rng.integers(low, high + 1))
    ratios, weights = zip(*ASPECTS)
    short_side = int(round(long_side * ratios[rng.choice(len(ratios), p=weights)]))
    portrait = rng.random() < PORTRAIT
    return (short_side, long_side) if portrait else (long_side, short_side)


def _render(rng):
    """A random crop of a random photograph, rescaled, maybe flipped, with grain: (H, W, 3) uint8."""
    photo = _photos[rng.integers(len(_photos))]
    width, height = _shape(rng)
    src_h, src_w = photo.shape[:2]
    fits = min(src_w / width, src_h / height)  # the largest scale whose crop fits the source
    scale = min(rng.uniform(*CROP_SCALE), fits)
    crop_w, crop_h = max(1, round(width * scale)), max(1, round(height * scale))
    x = int(rng.integers(src_w - crop_w + 1))
    y = int(rng.integers(src_h - crop_h + 1))
    image = Image.fromarray(photo[y:y + crop_h, x:x + crop_w]).resize((width, height), Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    sigma = np.float32(rng.uniform(*GRAIN_SIGMA))
    y, x = rng.integers(GRAIN_TILE - height + 1), rng.integers(GRAIN_TILE - width + 1)
    tile = _grain[y:y + height, x:x + width]
    pixels = tile[:, :, :3] * (sigma / 2)
    pixels += tile[:, :, 3:] * sigma
    pixels += np.asarray(image)
    return np.clip(pixels, 0, 255, out=pixels).astype(np.uint8)


def _ppm(pixels):
    height, width = pixels.shape[:2]
    return b"P6\n%d %d\n255\n" % (width, height) + pixels.tobytes()


def make_sample(job):
    """Image ``index`` of the corpus: (key, extension, encoded bytes, label, width, height)."""
    index, seed, classes, recipe = job
    rng = np.random.default_rng([seed, index])
    label = int(rng.integers(classes))
    pixels = _render(rng)
    quality = QUALITY_MAIN if rng.random() < QUALITY_MAIN_FRACTION else int(rng.integers(QUALITY_OTHER[0],
                                                                                         QUALITY_OTHER[1] + 1))
    subsampling = "444" if rng.random() < SUBSAMPLING_444_FRACTION else "420"
    raw = rng.random() < recipe["raw_fraction"]
    height, width = pixels.shape[:2]
    if recipe["max_side"] and max(width, height) > recipe["max_side"]:
        shrink = recipe["max_side"] / max(width, height)
        width, height = max(1, round(width * shrink)), max(1, round(height * shrink))
        pixels = np.asarray(Image.fromarray(pixels).resize((width, height), Image.BICUBIC))
    if raw:
        return f"{index:08d}", "ppm", _ppm(pixels), label, width, height
    data = simplejpeg.encode_jpeg(pixels, quality=recipe["quality"] or quality, colorspace="RGB",
                                  colorsubsampling=recipe["subsampling"] or subsampling)
    return f"{index:08d}", "jpg", data, label, width, height


def _size_and_digest(path):
    """``{"size", "sha256"}`` of the file at ``path``, as ``wdsmp index`` records them (so that
    ``wdsmp verify --index`` checks every byte)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def write_corpus(outdir, images, shard_size, classes, seed, recipe, processes, command):
    """Write the shards and ``index.json``; returns the index."""
    os.makedirs(outdir, exist_ok=True)
    jobs = [(i, seed, classes, recipe) for i in range(images)]
    counts, stats = {}, {"jpg": 0, "ppm": 0, "bytes": 0, "width": 0, "height": 0}
    start = last_report = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes, initializer=_init_worker) as pool, \
            wdsmp.ShardWriter(os.path.join(outdir, "train-%06d.tar"), maxcount=shard_size) as sink:
        for done, (key, ext, data, label, width, height) in enumerate(pool.imap(make_sample, jobs, 16), 1):
            sink.write({"__key__": key, ext: data, "cls": label})
            counts[sink.fname] = counts.get(sink.fname, 0) + 1
            stats[ext] += 1
            stats["bytes"] += len(data)
            stats["width"] += width
            stats["height"] += height
            now = time.perf_counter()
            if now - last_report >= 5 or done == images:
                last_report = now
                print(f"  {done}/{images} images, {done / (now - start):.0f}/s, "
                      f"mean {stats['bytes'] / done / 1e3:.1f} KB", file=sys.stderr, flush=True)
    index = {
        "shards": [{"url": os.path.basename(name), "samples": n, **_size_and_digest(name)}
                   for name, n in counts.items()],
        "samples": images, "classes": classes, "seed": seed, "jpg": stats["jpg"], "ppm": stats["ppm"],
        "total_bytes": stats["bytes"], "mean_bytes": round(stats["bytes"] / images),
        "mean_width": round(stats["width"] / images), "mean_height": round(stats["height"] / images),
        "command": command,
    }
    with open(os.path.join(outdir, "index.json"), "w") as stream:
        json.dump(index, stream, indent=1)
        stream.write("\n")
    return index


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    recipe = parser.add_argument_group("storage recipe (FFCV's: --raw-fraction 0.5 --max-side 500 "
                                       "--quality 90 --subsampling 420)")
    recipe.add_argument("--raw-fraction", type=float, default=0.0,
                        help="fraction of images stored as raw pixels (.ppm) instead of JPEG")
    recipe.add_argument("--max-side", type=int, default=None, help="shrink images whose longest side is longer")
    recipe.add_argument("--quality", type=int, default=None, help="JPEG quality of every image (default: the mix)")
    recipe.add_argument("--subsampling", choices=["444", "422", "420"], default=None,
                        help="JPEG chroma subsampling of every image (default: the mix)")
    args = parser.parse_args(argv)
    if args.images < 1 or args.shard_size < 1 or args.classes < 1 or args.processes < 1:
        parser.error("--images, --shard-size, --classes and --processes must be positive")
    if not 0 <= args.raw_fraction <= 1:
        parser.error("--raw-fraction must be within [0, 1]")
    if args.quality is not None and not 1 <= args.quality <= 100:
        parser.error("--quality must be within [1, 100]")
    if importlib.util.find_spec("skimage") is None:  # checked here: a worker failing to import it hangs the pool
        parser.error("the source photographs come from scikit-image: pip install -e '.[bench]'")
    command = " ".join([os.path.basename(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv)))
    recipe = {"raw_fraction": args.raw_fraction, "max_side": args.max_side, "quality": args.quality,
              "subsampling": args.subsampling}
    start = time.perf_counter()
    index = write_corpus(args.outdir, args.images, args.shard_size, args.classes, args.seed, recipe,
                         args.processes, command)
    print(f"{index['samples']} images ({index['jpg']} jpg, {index['ppm']} ppm) in {len(index['shards'])} shards, "
          f"{time.perf_counter() - start:.1f} s: mean {index['mean_bytes'] / 1e3:.1f} KB, "
          f"{index['mean_width']}x{index['mean_height']} px, {index['total_bytes'] / 1e6:.0f} MB in all; "
          f"index: {os.path.join(args.outdir, 'index.json')}")


if __name__ == "__main__":
    main()
