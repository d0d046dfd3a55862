"""``tilefeed demo``: the tour, from generated images to the stall of the PIL DataLoader
against tilefeed's, through the same parser and defaults as ``tilefeed bench``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import argparse

from tilefeed.cli.arguments import add_renamed
from tilefeed.cli.bench import run_compare
from tilefeed.cli.bench_options import STEP_MS, form_parser, harness_args
from tilefeed.cli.demo_data import demo_images, demo_store


def build_parser() -> argparse.ArgumentParser:
    """The demo's parser, with its options and their old spellings (hidden)."""
    parser = form_parser(
        "tilefeed demo",
        "The tour: generate an ImageNet-like image set (cached), preprocess it into a store, and "
        "bench the standard PIL DataLoader against tilefeed at an emulated step.")
    parser.add_argument("--count", type=int, default=1600, help="images to generate")
    parser.add_argument("--step-ms", type=float, default=STEP_MS, help="the emulated step, in ms per batch")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per loader")
    parser.add_argument("--out-dir", type=Path, default=Path("tilefeed-demo"), metavar="DIR",
                        help="folder for the JSON and the plots")
    add_renamed(parser, "demo")
    return parser


def demo_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    from tilefeed.cli.store_commands import format_info
    from tilefeed.store.inspection import info

    images = demo_images(args.count)
    store = demo_store(images)
    print(format_info(info(store), max_rejects=5))
    print(f"\nbench: baseline (PIL DataLoader) vs tilefeed, batch 64, 2 workers, "
          f"{args.step_ms:g} ms emulated step", flush=True)
    # the bench's own parser and defaults, so the demo never drifts from `tilefeed bench`
    bench_parser = form_parser("tilefeed bench", "")
    harness_args(bench_parser)
    bench = bench_parser.parse_args([
        "--images", str(images), "--store", str(store), "--loaders", "baseline,tilefeed",
        "--batch-size", "64", "--steps", str(args.steps), "--step-ms", str(args.step_ms),
        "--workers", "2", "--count", str(args.count), "--out", str(args.out_dir / "bench.json"),
        "--plots", str(args.out_dir)])
    base, tiles = run_compare(bench)
    print(f"\ntilefeed: stall {base.stall_fraction:.0%} -> {tiles.stall_fraction:.0%}, "
          f"{tiles.samples_per_s / base.samples_per_s:.1f}x the samples per second of the PIL "
          f"DataLoader at a {args.step_ms:g} ms step")
    return 0
