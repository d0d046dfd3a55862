"""The ``tilefeed bench`` forms that measure one part each, as records: preprocessing, the loader
alone, a bucket store, the object-store clients, the CPU path's parts, ``Loader.stats()``, growth
with the store's size, long jobs (soak), the tile fit (aspect), progressive resizing's effect on
training (schedule) and the GPU report. Each record adds its own options and runs its bench from
the parsed options; ``run_form`` does the rest alike for every form. A form's run imports its
bench, so ``--help`` loads none."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tilefeed.cli.arguments import add_renamed, positive, positive_list, whole_number
from tilefeed.cli.bench_options import (STEP_MS, WORKERS_HELP, data_args, form_parser, location, loop_args,
                                        out_arg)
from tilefeed.cli.demo_data import cache_dir, demo_coco, demo_coco_store, demo_images, demo_store
from tilefeed.preprocess.settings import Fit
from tilefeed.store.format import Codec


class BenchResult(Protocol):
    """What every form's run returns: a text table and its JSON-ready data."""

    def table(self) -> str:
        """The result as text, for the terminal."""
        ...  # pragma: no cover - a protocol's method has no body of its own

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data, what ``--out`` writes."""
        ...  # pragma: no cover


@dataclass(frozen=True)
class Form:
    """One ``tilefeed bench`` form.

    Parameters
    ----------
    name
        The word after ``tilefeed bench``.
    summary
        One line, for the listing in ``tilefeed bench --help``.
    description
        The form's own ``--help`` paragraph.
    options
        Adds the form's options to its parser.
    run
        Runs the bench from the parsed options and returns its result.
    """

    name: str
    summary: str
    description: str
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], BenchResult]

    def parser(self) -> argparse.ArgumentParser:
        """The form's parser, with its options and their old spellings (hidden)."""
        p = form_parser(f"tilefeed bench {self.name}", self.description)
        self.options(p)
        add_renamed(p, f"bench {self.name}")
        return p


def run_form(form: Form, argv: list[str]) -> int:
    """Parse ``argv`` with ``form``'s parser, run it, print its table and, with ``--out``, write
    its data there as JSON. Exit status 1 when the result says it failed (``ok`` false), else 0."""
    args = form.parser().parse_args(argv)
    result = form.run(args)
    print(result.table())
    json_path: Path | None = getattr(args, "out", None)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.as_dict(), indent=2))
        print(f"json: {json_path}")
    return 0 if getattr(result, "ok", True) else 1


def _preprocess_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=2400, store=False)
    p.add_argument("--tile", type=int, default=224, help="tile side in pixels")
    p.add_argument("--codec", default="lz4", help="tile codec")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians reported")


def _preprocess(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.preprocess import bench_preprocess

    return bench_preprocess(args.images or demo_images(args.count), size=args.tile, codec=args.codec,
                            rounds=args.rounds)


PREPROCESS = Form(
    "preprocess", "preprocessing throughput against bare PIL decode + resize",
    "Preprocessing throughput against bare PIL decode+resize.", _preprocess_options, _preprocess)


def _loader_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=4800)
    loop_args(p, rounds=5)
    p.add_argument("--peer", choices=("ffcv",), default=None,
                   help="add a peer loader on the same tiles, raw and JPEG, with its recommended "
                   "pipeline, in rounds interleaved with tilefeed's")
    p.add_argument("--peer-python", default=None,
                   help="the Python of the peer's own environment (FFCV pulls plain Pillow and "
                   "OpenCV, so it usually lives apart): e.g. .ffcv-venv/bin/python, which "
                   "make ffcv-venv builds")
    p.add_argument("--codec", default="lz4", choices=[c.value for c in Codec if c is not Codec.JPEG],
                   help="codec of the lossless store made without --store (none: raw pixels, "
                   "as FFCV's raw store)")
    p.add_argument("--sizes", type=positive_list, default=None,
                   help="comma list of output sizes (e.g. 128,160,192,224): training img/s at each "
                   "from the same --tile px stores, lossless and JPEG with reduced-scale decoding "
                   "on and off, one Loader each changing size, and JPEG decode speed per DCT scale")
    p.add_argument("--tile", type=int, default=256, help="tile side in pixels of the stores made for --sizes")
    p.add_argument("--mixture", action=argparse.BooleanOptionalAction, default=True,
                   help="add a row: the uint8 Loader over a 50/50 Mix of two halves of the store "
                   "(made once in the cache from its source paths, with its settings), the same "
                   "samples, and the mixture / single store ratio")


def _loader(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.loader import bench_loaders, bench_sizes
    from tilefeed.store.errors import ConfigError

    if args.peer and not args.peer_python:
        raise ConfigError("--peer ffcv needs --peer-python: the Python of an environment with FFCV")
    images = args.images or demo_images(args.count)
    if args.sizes:
        sizes = args.sizes
        lossless = demo_store(images, size=args.tile, codec=args.codec, fit=Fit.CROP)
        jpeg = demo_store(images, size=args.tile, codec=Codec.JPEG, fit=Fit.CROP)
        return bench_sizes(lossless, jpeg, sizes, batch_size=args.batch_size, workers=args.workers,
                           rounds=args.rounds)
    store = args.store or demo_store(images, codec=args.codec, fit=Fit.CROP)  # the read path alone
    jpeg_store = demo_store(images, codec=Codec.JPEG, fit=Fit.CROP) if args.peer else None
    return bench_loaders(images, store, batch_size=args.batch_size, workers=args.workers,
                         rounds=args.rounds, peer_python=args.peer_python if args.peer else None,
                         jpeg_store=jpeg_store, halves=_halves(store) if args.mixture else None)


LOADER = Form(
    "loader", "the Loader alone against a tile copy and a PIL DataLoader (and FFCV)",
    "Loader-alone throughput: tilefeed against a memcpy of the decoded tiles and a PIL "
    "DataLoader. The default image count makes epochs long enough that the pipeline "
    "refill at each epoch's start (a few ms) does not dominate.", _loader_options, _loader)


def _halves(store: str | Path) -> tuple[Path, Path] | None:
    """The two halves of a local store, in the cache beside the demo stores, named by the
    store's full path; none for a bucket store (the halves would be local: other reads)."""
    if isinstance(store, str):
        print("no mixture row: the store is in a bucket", flush=True)
        return None
    import hashlib

    from tilefeed.bench.fixtures.halves import check_halves, split_store
    from tilefeed.cli.progress import progress_bar
    from tilefeed.pipeline.reading.reader import StoreReader
    from tilefeed.store.errors import one_line

    where = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:8]
    try:
        halves = split_store(store, cache_dir() / f"{store.name}-{where}-halves",
                             progress=progress_bar(sys.stderr.isatty()))
        with StoreReader(store) as reader:
            check_halves(reader, halves)
        return halves
    except Exception as e:  # noqa: BLE001 - whatever stops the halves drops their row, not the bench
        print(f"no mixture row: {one_line(e)}", flush=True)
        return None


def _cloud_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=9600)
    loop_args(p, rounds=3)
    p.add_argument("--step-ms", type=float, default=50.0,
                   help=f"the emulated step, in ms per batch; longer than the loader benches' "
                   f"{STEP_MS:g}: a step the local store keeps up with (a few %% stall), so what "
                   "the bucket adds shows")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every request")
    p.add_argument("--rate-mb", type=float, default=100.0, help="MB/s cap per connection")
    p.add_argument("--shard-size", type=int, default=256,
                   help="tiles per shard of the store made without --store (about 5 MB at 224 px "
                   "JPEG: a small first fetch, many concurrent ones)")


def _cloud(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.cloud import bench_cloud

    store = args.store or demo_store(args.images or demo_images(args.count), codec=Codec.JPEG,
                                     shard_size=args.shard_size)
    return bench_cloud(store, batch_size=args.batch_size, step_ms=args.step_ms, latency_ms=args.latency_ms,
                       rate_mb=args.rate_mb, workers=args.workers, rounds=args.rounds)


CLOUD = Form(
    "cloud", "a store in a bucket (local S3, 20 ms, 100 MB/s) against local disk",
    "A JPEG store read from a bucket (a local S3 server behind a proxy that adds latency "
    "to every request and caps each connection's rate) against the same store on local "
    "disk: stall and images/s of a cold-cache epoch and a warm one, shuffle='shard', "
    "train augmentation, an emulated step; rounds interleaved, medians and ranges.", _cloud_options, _cloud)


def _clients_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians and ranges reported")
    out_arg(p)


def _clients(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.clients import bench_clients

    return bench_clients(rounds=args.rounds)


CLIENTS = Form(
    "clients", "obstore against s3fs: whole shards and tile ranges, in MB/s",
    "obstore (what tilefeed uses) against fsspec's s3fs, when installed, on one local S3 "
    "server: whole-shard GETs and a batch of tile-sized ranges of one shard, in MB/s.",
    _clients_options, _clients)


def _parts_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=1600)
    loop_args(p, rounds=5)


def _parts(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.parts import bench_parts

    store = args.store or demo_store(args.images or demo_images(args.count), fit=Fit.CROP)
    return bench_parts(store, batch_size=args.batch_size, workers=args.workers, rounds=args.rounds)


PARTS = Form(
    "parts", "the CPU path's design choices, each pair measured side by side",
    "The measurements behind the Loader's CPU path, each pair side by side in one run: "
    "decoding into fresh or reused batch memory, resizing training windows with "
    "pillow-simd or DALI, JPEG decoding by DALI or simplejpeg with the accurate or the "
    "fast IDCT, an epoch's first batch against the others.", _parts_options, _parts)


def _stats_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=1600)
    loop_args(p, rounds=7)
    p.add_argument("--step-ms", type=float, default=10.0,
                   help=f"the emulated step of the advice runs, in ms per batch; shorter than the "
                   f"loader benches' {STEP_MS:g}: shorter than one worker's batch, so the Loader is "
                   "input-bound and its advice has something to fix")
    p.add_argument("--steps", type=int, default=40, help="measured steps of each advice run")


def _stats(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.stats import bench_stats

    images = args.images or demo_images(args.count)
    store = args.store or demo_store(images)
    jpeg = demo_store(images, codec=Codec.JPEG)
    return bench_stats(store, jpeg, batch_size=args.batch_size, workers=args.workers, rounds=args.rounds,
                       step_ms=args.step_ms, steps=args.steps)


STATS = Form(
    "stats", "what Loader.stats() costs, and whether its advice helps",
    "What Loader.stats() costs (samples/s with its clocks on and off, interleaved "
    "rounds) and whether its advice helps (a Loader made decode-bound on purpose: a "
    "JPEG store, one worker, training on the CPU; its stats name the stage and the "
    "change, which is then applied and the two stalls compared).", _stats_options, _stats)


def _scale_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--classes", type=positive_list, default="100,1000",
                   help="comma list: class folders of each set (x --per-class sources)")
    p.add_argument("--per-class", type=int, default=1281, help="sources per class folder")
    p.add_argument("--tile", type=int, default=8, help="tile side in pixels")
    p.add_argument("--processes", type=int, default=2, help="preprocessing's worker processes")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch of the rate runs")
    p.add_argument("--warmup", type=int, default=50, help="batches before the rate is timed")
    p.add_argument("--batches", type=int, default=400, help="batches timed per rate run")
    p.add_argument("--rounds", type=int, default=3, help="timed runs per store; medians reported")
    p.add_argument("--out-dir", type=Path, default=None, metavar="DIR",
                   help="folder for the sets and stores (default: the cache folder's 'scale')")
    p.add_argument("--order-samples", type=int, default=400_000_000,
                   help="samples of the epoch whose order is measured (no store is made)")
    p.add_argument("--order-world-size", type=int, default=64,
                   help="ranks sharing the epoch whose order is measured")
    out_arg(p)


def _scale(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.order_cost import order_cost
    from tilefeed.bench.suites.scale import run_scale

    classes = args.classes
    result = run_scale(args.out_dir or cache_dir() / "scale", classes, per_class=args.per_class,
                       size=args.tile, workers=args.processes, batch_size=args.batch_size,
                       warm=args.warmup, timed=args.batches, rounds=args.rounds)
    result.order = [order_cost(args.order_samples, args.order_world_size, shuffle=shuffle)
                    for shuffle in ("global", "shard")]
    return result


SCALE = Form(
    "scale", "writer, reader and epoch order as the store grows",
    "What the writer, the reader and the order cost as a store grows: ImageNet-shaped "
    "sets of tiny JPEGs (hard links, so a million sources take seconds and megabytes) "
    "preprocessed at each size; per size the writer driver's peak memory and CPU per "
    "source, a fresh process's store open, the random-order uint8 rate (each "
    "store's Loader in turn in one process, round by round), and tilefeed info / "
    "verify; then one rank's epoch order at --order-samples.", _scale_options, _scale)


# small tiles and few samples: the soak's epochs are short, so the many-epoch patterns run many
SOAK_IMAGES = 120
SOAK_TILE = 64


def _soak_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", type=Path, metavar="STORE", nargs="?", default=None,
                   help="the store every pattern's loaders read (default: a store of 120 generated "
                        "images, 8 classes, 64 px tiles, made in the cache)")
    p.add_argument("--seconds", type=float, default=60.0, help="total run time, shared by the patterns")
    loop_args(p, batch_size=16)
    p.add_argument("--limit-kb", type=float, default=10.0,
                   help="RSS growth per loader or epoch that still passes")
    out_arg(p)
    p.add_argument("--only", default=None,
                   help="comma list of the patterns to run (by name, as the table shows them)")


def _soak(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.soak import SoakResult, format_row, soak

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    # each pattern's row as it ends, on stderr: the table on stdout comes whole at the end
    store = args.store or demo_store(demo_images(SOAK_IMAGES), size=SOAK_TILE)
    patterns = soak(store, seconds=args.seconds, batch_size=args.batch_size, workers=args.workers,
                    limit_kb=args.limit_kb, on_result=lambda r: print(format_row(r), file=sys.stderr,
                                                                      flush=True),
                    only=only)
    return SoakResult(patterns, limit_kb=args.limit_kb)


SOAK = Form(
    "soak", "memory, threads and files over the loader patterns of long jobs",
    "Memory, threads, open files and shared memory over the loader patterns of long "
    "jobs (one loader over many epochs, a loader per epoch, leaving an epoch early, an "
    "exception in the loop, train and validation loaders at once, one loader whose "
    "output size changes every epoch for at least 50 epochs); exit 1 when any grows "
    "after warm-up.", _soak_options, _soak)


def training_args(p: argparse.ArgumentParser, runs_per: str, epochs_help: str) -> None:
    """The options of the forms that train a network: seeds, epochs, where the JSON goes."""
    p.add_argument("--seeds", type=int, default=5, help=f"training runs per {runs_per}")
    p.add_argument("--epochs", type=int, default=10, help=epochs_help)
    out_arg(p)


def _aspect(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.aspect import bench_aspect

    return bench_aspect(seeds=args.seeds, epochs=args.epochs)


ASPECT = Form(
    "aspect", "training crops: aspect-true vs centre-square tiles vs torchvision",
    "Train one small network three ways on a task whose label lies near the picture's "
    "border: torchvision's crop rule on the original pictures, tilefeed with aspect-true "
    "tiles (--fit pad) and with centre-square tiles (--fit crop); validation accuracy "
    "on the same whole pictures.", lambda p: training_args(p, "view", "epochs of each training"), _aspect)


def _schedule_options(p: argparse.ArgumentParser) -> None:
    training_args(p, "schedule", "epochs of the fixed-size run")
    p.add_argument("--low", type=int, default=32, help="the ramp's first size in pixels; the full size is 64")


def _schedule(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.resize_schedule import bench_schedule

    return bench_schedule(seeds=args.seeds, epochs=args.epochs, low=args.low)


SCHEDULE = Form(
    "schedule", "progressive resizing against a fixed size, at equal wall-clock",
    "Progressive resizing's effect on training at equal wall-clock: aspect's task, one "
    "network trained at the full size every epoch and with FFCV's ramp from --low up "
    "to it (as many epochs as take the same time, by the training loop timed at each "
    "size); validation accuracy at the full size, per seed.", _schedule_options, _schedule)


def _gpu_report_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=2048, store=False)
    p.set_defaults(out=Path("bench-out/gpu-report.json"))  # the report is always written
    p.add_argument("--tiles", default="224,256",
                   help="tile sides in pixels of the JPEG stores made from --images (comma list)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch, every loader")
    p.add_argument("--batches", type=int, default=30, help="measured batches per loader")
    p.add_argument("--workers", type=int, default=4, help=WORKERS_HELP)
    p.add_argument("--model-steps", type=int, default=20, help="measured steps per feed at the model")
    p.add_argument("--tests-xml", type=Path, default=None,
                   help="JUnit XML of the gpu tests (pytest --junitxml) to include in the report")


def _gpu_report(args: argparse.Namespace) -> BenchResult:
    import torch

    from tilefeed.bench.suites.gpu_report import gpu_report, junit_summary
    from tilefeed.store.errors import ConfigError

    tiles = _sides(args.tiles)
    if not torch.cuda.is_available():
        raise ConfigError("gpu-report needs a CUDA device (torch.cuda.is_available() is False)")
    images = args.images or demo_images(args.count)
    stores = {tile: demo_store(images, size=tile, codec=Codec.JPEG) for tile in tiles}
    report = gpu_report(images, stores, device=torch.device("cuda"), batch_size=args.batch_size,
                        batches=args.batches, workers=args.workers, model_steps=args.model_steps)
    if args.tests_xml:
        report.tests = junit_summary(args.tests_xml)
    return report


GPU_REPORT = Form(
    "gpu-report", "on a CUDA device: decode, device memory, stall at a ResNet-50 step",
    "On a CUDA device: JPEG decode and augmentation on the GPU (tilefeed's nvJPEG tiles, "
    "DALI's file reader, torchvision's decode_jpeg) at each tile side, which JPEG decoder "
    "ran (the hardware engine or CUDA), peak and growing device memory, and the stall "
    "at a bf16 ResNet-50 step against synthetic data; one JSON report, failures "
    "recorded in it.", _gpu_report_options, _gpu_report)


def _recipe_options(p: argparse.ArgumentParser) -> None:
    data_args(p, count=1600)
    p.add_argument("--batch-size", type=positive, default=64, help="samples per batch, both sides")
    p.add_argument("--workers", type=whole_number, default=None,
                   help="DataLoader processes and Loader threads (default: the usable cores, as "
                   "users of each run them)")
    p.add_argument("--step-ms", type=float, default=50.0, help="the emulated step the stall is measured at, "
                   "in ms per batch")
    p.add_argument("--steps", type=positive, default=40, help="measured steps per run")
    p.add_argument("--rounds", type=positive, default=3, help="interleaved rounds; medians reported")
    p.add_argument("--operations", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure each operation alone (crop and flip, then each one added)")


def _recipe(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.recipe import bench_recipe
    from tilefeed.preprocess.sources.finding import find_sources

    images = args.images or demo_images(args.count)
    store = args.store or demo_store(images)
    classes = len(set(find_sources(images).labels))
    return bench_recipe(images, store, classes=classes, batch_size=args.batch_size, workers=args.workers,
                        step_ms=args.step_ms, steps=args.steps, rounds=args.rounds,
                        operations=args.operations)


RECIPE = Form(
    "recipe", "torchvision's ResNet-50 recipe: the Loader against its reference DataLoader",
    "torchvision's ResNet-50 training recipe (TrivialAugmentWide, random erasing 0.1, mixup 0.2 / "
    "cutmix 1.0, crop 176) through the Loader, built by the adapter a swapped train.py calls, "
    "against the DataLoader torchvision's reference script builds (its presets' transforms v2 "
    "and MixUp/CutMix collate, num_workers = cores) on the same samples: images/s with no step, "
    "the stall at --step-ms, and what each operation costs on each side.", _recipe_options, _recipe)


def _detection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--images", type=Path, default=None, help="a COCO-format image folder (default: a "
                   "generated set of shapes on photo-like backgrounds, in the cache)")
    p.add_argument("--annotations", type=Path, default=None, help="its COCO instances JSON (with --images)")
    p.add_argument("--store", type=location, default=None, help="the store made from them with "
                   "--annotations (default: made in the cache)")
    p.add_argument("--count", type=positive, default=512, help="generated images, without --images")
    out_arg(p)
    p.add_argument("--batch-size", type=positive, default=32, help="images per batch, both sides")
    p.add_argument("--size", type=positive, default=320, help="output side: the crop is resized to it")
    p.add_argument("--masks", action=argparse.BooleanOptionalAction, default=True,
                   help="instance masks as well as boxes")
    p.add_argument("--workers", type=whole_number, default=None,
                   help="DataLoader processes and Loader threads (default: the usable cores)")
    p.add_argument("--step-ms", type=float, default=50.0, help="the emulated step the stall is measured at, "
                   "in ms per batch")
    p.add_argument("--steps", type=positive, default=30, help="measured steps per run")
    p.add_argument("--rounds", type=positive, default=3, help="interleaved rounds; medians reported")


def _detection(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.detection import bench_detection
    from tilefeed.store.errors import ConfigError

    if (args.images is None) != (args.annotations is None):
        raise ConfigError("--images and --annotations go together: a COCO folder and its instances JSON")
    images, annotations = (args.images, args.annotations) if args.images else demo_coco(args.count)
    store = args.store or demo_coco_store(images, annotations, args.size, args.masks)
    return bench_detection(images, annotations, store, batch_size=args.batch_size, size=args.size,
                           workers=args.workers, masks=args.masks, step_ms=args.step_ms, steps=args.steps,
                           rounds=args.rounds)


DETECTION = Form(
    "detection", "boxes and masks: the Loader against a DataLoader with torchvision v2's transforms",
    "Detection training input: each image's boxes (and instance masks) following a random-resized "
    "crop to --size and a flip, through the Loader (a store made with --annotations) and through a "
    "DataLoader of torchvision's CocoDetection wrapped for transforms v2 with the same geometry "
    "(num_workers = cores), on the same images: images/s with no step and the stall at --step-ms.",
    _detection_options, _detection)


def _clip_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", type=Path, default=None, metavar="DIR",
                   help="a folder of img2dataset-style .tar shards (KEY.jpg, KEY.txt, KEY.json), at least "
                   "--workers of them (default: generated photographs with captions, in the cache)")
    p.add_argument("--count", type=positive, default=2048, help="generated samples, without --shards (256 "
                   "a tar)")
    p.add_argument("--size", type=positive, default=224, help="output side in pixels (ViT-B-32's 224)")
    loop_args(p, rounds=3)
    p.add_argument("--steps", type=positive, default=30, help="measured steps per run")
    p.add_argument("--step-ms", type=float, default=50.0, help="the emulated step the stall is measured at, "
                   "in ms per batch")
    out_arg(p)


def _clip(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.clip import bench_clip, make_clip_shards

    shards = args.shards
    if shards is None:
        shards = cache_dir() / f"clip-shards-{args.count}"
        print(f"shards: {shards} ({args.count} generated photographs with captions, made once, then reused)",
              flush=True)
        make_clip_shards(shards, count=args.count)
    return bench_clip(shards, cache_dir() / "clip-work", batch_size=args.batch_size, workers=args.workers,
                      size=args.size, steps=args.steps, step_ms=args.step_ms, rounds=args.rounds)


CLIP = Form(
    "clip", "open_clip's input from img2dataset shards: the Loader against WebDataset and LitData",
    "open_clip's training input (random-resized crop 0.9-1, CLIP's normalisation, ViT-B-32 tokens) from "
    "the same img2dataset-style shards: the Loader over stores made by tilefeed preprocess (JPEG tiles "
    "no larger than the tars, and lz4 tiles), open_clip's WebDataset pipeline (get_wds_dataset) over "
    "the tars, and LitData's StreamingDataset over litdata.optimize's copy (where litdata is installed): "
    "images/s with no step, the stall at --step-ms, bytes on disk and conversion seconds; each round "
    "converts again, rows alternate their order, medians and ranges.", _clip_options, _clip)


def _device_graph_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count", type=positive, default=24, help="generated pictures (with boxes and masks)")
    p.add_argument("--tile", type=positive, default=64, help="the stores' tile side, in pixels")
    p.add_argument("--size", type=positive, default=48, help="the output side, in pixels")
    p.add_argument("--cuda", action="store_true",
                   help="also run the graph on the current CUDA device, a column of its own")
    out_arg(p)


def _device_graph(args: argparse.Namespace) -> BenchResult:
    from tilefeed.bench.suites.device_graph import bench_device_graph

    return bench_device_graph(cache_dir() / "device-graph", count=args.count, tile=args.tile, size=args.size,
                              cuda=args.cuda, progress=lambda cell: print(cell, file=sys.stderr, flush=True))


DEVICE_GRAPH = Form(
    "device-graph", "the GPU's graph on DALI's CPU backend against the host path, cell by cell",
    "The graph a GPU Loader builds, run on DALI's CPU backend (TILEFEED_DEVICE_GRAPH=1) against a "
    "CPU Loader's own path (cut, resize and recipe in its reader threads), over store codecs (lz4, "
    "none, jpeg) x tile fits (pad, crop) x recipes (evaluation, crop, colour jitter, "
    "TrivialAugmentWide, RandAugment, the photometric distortion, large-scale jitter, zoom-out + IoU "
    "crop, erasing, mixup/cutmix) x outputs (float32 NCHW, channels_last, uint8), with boxes and "
    "instance masks: each cell's mean and largest difference in levels, whether the targets are "
    "equal, and for plain crops and framing the host path against torchvision's own calls. Exit "
    "status 1 when a cell is over its recipe's stated tolerance.", _device_graph_options, _device_graph)


def _sides(text: str) -> list[int]:
    """A comma list of tile sides, each a positive integer."""
    from tilefeed.store.errors import ConfigError

    try:
        sides = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ConfigError(f"--tiles takes a comma list of sides in pixels, got {text!r}") from None
    if not sides or min(sides) < 1:
        raise ConfigError(f"--tiles takes a comma list of positive sides in pixels, got {text!r}")
    return sides
