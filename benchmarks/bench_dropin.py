"""Where the import-swapped WebDataset pipeline's time goes, per sample, webdataset against wdsmp.

Usage::

    python benchmarks/bench_dropin.py --corpus /tmp/wdsmp-corpus [--images 512] [--rounds 3]

The user code of ``wdsmp.bench.loader.user_webdataset_loader`` (``WebDataset(urls)
.decode("pil").to_tuple("jpg;ppm", "cls").map_tuple(transform, int).batched(256)``, shuffles
left out so that both libraries see the same samples) is run in this process, one core, as
longer and longer prefixes: reading (tar, grouping), then decoding, then the whole pipeline
(``to_tuple``, the transform and batching). Each part's cost per sample is the difference
between two prefixes;
the libraries alternate prefix by prefix and round by round, and the median round is
reported. wdsmp's ``decode("pil")`` gives JPEG images that decode when their pixels are first
read, a crop's or a resize's region alone where that is all the transform reads, so part of
its decoding is paid in the transform's row: the row summing both compares the decoding and
the transform together. The DataLoader around it (its workers, the batches' way to the main process) is
the loader benchmark's business (``bench_loader.py --swap-import``).
"""

import argparse
import itertools
import statistics
import time

import wdsmp
from wdsmp.bench.loader import CROP_SIZE, CropFlipToTensor, open_corpus

# Each part: its name and the prefix (steps of the pipeline) that ends with it.
PARTS = (("read tar, group", 1), ("decode(\"pil\")", 2), ("to_tuple, map_tuple(transform, int), batched(256)", 5))


def prefix(wds, urls, parts):
    """The user's pipeline up to its ``parts``-th part, with ``wds`` the library imported."""
    dataset = wds.WebDataset(urls, shardshuffle=False)
    steps = [lambda d: d.decode("pil"), lambda d: d.to_tuple("jpg;ppm", "cls"),
             lambda d: d.map_tuple(CropFlipToTensor(CROP_SIZE), int), lambda d: d.batched(256)]
    for step in steps[:parts - 1]:
        dataset = step(dataset)
    return dataset


def seconds_per_sample(wds, urls, parts, images):
    dataset = prefix(wds, urls, parts)
    items = images // 256 if parts == 5 else images
    start = time.perf_counter()
    for _ in itertools.islice(iter(dataset), items):
        pass
    return (time.perf_counter() - start) / images


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--images", type=int, default=512, help="samples per measurement (a multiple of 256)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    import webdataset

    torch.set_num_threads(1)  # one core: the transform's tensor ops too, as in a DataLoader worker

    urls = open_corpus(args.corpus, 1).urls
    libraries = {"webdataset": webdataset, "wdsmp": wdsmp}
    totals = {name: {parts: [] for _, parts in PARTS} for name in libraries}
    for _ in range(args.rounds):
        for _, parts in PARTS:
            for name, wds in libraries.items():
                totals[name][parts].append(seconds_per_sample(wds, urls, parts, args.images))
    medians = {name: [statistics.median(totals[name][p]) for _, p in PARTS] for name in libraries}
    print(f"| part | webdataset {webdataset.__version__} (ms/sample) | wdsmp (ms/sample) | ratio |")
    print("|---|---:|---:|---:|")
    for i, (part, _) in enumerate(PARTS):
        cost = {name: (m[i] - (m[i - 1] if i else 0.0)) * 1e3 for name, m in medians.items()}
        ratio = cost["webdataset"] / cost["wdsmp"] if cost["wdsmp"] > 0 else float("nan")
        print(f"| {part} | {cost['webdataset']:.3f} | {cost['wdsmp']:.3f} | {ratio:.2f}x |")
    both = {name: (m[2] - m[0]) * 1e3 for name, m in medians.items()}
    print(f"| decode(\"pil\") and the rest together (decoding paid where the pixels are read) | "
          f"{both['webdataset']:.3f} | {both['wdsmp']:.3f} | {both['webdataset'] / both['wdsmp']:.2f}x |")
    whole = {name: m[-1] * 1e3 for name, m in medians.items()}
    print(f"| the whole pipeline, one core | {whole['webdataset']:.3f} | {whole['wdsmp']:.3f} | "
          f"{whole['webdataset'] / whole['wdsmp']:.2f}x |")


if __name__ == "__main__":
    main()
