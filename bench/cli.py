"""``tilefeed bench ...`` and ``tilefeed demo``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    base = os.environ.get("TILEFEED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilefeed")
    return Path(base)


def demo_images(count: int, classes: int = 8) -> Path:
    from bench.synthetic import make_image_folder

    per_class = -(-count // classes)
    folder = cache_dir() / f"images-{classes}x{per_class}"
    print(f"images: {folder} ({classes} classes x {per_class}, generated once, then reused)")
    return make_image_folder(folder, classes=classes, per_class=per_class)


def bench_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tilefeed bench", description="Benchmarks.")
    sub = parser.add_subparsers(dest="what", required=True, metavar="WHAT")
    p = sub.add_parser("preprocess", help="preprocessing throughput against bare PIL decode+resize",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--images", type=Path, default=None,
                   help="image folder (default: a generated ImageNet-like set in the cache)")
    p.add_argument("--count", type=int, default=2400, help="generated images, without --images")
    p.add_argument("--size", type=int, default=224, help="tile side")
    p.add_argument("--codec", default="lz4", help="tile codec")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians reported")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    q = sub.add_parser("loader", help="loader-alone throughput: tilefeed vs memcpy vs PIL DataLoader",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    q.add_argument("--images", type=Path, default=None,
                   help="source image folder (default: a generated ImageNet-like set in the cache)")
    q.add_argument("--store", type=Path, default=None,
                   help="the store made from --images (default: made in the cache)")
    q.add_argument("--count", type=int, default=1600, help="generated images, without --images")
    q.add_argument("--batch-size", type=int, default=64)
    q.add_argument("--workers", type=int, default=2, help="workers for every loader")
    q.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    q.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result: Any
    if args.what == "preprocess":
        from bench.preprocess_bench import bench_preprocess

        images = args.images or demo_images(args.count)
        result = bench_preprocess(images, size=args.size, codec=args.codec, rounds=args.rounds)
    else:
        from bench.loader_bench import bench_loaders

        images = args.images or demo_images(args.count)
        store = args.store or demo_store(images)
        result = bench_loaders(images, store, batch_size=args.batch_size, workers=args.workers,
                               rounds=args.rounds)
    print(result.table())
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0


def demo_store(images: Path, size: int = 224, codec: str = "lz4") -> Path:
    """The store made from ``images`` in the cache; preprocessing is skipped when it is complete."""
    from preprocess import StoreSettings, TileSettings, preprocess
    from preprocess.writer import progress_bar

    store = cache_dir() / f"{images.name}-{size}-{codec}"
    s = preprocess(images, store, TileSettings(size=size), StoreSettings(codec=codec),
                   progress=progress_bar(True))
    print(f"store: {store} ({'reused' if s.up_to_date else f'made in {s.seconds:.1f} s'})")
    return store


def demo_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tilefeed demo",
        description="Generate an ImageNet-like image set (cached), preprocess it into a store and "
        "describe the store.")
    parser.add_argument("--count", type=int, default=1600, help="images to generate")
    args = parser.parse_args(argv)
    from preprocess import StoreSettings, TileSettings, preprocess
    from preprocess.inspection import format_info, info
    from preprocess.writer import progress_bar

    images = demo_images(args.count)
    store = cache_dir() / "demo-store"
    s = preprocess(images, store, TileSettings(size=224), StoreSettings(codec="lz4"),
                   progress=progress_bar(True))
    print(f"preprocessed {s.sources} images in {s.seconds:.1f} s"
          + (" (store was already complete)" if s.up_to_date else ""))
    print(format_info(info(store)))
    return 0
