"""``tilefeed bench ...`` and ``tilefeed demo``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path


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
    args = parser.parse_args(argv)
    images = args.images or demo_images(args.count)
    result = bench_preprocess_cmd(images, args)
    print(result.table())
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 0


def bench_preprocess_cmd(images: Path, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from bench.preprocess_bench import bench_preprocess

    return bench_preprocess(images, size=args.size, codec=args.codec, rounds=args.rounds)


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
