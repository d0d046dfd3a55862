"""``tilefeed preprocess``: its options, the run and the summary it prints.

The parser needs only the names of the settings and source rules (their modules load no PIL,
NumPy or zarr); the writer loads when the run starts.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from tilefeed.cli.arguments import HelpFormatter, add_renamed, positive
from tilefeed.cli.storage_options import add_storage_option, shown, storage_options
from tilefeed.preprocess.sources.scanning import LABEL_RULES, SOURCE_KINDS
from tilefeed.preprocess.settings import DEFAULT_MAX_PIXELS, FITS, ICC, MODES, RESAMPLERS, parse_size
from tilefeed.store.format import CODECS

if TYPE_CHECKING:
    from tilefeed.preprocess.writer import Summary


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


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilefeed preprocess",
        description="Decode every source image once, cut it into TxT RGB tiles and store them as a "
        "sharded Zarr v3 array. Unusable inputs are listed in the store's rejects with a reason. "
        "Rerunning the same command after an interruption resumes where it stopped.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("src", metavar="SRC",
                   help="folder with one subfolder per class, or a manifest (.csv or .jsonl of "
                   "path,label; relative paths resolve against the manifest's folder); or image-text "
                   "samples: WebDataset tar shards (a .tar, a folder of them, a brace pattern such as "
                   "'shards/{00000..00009}.tar', or a .txt list of tar paths), parquet files (a .parquet "
                   "or a folder of them), or a caption table (.tsv, .csv or .jsonl of image path and "
                   "caption); see --source")
    p.add_argument("out", metavar="OUT", help="store to create: a new or empty folder, or an "
                   "object-store URL (s3://bucket/prefix, gs://, az://)")
    _tile_args(p)
    _store_args(p)
    _source_args(p)
    _target_args(p)
    _pair_args(p)
    p.add_argument("--strict", action="store_true", help="exit 1 when any input was rejected")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a tilefeed store already at OUT (other folders are never touched)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    add_storage_option(p)
    add_renamed(p, "preprocess")
    return p


def _tile_args(p: argparse.ArgumentParser) -> None:
    """How each image becomes tiles (``TileSettings``)."""
    p.add_argument("--tile", type=positive, default=256, help="tile side T in pixels")
    p.add_argument("--mode", choices=MODES, default="resize",
                   help="resize: one tile per image; grid: cut each image into TxT tiles")
    p.add_argument("--fit", choices=FITS, default="pad",
                   help="resize mode: pad keeps the whole picture (longer side T, its box recorded, "
                   "so training crops and evaluation framing see what torchvision's do); crop keeps "
                   "the centre square (the borders never reach training); stretch distorts")
    p.add_argument("--stride", type=positive, default=None,
                   help="grid mode: pixels between tile origins (default: T, no overlap)")
    p.add_argument("--resample", choices=sorted(RESAMPLERS), default="bicubic",
                   help="antialiased resampling filter")
    p.add_argument("--background", type=_colour, default="255,255,255",
                   help="R,G,B or #rrggbb under transparent pixels, pad borders and grid edges")
    p.add_argument("--icc", choices=ICC, default="ignore",
                   help="embedded ICC profiles (CMYK and colour-managed photos): ignore gives what "
                   "PIL's Image.convert('RGB') gives, as a torchvision PIL pipeline sees it; srgb "
                   "converts the pixels to sRGB through littlecms")
    p.add_argument("--max-pixels", type=positive, default=DEFAULT_MAX_PIXELS,
                   help="reject larger images (decompression-bomb limit; Pillow's own limit follows it)")
    p.add_argument("--worker-memory", type=_size, default="2G", metavar="SIZE",
                   help="the most memory one worker process may use to decode and convert one image (e.g. "
                   "2G, 512M): an image that would need more is rejected, naming its size; the "
                   "default --processes is lowered until every process's share fits in the memory "
                   "available")


def _store_args(p: argparse.ArgumentParser) -> None:
    """How tiles are stored (``StoreSettings``), and who does the work."""
    p.add_argument("--codec", choices=CODECS, default="lz4",
                   help="tile codec: lz4 (blosc) or zstd are lossless and fast to read on the CPU; "
                   "none stores raw pixels; jpeg is lossy and decodes on the GPU (nvJPEG)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for --codec jpeg")
    p.add_argument("--shard-size", type=positive, default=1024, help="tiles per shard file")
    p.add_argument("--processes", type=positive, default=None,
                   help="worker processes (default: all available cores, fewer where the available "
                   "memory holds fewer --worker-memory shares)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the work on a Dask distributed cluster (e.g. tcp://host:8786) instead "
                   "of local processes; its workers must see SRC at the same path, and OUT too "
                   "unless OUT is a bucket (workers then upload the shards themselves)")


def _source_args(p: argparse.ArgumentParser) -> None:
    """How SRC is read (``SourceOptions``)."""
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


def _target_args(p: argparse.ArgumentParser) -> None:
    """Boxes and masks read beside SRC, an image folder (``TargetOptions``)."""
    g = p.add_argument_group("targets (detection and segmentation; SRC is an image folder)")
    g.add_argument("--annotations", metavar="FILE", default=None,
                   help="a COCO instances JSON whose file_name entries are relative to SRC: each image's "
                   "boxes (COCO's x, y, width, height stored as x0, y0, x1, y1 in tile pixels), category "
                   "ids and crowd flags are mapped into its tile; the file's images are the sources")
    g.add_argument("--max-annotations-size", type=_size, default="1G", metavar="SIZE",
                   help="the largest --annotations file read (it is parsed whole, in several times its "
                   "size of memory); a larger one is refused unread (default: 1G)")
    g.add_argument("--instance-masks", action="store_true",
                   help="with --annotations: store each object's polygons or RLE as an instance mask "
                   "tile too (0 background, k the tile's object k-1; a pixel several objects cover goes "
                   "to the one listed last)")
    g.add_argument("--yolo", action="store_true",
                   help="SRC holds images/ and labels/ (YOLO text: class cx cy w h, normalised, a line per "
                   "box) and names its classes in data.yaml or classes.txt; boxes only")
    g.add_argument("--masks", metavar="DIR", default=None,
                   help="semantic masks: for SRC/a/b.jpg, DIR/a/b.png holds a class id per pixel (one 8-bit "
                   "band, 255 ignored); DIR/classes.txt, if there, names ids 0, 1, ...; with --annotations, "
                   "a mask per image beside its boxes, of the file's category ids (no classes.txt)")


def _pair_args(p: argparse.ArgumentParser) -> None:
    """What an image-text SRC is and where its captions are (``PairOptions``)."""
    g = p.add_argument_group("image-text sources (captions and metadata fields stored per image)")
    g.add_argument("--source", choices=SOURCE_KINDS, default="auto",
                   help="what SRC is: auto decides from SRC (tars or a brace pattern or a .txt list: "
                   "webdataset; .parquet: parquet; .tsv, or a .csv/.jsonl whose header names the caption "
                   "column and no label column: table; other .csv/.jsonl: manifest; a folder of class "
                   "folders: folders) and says what it chose; name it where SRC could be two of these")
    g.add_argument("--image-key", default="jpg;png;webp;jpeg", metavar="EXTS",
                   help="a tar sample's image: the first of its members with one of these extensions, in "
                   "this order, ';'-separated (open_clip's --image-key)")
    g.add_argument("--caption-key", default="caption", metavar="NAMES",
                   help="the captions kept, comma-separated: in a tar, caption is the .txt member and other "
                   "names are fields of the .json member; in a parquet file or a table, column names. A "
                   "sample with none of them is rejected")
    g.add_argument("--fields", default=None, metavar="NAMES",
                   help="the metadata fields kept per sample, comma-separated (a tar's .json fields, columns); "
                   "default: key, width, height, original_width, original_height (img2dataset's)")
    g.add_argument("--image-column", default=None, metavar="NAME",
                   help="parquet: the column holding each image (binary, or a struct of bytes and path); "
                   "default: the column Hugging Face datasets marks as an Image, else image")
    g.add_argument("--csv-img-key", default="filepath", metavar="NAME",
                   help="caption table: the column of image paths (open_clip's --csv-img-key)")
    g.add_argument("--csv-caption-key", default="title", metavar="NAME",
                   help="caption table: the column of captions, stored as the caption named caption "
                   "(open_clip's --csv-caption-key)")
    g.add_argument("--csv-separator", default="\t", metavar="CHAR",
                   help="caption table: the column separator, a tab by default whatever the file's suffix "
                   "(open_clip's --csv-separator)")
    g.add_argument("--label-key", default=None, metavar="NAME",
                   help="a class label per sample (a .json field or a column; integers >= 0); without it "
                   "the store is unlabelled: one class, image, every label 0")


def run(args: argparse.Namespace) -> int:
    from tilefeed.cli.progress import progress_bar
    from tilefeed.preprocess.settings import StoreSettings, TargetOptions, TileSettings
    from tilefeed.preprocess.sources.scanning import PairOptions, SourceOptions
    from tilefeed.preprocess.writer import preprocess

    tiles = TileSettings(
        tile=args.tile, mode=args.mode, fit=args.fit, stride=args.stride or 0,
        resample=args.resample, background=args.background, max_pixels=args.max_pixels,
        icc=args.icc, worker_memory=args.worker_memory,
    )
    store = StoreSettings(codec=args.codec, quality=args.quality, shard_size=args.shard_size)
    rules = SourceOptions(labels=args.labels, allow_duplicates=args.allow_duplicates,
                          allow_outside=args.allow_outside,
                          allow_empty_classes=args.allow_empty_classes,
                          buckets=tuple(args.allow_bucket))
    targets = TargetOptions(annotations=args.annotations, instance_masks=args.instance_masks, yolo=args.yolo,
                            masks=args.masks, max_annotations_size=args.max_annotations_size)
    pairs = PairOptions(source=args.source, image_key=args.image_key, caption_key=args.caption_key,
                        fields=args.fields, image_column=args.image_column, csv_img_key=args.csv_img_key,
                        csv_caption_key=args.csv_caption_key, csv_separator=args.csv_separator,
                        label_key=args.label_key)
    said: list[str] = []  # the notes about SRC, said as soon as the scan finds them

    def announce(note: str) -> None:
        said.append(note)
        print(f"tilefeed: {shown(note, args)}", file=sys.stderr)

    summary = preprocess(
        args.src, args.out, tiles, store, workers=args.processes, overwrite=args.overwrite,
        progress=progress_bar(sys.stderr.isatty() and not args.quiet), scheduler=args.scheduler,
        source_options=rules, storage_options=storage_options(args), targets=targets,
        pairs=pairs, announce=None if args.quiet else announce,
    )
    if not args.quiet:
        _print_summary(summary, args, said)
    if args.strict and summary.rejected:
        print(f"tilefeed: error: --strict: {summary.rejected} inputs were rejected "
              f"(see `tilefeed info {shown(args.out, args)}`)", file=sys.stderr)
        return 1
    return 0


def _print_summary(s: Summary, args: argparse.Namespace, said: list[str]) -> None:
    state = "already complete, nothing to do" if s.up_to_date else f"{s.seconds:.1f} s"
    rate = f", {s.sources / s.seconds:.0f} img/s" if s.seconds and not s.up_to_date else ""
    print(f"{shown(args.out, args)}: {state}{rate}")
    print(f"  sources {s.sources}: accepted {s.accepted}, rejected {s.rejected}"
          + (f"; {s.hidden} hidden files and folders skipped" if s.hidden else ""))
    for reason, n in s.rejects_by_reason.items():
        print(f"    {n:>6}  {shown(reason, args)}")
    for note in s.notes:
        if note not in said:
            print(f"  note: {shown(note, args)}")
    print(f"  tiles {s.tiles} in {s.shards} shards, {s.bytes / 2**20:.1f} MiB")
    if s.objects or s.outside:
        outside = f"; {s.outside} outside their tiles (crop fit, grid gaps), not stored" if s.outside else ""
        print(f"  objects {s.objects} stored{outside}")
    if s.resumed_parts:
        print(f"  resumed: {s.resumed_parts} parts were already done")
