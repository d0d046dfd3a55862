"""What the commands share on their command lines: the vocabulary (one option name per concept,
the old spellings still taken for a release), the one help style, and the argument types, each
of which turns a command-line word into a value or says, in one line, what it expected."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any


def _at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value}")
    return value


def whole_number(text: str) -> int:
    """A number >= 0."""
    return _at_least(text, 0)


def positive(text: str) -> int:
    """A number >= 1."""
    return _at_least(text, 1)


def _listed(text: str, kind: type[int] | type[float]) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers i,j,k, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def number_list(text: str) -> list[int]:
    """Comma-separated whole numbers, at least one: ``i,j,k``."""
    return _listed(text, int)


def positive_list(text: str) -> list[int]:
    """Comma-separated numbers >= 1, at least one (sizes, counts)."""
    values: list[int] = _listed(text, int)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got {text!r}")
    return values


def decimal_list(text: str) -> list[float]:
    """Comma-separated numbers, decimals allowed, at least one: ``0,12.5,40``."""
    return _listed(text, float)


# -- the vocabulary: one option name per concept, across every command --------------------------


@dataclass(frozen=True)
class Term:
    """One option of the ``tilefeed`` vocabulary.

    Parameters
    ----------
    concept
        What the option is about, in a few words; no two options share one.
    meaning
        What its value means, the same in every command that takes it.
    units
        The value's units or shape (``-`` for a flag).
    """

    concept: str
    meaning: str
    units: str


# Every option of every command is one of these, with this meaning; docs/cli-vocabulary.md is this
# table (tests/cli/test_vocabulary.py holds the two and every parser to it).
VOCABULARY: dict[str, Term] = {
    "--help": Term("help", "show the command's help and exit", "-"),
    "--version": Term("version", "show tilefeed's version and exit", "-"),
    # the store and what it is made from
    "--storage-option": Term("storage setting", "a setting for a store URL, added to the cloud's "
                             "standard configuration; repeat for more", "KEY=VALUE"),
    "--images": Term("source images", "the source JPEG folder, one subfolder per class", "folder"),
    "--shards": Term("source shards", "a folder of WebDataset .tar shards, img2dataset's layout", "folder"),
    "--store": Term("store", "a tilefeed store (a folder or a bucket URL)", "folder or URL"),
    "--count": Term("how many", "how many items: the images generated when no --images or --shards is "
                    "given (bench, demo), the samples drawn (show)", "items"),
    "--tile": Term("tile side", "the side of a store's square tiles", "pixels"),
    "--tiles": Term("tile sides", "several tile sides, one store each", "pixels, comma list"),
    "--codec": Term("tile codec", "how a store's tiles are compressed", "lz4, zstd, none, jpeg"),
    "--quality": Term("JPEG quality", "the quality of --codec jpeg", "1..100"),
    "--shard-size": Term("shard size", "tiles per shard file", "tiles"),
    "--mode": Term("tiling mode", "resize: one tile per image; grid: TxT tiles cut from each", "choice"),
    "--fit": Term("tile fit", "how a picture fills its tile: pad, crop or stretch", "choice"),
    "--stride": Term("grid stride", "grid mode: pixels between tile origins", "pixels"),
    "--resample": Term("resampling filter", "the antialiased filter that resizes pictures", "choice"),
    "--background": Term("background colour", "under transparent pixels, pad borders, grid edges",
                         "R,G,B or #rrggbb"),
    "--icc": Term("ICC profiles", "ignore embedded profiles, or convert the pixels to sRGB", "choice"),
    "--max-pixels": Term("largest image", "larger sources are rejected (decompression bombs)", "pixels"),
    "--worker-memory": Term("memory per process", "the most one worker process may use for one "
                            "image", "bytes (2G, 512M)"),
    "--scheduler": Term("cluster", "a Dask distributed scheduler to run the work on", "address"),
    "--labels": Term("manifest labels", "how a manifest's labels are read: auto, int or names", "choice"),
    "--allow-duplicates": Term("duplicate rows", "keep a path a manifest lists more than once", "-"),
    "--allow-outside": Term("rows outside", "let a manifest name files outside its own folder", "-"),
    "--allow-bucket": Term("manifest buckets", "a bucket a manifest's URL rows may read; repeat "
                           "for more", "bucket"),
    "--allow-empty-classes": Term("empty classes", "keep a class folder with no files", "-"),
    "--annotations": Term("COCO annotations", "a COCO instances JSON whose boxes (and masks) go into "
                          "the store with its images", "file"),
    "--max-annotations-size": Term("annotations size limit", "the largest COCO annotations file "
                                   "read; a larger one is refused unread", "bytes (1G, 512M)"),
    "--instance-masks": Term("instance masks", "store each object's mask from the annotations too", "-"),
    "--yolo": Term("YOLO labels", "SRC holds images/ and labels/ of YOLO boxes", "-"),
    "--masks": Term("semantic masks", "a folder of class-id PNGs, one per image by its path", "folder"),
    "--source": Term("source kind", "what SRC is: auto (decided from SRC), folders, manifest, webdataset, "
                                    "parquet or table", "choice"),
    "--image-key": Term("tar image members", "a tar sample's image: the first member with one of these "
                        "extensions (open_clip's --image-key)", "extensions, ';'-separated"),
    "--caption-key": Term("caption names", "the captions kept per sample: a tar's .txt (caption) and .json "
                                           "fields, or columns", "names, comma-separated"),
    "--fields": Term("metadata fields", "the metadata fields kept per sample: a tar's .json fields, or "
                                        "columns", "names, comma-separated"),
    "--image-column": Term("parquet image column", "the parquet column holding each image's bytes", "column"),
    "--csv-img-key": Term("table image column", "a caption table's column of image paths (open_clip's "
                                                "--csv-img-key)", "column"),
    "--csv-caption-key": Term("table caption column", "a caption table's column of captions (open_clip's "
                                                      "--csv-caption-key)", "column"),
    "--csv-separator": Term("table separator", "a caption table's column separator (open_clip's "
                                               "--csv-separator)", "character"),
    "--label-key": Term("sample labels", "a class label per image-text sample, from a .json field or a "
                                         "column", "name"),
    "--strict": Term("strict", "exit 1 when any input was rejected", "-"),
    "--overwrite": Term("overwrite", "replace the tilefeed store already there", "-"),
    "--deep": Term("deep check", "also decode every tile", "-"),
    # who does the work
    "--processes": Term("worker processes", "the processes the command itself starts to do its "
                        "work", "processes"),
    "--workers": Term("loader workers", "each loader's num_workers, one count for every loader "
                      "compared: a torch DataLoader's worker processes, the Loader's and DALI's "
                      "threads", "workers"),
    # what a batch is
    "--batch-size": Term("batch size", "samples per batch", "samples"),
    "--size": Term("output side", "the side of the images a batch holds", "pixels"),
    "--sizes": Term("output sides", "several output sides, one run each", "pixels, comma list"),
    "--output": Term("batch layout", "float32 NCHW, float32 channels_last or uint8 NHWC", "choice"),
    "--train": Term("training view", "training crops and flips, in the shuffled order", "-"),
    "--eval": Term("evaluation view", "evaluation framing instead of training crops", "-"),
    "--epoch": Term("epoch", "the epoch whose order and crops are used", "epoch number"),
    "--seed": Term("seed", "the Loader's seed", "integer"),
    "--samples": Term("chosen samples", "these samples, in this order", "indices, comma list"),
    "--device": Term("device", "where batches and the step live", "cuda[:N] or cpu"),
    "--cuda": Term("CUDA as well", "also run on the current CUDA device, beside what runs on the CPU", "-"),
    # what is measured, and how
    "--loaders": Term("loaders compared", "the loaders run side by side", "names, comma list"),
    "--peer": Term("peer loader", "a loader of another project added to the comparison", "choice"),
    "--peer-python": Term("peer's Python", "the Python of the peer's own environment", "path"),
    "--step": Term("step kind", "emulated: a sleep that leaves the host free; model: a real "
                   "forward/backward/optimizer step", "choice"),
    "--step-ms": Term("step length", "the emulated accelerator step per batch", "milliseconds"),
    "--steps": Term("measured steps", "training steps measured per run", "steps"),
    "--warmup": Term("warm-up", "iterations run first and left out of the figures", "steps or batches"),
    "--batches": Term("measured batches", "batches measured per run, the loader alone", "batches"),
    "--model-steps": Term("model steps", "steps measured per feed at the model", "steps"),
    "--accumulate": Term("micro-batches", "model step: micro-batches per optimizer step", "batches"),
    "--model-width": Term("model width", "model step: the first stage's width", "channels"),
    "--rounds": Term("rounds", "repeated runs, interleaved where there are several sides; "
                     "medians reported", "rounds"),
    "--seconds": Term("run time", "the total time of a run", "seconds"),
    "--over": Term("swept setting", "the setting a sweep varies", "choice"),
    "--values": Term("swept values", "the values a sweep takes", "numbers, comma list"),
    "--mixture": Term("mixture row", "add the row of a 50/50 Mix of the store's two halves", "-"),
    "--operations": Term("operation rows", "add the rows of each recipe operation alone", "-"),
    "--latency-ms": Term("request latency", "added to every request to the bucket", "milliseconds"),
    "--rate-mb": Term("connection rate", "the cap of each connection to the bucket", "MB/s"),
    "--limit-kb": Term("growth limit", "the growth that still passes", "KB"),
    "--only": Term("chosen patterns", "the patterns run, by name", "names, comma list"),
    "--seeds": Term("training runs", "training runs, each with a seed of its own", "runs"),
    "--epochs": Term("epochs", "epochs of each training run", "epochs"),
    "--low": Term("ramp start", "the first size of a progressive-resizing ramp", "pixels"),
    "--classes": Term("class counts", "class folders of each generated set", "folders, comma list"),
    "--per-class": Term("sources per class", "sources in each class folder", "files"),
    "--order-samples": Term("order's samples", "samples of the epoch whose order is measured", "samples"),
    "--order-world-size": Term("order's ranks", "ranks sharing the epoch whose order is measured",
                               "ranks"),
    "--tests-xml": Term("test results", "JUnit XML of a pytest run to include in a report", "path"),
    # what is shown or written, and where
    "--json": Term("JSON on stdout", "print the result as JSON on stdout instead of text", "-"),
    "--out": Term("output file", "the file the command writes its result to", "path"),
    "--out-dir": Term("output folder", "the folder the command writes its files into", "folder"),
    "--plots": Term("plot folder", "the folder for PNG plots, beside the table", "folder"),
    "--quiet": Term("quiet", "no progress bar (and no summary)", "-"),
    "--stored": Term("stored tiles", "the tiles as written, not as the Loader gives them", "-"),
    "--rejects": Term("rejects", "the inputs preprocessing rejected, with their reasons", "-"),
    "--pil": Term("PIL only", "check the PIL build only", "-"),
    "--offline": Term("offline install", "a node installed from a wheelhouse: PIL gaps are warnings",
                      "-"),
}

# The old spellings each command still takes for a release, hidden from its help: old -> new.
# The keys are the commands and forms as typed after ``tilefeed`` ("bench" alone: the main form).
RENAMED: dict[str, dict[str, str]] = {
    "preprocess": {"--size": "--tile", "--workers": "--processes"},
    "demo": {"--out": "--out-dir"},
    "bench preprocess": {"--size": "--tile", "--json": "--out"},
    "bench scale": {"--size": "--tile", "--workers": "--processes", "--warm": "--warmup",
                    "--timed": "--batches", "--root": "--out-dir", "--json": "--out"},
    **{f"bench {form}".rstrip(): {"--json": "--out"}
       for form in ("", "loader", "sweep", "diagnose", "soak", "aspect", "schedule", "gpu-report",
                    "cloud", "clients", "parts", "stats")},
}


class HelpFormatter(argparse.HelpFormatter):
    """The one help style of every ``tilefeed`` parser: an option's default appended once, as
    ``(default: X)``, unless its help already says it, the default is None (computed: the help
    says how) or the option is a flag; a paragraph of indented lines (a listing, examples) kept
    as written rather than wrapped into one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("(default" in text or "%(default)" in text or default is None or default is False
                or default == [] or default is argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        return "\n\n".join(part if "\n  " in part else fill(part, width, indent)
                           for part in text.split("\n\n"))


class _Renamed(argparse.Action):
    """An old spelling of an option: stores its value where the new one does, and says once on
    stderr that it is deprecated, naming the new spelling."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.noted = False

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if not self.noted:
            self.noted = True
            print(f"{parser.prog}: note: {option_string} is deprecated and will be removed; "
                  f"use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed(p: argparse.ArgumentParser, command: str) -> None:
    """Add ``command``'s old spellings (``RENAMED``) to ``p``, hidden from its help: each takes
    what its new spelling takes (already added to ``p``) and writes the same value."""
    for old, new in RENAMED.get(command, {}).items():
        action = p._option_string_actions[new]  # argparse keeps no public index of its options
        # the type as the new spelling's (argparse's own default, str, where it names none)
        p.add_argument(old, dest=action.dest, type=action.type or str, choices=action.choices,
                       metavar=action.metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                       action=_Renamed, new=new)
