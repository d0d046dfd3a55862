"""The options the ``tilefeed bench`` forms share, and the parser each starts from."""

from __future__ import annotations

import argparse
from pathlib import Path

from tilefeed.cli.arguments import HelpFormatter, positive, whole_number


# the emulated step of the forms that run loaders against a step (the main form, sweep, diagnose)
# and of the demo, which runs the main form: one default wherever the step means the same
STEP_MS = 20.0

WORKERS_HELP = ("workers of every loader, one count for all: a torch DataLoader's worker processes, "
                "the Loader's and DALI's threads")


def form_parser(prog: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser a ``tilefeed bench`` form starts from: every option's default in its help, once."""
    return argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                   formatter_class=HelpFormatter)


def location(text: str) -> str | Path:
    """A bucket URL as it is, anything else a local path."""
    from tilefeed.store.storage import is_url

    return text if is_url(text) else Path(text)


def data_args(p: argparse.ArgumentParser, *, count: int, store: bool = True) -> None:
    """--images, --store, --count and --out, as every bench form takes them."""
    p.add_argument("--images", type=Path, default=None, help="source JPEG folder, one subfolder "
                   "per class (default: a generated ImageNet-like set in the cache)")
    if store:
        p.add_argument("--store", type=location, default=None,
                       help="tilefeed store made from --images (a folder, or a bucket URL read "
                       "with the cloud's standard configuration) (default: made in the cache)")
    p.add_argument("--count", type=positive, default=count, help="generated images, without --images")
    out_arg(p)


def out_arg(p: argparse.ArgumentParser) -> None:
    """--out: the file a bench form writes its results to, as JSON."""
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the results as JSON "
                   "to FILE")


def loop_args(p: argparse.ArgumentParser, *, batch_size: int = 64, rounds: int | None = None) -> None:
    """--batch-size, --workers and (for forms that repeat their runs) --rounds."""
    p.add_argument("--batch-size", type=positive, default=batch_size, help="samples per batch, every loader")
    p.add_argument("--workers", type=whole_number, default=2, help=WORKERS_HELP)
    if rounds is not None:
        p.add_argument("--rounds", type=positive, default=rounds, help="interleaved rounds; medians reported")


def harness_args(p: argparse.ArgumentParser, *, loaders: str = "baseline,tilefeed") -> None:
    """The options of the forms that run loaders against a step: the main form, sweep, diagnose."""
    data_args(p, count=1600)
    p.add_argument("--codec", default="lz4", help="codec of the store made without --store "
                   "(jpeg: decoded by nvJPEG on a GPU)")
    p.add_argument("--loaders", default=loaders,
                   help="comma list of baseline, dali-files, tiles-dataloader, tilefeed")
    p.add_argument("--batch-size", type=positive, default=64, help="samples per batch, every loader")
    p.add_argument("--steps", type=int, default=40, help="measured steps per loader")
    p.add_argument("--warmup", type=int, default=3, help="steps run first and left out")
    p.add_argument("--step", choices=("emulated", "model"), default="emulated",
                   help="emulated: a --step-ms accelerator step that leaves the host CPU free; "
                   "model: a ResNet-style forward/backward/optimizer step")
    p.add_argument("--step-ms", type=float, default=STEP_MS, help="the emulated step, in ms per batch")
    p.add_argument("--accumulate", type=int, default=1, help="model step: micro-batches per step")
    p.add_argument("--model-width", type=int, default=None,
                   help="model step: first-stage width (default 64 on a GPU = ResNet-18, 16 on CPU)")
    p.add_argument("--workers", type=whole_number, default=2, help=WORKERS_HELP)
    p.add_argument("--size", type=int, default=224, help="output image side in pixels (and the tile "
                   "side of the store made without --store)")
    p.add_argument("--eval", action="store_true", help="eval augmentation instead of train")
    p.add_argument("--output", choices=("float32", "channels_last", "uint8"), default="float32",
                   help="batches as float32 NCHW (every loader), or tilefeed alone as float32 "
                        "channels_last or uint8 NHWC")
    p.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda if available)")
    p.add_argument("--plots", type=Path, default=None, metavar="DIR", help="folder for PNG plots")
