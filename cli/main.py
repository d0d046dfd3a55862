"""``tilefeed``: preprocess, info, verify, bench and demo subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from tilefeed.store.errors import TilefeedError
from tilefeed.store.format import CODECS
from tilefeed.store.inspection import printable
from tilefeed.preprocess.settings import DEFAULT_MAX_PIXELS, FITS, ICC, MODES, RESAMPLERS
from tilefeed.preprocess.sources import LABEL_RULES
from tilefeed.store.storage import parse_options

EPILOG = """examples:
  tilefeed preprocess ~/data/train store/train --size 256 --codec lz4
  tilefeed preprocess scans.csv store/scans --mode grid --size 512 --stride 448 --codec jpeg
  tilefeed preprocess ~/data/train s3://my-bucket/stores/train --codec jpeg
  tilefeed info store/train
  tilefeed verify store/train --deep
  tilefeed show store/train --train --count 64 --out sheet.png
  tilefeed doctor
  tilefeed bench --images ~/data/train --store store/train --loaders baseline,tilefeed
"""


def _colour(text: str) -> tuple[int, int, int]:
    text = text.strip()
    try:
        if text.startswith("#") and len(text) == 7:
            return (int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16))
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or not all(0 <= p <= 255 for p in parts):
        raise argparse.ArgumentTypeError(f"expected R,G,B (0..255 each) or #rrggbb, got {text!r}")
    return parts  # type: ignore[return-value]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _size(text: str) -> int:
    from tilefeed.preprocess.settings import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="for a store URL: a setting added to the cloud's standard configuration "
                   "(environment, profiles), e.g. endpoint=http://minio:9000, region=eu-west-1, "
                   "profile=NAME, timeout=60s, max_retries=10; repeat for more")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilefeed",
        description="Pre-tile an image dataset into sharded Zarr v3, feed it to the GPU with DALI, "
        "and measure how long training waits for data.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tilefeed {metadata.version('tilefeed')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "preprocess", help="convert images into a tiled, sharded Zarr v3 store",
        description="Decode every source image once, cut it into TxT RGB tiles and store them as a "
        "sharded Zarr v3 array. Unusable inputs are listed in the store's rejects with a reason. "
        "Rerunning the same command after an interruption resumes where it stopped.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("src", metavar="SRC",
                   help="folder with one subfolder per class, or a manifest (.csv or .jsonl of "
                   "path,label; relative paths resolve against the manifest's folder)")
    p.add_argument("out", metavar="OUT", help="store to create: a new or empty folder, or an "
                   "object-store URL (s3://bucket/prefix, gs://, az://)")
    p.add_argument("--size", type=_positive, default=256, help="tile side T in pixels")
    p.add_argument("--mode", choices=MODES, default="resize",
                   help="resize: one tile per image; grid: cut each image into TxT tiles")
    p.add_argument("--fit", choices=FITS, default="pad",
                   help="resize mode: pad keeps the whole picture (longer side T, its box recorded, "
                   "so training crops and evaluation framing see what torchvision's do); crop keeps "
                   "the centre square (the borders never reach training); stretch distorts")
    p.add_argument("--stride", type=_positive, default=None,
                   help="grid mode: pixels between tile origins (default: T, no overlap)")
    p.add_argument("--resample", choices=sorted(RESAMPLERS), default="bicubic",
                   help="antialiased resampling filter")
    p.add_argument("--background", type=_colour, default=(255, 255, 255),
                   help="R,G,B or #rrggbb under transparent pixels, pad borders and grid edges")
    p.add_argument("--icc", choices=ICC, default="ignore",
                   help="embedded ICC profiles (CMYK and colour-managed photos): ignore gives what "
                   "PIL's Image.convert('RGB') gives, as a torchvision PIL pipeline sees it; srgb "
                   "converts the pixels to sRGB through littlecms")
    p.add_argument("--codec", choices=CODECS, default="lz4",
                   help="tile codec: lz4 (blosc) or zstd are lossless and fast to read on the CPU; "
                   "none stores raw pixels; jpeg is lossy and decodes on the GPU (nvJPEG)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for --codec jpeg")
    p.add_argument("--shard-size", type=_positive, default=1024, help="tiles per shard file")
    p.add_argument("--workers", type=_positive, default=None,
                   help="worker processes (default: all available cores, fewer where the available "
                   "memory holds fewer --worker-memory shares)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the work on a Dask distributed cluster (e.g. tcp://host:8786) instead "
                   "of local processes; its workers must see SRC at the same path, and OUT too "
                   "unless OUT is a bucket (workers then upload the shards themselves)")
    p.add_argument("--max-pixels", type=_positive, default=DEFAULT_MAX_PIXELS,
                   help="reject larger images (decompression-bomb limit; Pillow's own limit follows it)")
    p.add_argument("--worker-memory", type=_size, default="2G", metavar="SIZE",
                   help="the most memory one worker may use to decode and convert one image (e.g. "
                   "2G, 512M): an image that would need more is rejected, naming its size; the "
                   "default --workers is lowered until every worker's share fits in the memory "
                   "available")
    p.add_argument("--labels", choices=LABEL_RULES, default="auto",
                   help="manifest labels: auto keeps integers when every label is one and reads "
                   "names when none looks numeric (anything mixed is refused); int or names force it")
    p.add_argument("--allow-duplicates", action="store_true",
                   help="keep a path a manifest lists more than once (refused by default)")
    p.add_argument("--allow-outside", action="store_true",
                   help="let a manifest name files outside its own folder (absolute or ../ paths, "
                   "or links that lead out of it)")
    p.add_argument("--allow-bucket", action="append", default=[], metavar="BUCKET",
                   help="let a manifest's URL rows read objects in BUCKET (s3://name, gs://name, "
                   "az://name, or a bare name in any of them; '*' for every bucket); they are read "
                   "with this machine's cloud credentials, so rows naming any other bucket are "
                   "refused; repeat for more")
    p.add_argument("--allow-empty-classes", action="store_true",
                   help="keep a class folder with no files as a class with no samples (refused by "
                   "default: it would shift the ids of the classes after it)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any input was rejected")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a tilefeed store already at OUT (other folders are never touched)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    _storage_option(p)

    i = sub.add_parser("info", help="describe a store: samples, classes, codec, shards, rejects")
    i.add_argument("store", metavar="STORE")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    _storage_option(i)

    v = sub.add_parser("verify", help="check every file of a store: arrays, digests, shard "
                       "indexes and tile checksums",
                       description="Exit 0 when the store is sound; otherwise print each problem, "
                       "naming the shard file and sample, and exit 1.")
    v.add_argument("store", metavar="STORE")
    v.add_argument("--deep", action="store_true", help="also decode every tile")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    _storage_option(v)

    sub.add_parser("doctor", help="what this installation can do: PIL codecs, DALI, torch, GPU",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("audit", help="from a Loader's ledger: samples delivered once, twice or never",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("show", help="a contact sheet (PNG) of samples as the model receives them",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)

    b = sub.add_parser("bench", help="benchmarks (see `tilefeed bench --help`)", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER)
    d = sub.add_parser("demo", help="generate images, preprocess, benchmark: the end-to-end tour",
                       add_help=False)
    d.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in ("bench", "demo", "doctor", "audit", "show"):
        # their own parsers take every option that follows
        args = argparse.Namespace(command=argv[0], args=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        if args.command == "preprocess":
            return _preprocess(args)
        if args.command == "info":
            return _info(args)
        if args.command == "verify":
            return _verify(args)
        if args.command == "doctor":
            from tilefeed.cli import doctor

            return doctor.main(args.args)
        if args.command == "audit":
            from tilefeed.pipeline.ledger import audit_main

            return audit_main(args.args)
        if args.command == "show":  # prints its own one-line errors
            from tilefeed.pipeline.show import main as show_main

            return show_main(args.args)
        from tilefeed.cli import bench as bench_cli

        if args.command == "bench":
            return bench_cli.bench_main(args.args)
        return bench_cli.demo_main(args.args)
    except TilefeedError as e:
        print(f"tilefeed: error: {shown(str(e), args)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `tilefeed info | head`: the reader left; say nothing more, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("tilefeed: interrupted (rerun the same command to resume)", file=sys.stderr)
        return 130


def shown(text: str, args: argparse.Namespace | None = None) -> str:
    """``text`` as one printable line with no credential in it (those of the environment, of
    any URL, and of the ``--storage-option`` values)."""
    from tilefeed.store.storage import redact

    options: dict[str, str] = {}
    for pair in getattr(args, "storage_option", None) or []:
        key, _, value = str(pair).partition("=")
        options[key.strip().lower()] = value
    return printable(redact(str(text), options))


def _preprocess(args: argparse.Namespace) -> int:
    from tilefeed.preprocess.settings import StoreSettings, TileSettings
    from tilefeed.preprocess.sources import SourceOptions
    from tilefeed.cli.progress import progress_bar
    from tilefeed.preprocess.writer import preprocess

    tiles = TileSettings(
        tile=args.size, mode=args.mode, fit=args.fit, stride=args.stride or 0,
        resample=args.resample, background=args.background, max_pixels=args.max_pixels,
        icc=args.icc, worker_memory=args.worker_memory,
    )
    store = StoreSettings(codec=args.codec, quality=args.quality, shard_size=args.shard_size)
    rules = SourceOptions(labels=args.labels, allow_duplicates=args.allow_duplicates,
                          allow_outside=args.allow_outside,
                          allow_empty_classes=args.allow_empty_classes,
                          buckets=tuple(args.allow_bucket))
    s = preprocess(
        args.src, args.out, tiles, store, workers=args.workers, overwrite=args.overwrite,
        progress=progress_bar(sys.stderr.isatty() and not args.quiet), scheduler=args.scheduler,
        source_options=rules, storage_options=parse_options(args.storage_option),
    )
    if not args.quiet:
        state = "already complete, nothing to do" if s.up_to_date else f"{s.seconds:.1f} s"
        rate = f", {s.sources / s.seconds:.0f} img/s" if s.seconds and not s.up_to_date else ""
        print(f"{shown(args.out, args)}: {state}{rate}")
        print(f"  sources {s.sources}: accepted {s.accepted}, rejected {s.rejected}"
              + (f"; {s.hidden} hidden files and folders skipped" if s.hidden else ""))
        for reason, n in s.rejects_by_reason.items():
            print(f"    {n:>6}  {shown(reason, args)}")
        for note in s.notes:
            print(f"  note: {shown(note, args)}")
        print(f"  tiles {s.tiles} in {s.shards} shards, {s.bytes / 2**20:.1f} MiB")
        if s.resumed_parts:
            print(f"  resumed: {s.resumed_parts} parts were already done")
    if args.strict and s.rejected:
        print(f"tilefeed: error: --strict: {s.rejected} inputs were rejected "
              f"(see `tilefeed info {shown(args.out, args)}`)", file=sys.stderr)
        return 1
    return 0


def _info(args: argparse.Namespace) -> int:
    from tilefeed.store.inspection import format_info, info
    from tilefeed.store.storage import redact

    options = parse_options(args.storage_option)
    d = info(args.store, options)
    print(redact(json.dumps(d, indent=2) if args.json else format_info(d), options))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tilefeed.store.inspection import verify

    with tqdm(unit="shard", disable=args.quiet or not sys.stderr.isatty(), file=sys.stderr) as bar:
        problems = verify(args.store, deep=args.deep, on_shard=lambda: bar.update(1),
                          storage_options=parse_options(args.storage_option))
    shards = bar.n
    for line in problems:
        print(shown(line, args))
    what = "decoded and checked" if args.deep else "checked"
    if problems:
        print(f"tilefeed: error: {len(problems)} problems in {shown(args.store, args)}", file=sys.stderr)
        return 1
    print(f"{shown(args.store, args)}: sound ({shards} shards {what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
