"""The README's pictures, each drawn again from what is committed beside it (docs/img/).

    python tools/render_pictures.py record -- tilefeed bench sweep ... --out docs/img/sweep.json
    python tools/render_pictures.py sweep  [docs/img/sweep.json] [docs/img/sweep.png]
    python tools/render_pictures.py stages [docs/img/sweep.json] [docs/img/stages.png]
    python tools/render_pictures.py flow   [docs/img/flow.png]
    python tools/render_pictures.py all    # the three above from the committed JSON

``record`` is ``tools/bench_record.py``: it runs a ``tilefeed bench`` command that writes ``--out FILE``
and adds to that JSON where and how it was made (``provenance``: the command, the commit, the
date, the machine, the load average), so a figure drawn from it can say so. Drawing needs no
bench run: the figures come from the JSON alone
(``tilefeed.bench.harness.plots``). Run it with the repository's ``src`` on PYTHONPATH or
tilefeed installed; matplotlib is the ``plot`` extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"


# -- record: the same stamp as every table's data (tools/bench_record.py) -----------------------------
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_record import record  # noqa: E402 - the tool beside this one, found through its folder


# -- the data-flow diagram -------------------------------------------------------------------------
# each box: (x, y) of its centre in axes units (0..1 across, 0..1 up), its title, its lines and
# the stages ``Loader.stats()`` charges to what it does ("" where none)
FLOW_BOXES: dict[str, tuple[float, float, str, str, str]] = {
    "folder": (0.10, 0.75, "image folder", "one subfolder per class\nJPEG, PNG, WebP, ...", ""),
    "preprocess": (0.30, 0.75, "tilefeed preprocess", "worker processes:\ndecode each source once,\n"
                   "orient, resize to T x T\n(pad fit: its box kept)", ""),
    "store": (0.50, 0.75, "Zarr v3 store", "shards of T x T tiles\nlz4 / zstd / raw or JPEG;\n"
              "labels, boxes, sources", ""),
    "order": (0.10, 0.27, "epoch order", "per rank, from (seed, epoch);\nwindows and flips from\n"
              "(seed, epoch, sample)", ""),
    "readers": (0.30, 0.27, "reader threads", "read tiles, decompress;\non the CPU also decode\n"
                "JPEG, cut + resize crops", "read, decode, resize, download"),
    "graph": (0.50, 0.27, "DALI graph", "GPU: nvJPEG decode,\ncrop + resize, flip,\nnormalise, layout\n"
              "CPU: flip, normalise, layout", "graph"),
    "batches": (0.70, 0.27, "device batches", "(images, labels) made\nready ahead, epoch after\n"
                "epoch, by a feeding thread", "copy"),
    "step": (0.90, 0.27, "training step", "next(loader) takes\nthe batch waiting there", "wait"),
}
FLOW_COLOURS = {"folder": "#eeeeee", "preprocess": "#fde9d9", "store": "#dbe5f1", "order": "#ebf1de",
                "readers": "#ebf1de", "graph": "#e5e0ec", "batches": "#dbe5f1", "step": "#eeeeee"}
# arrows along a row: (from, to, what travels)
FLOW_ARROWS = (("folder", "preprocess", ""), ("preprocess", "store", "tiles"),
               ("order", "readers", "samples"), ("readers", "graph", "pixels\nor JPEG"),
               ("graph", "batches", ""), ("batches", "step", "batch"))
BOX_W, BOX_H = 0.155, 0.30
STAGE_TEXT = "#7f3f00"


def flow_figure() -> Any:
    """The whole path, from an image folder to a training step, as boxes and arrows, each box
    naming the stages ``Loader.stats()`` times there (the stages picture's names)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(11, 5))
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)

    def arrow(a: tuple[float, float], b: tuple[float, float]) -> None:
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, color="#404040",
                                     linewidth=1.3, shrinkA=0, shrinkB=0))

    def frame(left: float, bottom: float, right: float, top: float, text: str) -> None:
        ax.add_patch(FancyBboxPatch((left, bottom), right - left, top - bottom, facecolor="none",
                                    boxstyle="round,pad=0,rounding_size=0.02", edgecolor="#b0b0b0",
                                    linestyle="--"))
        ax.text(left + 0.006, top + 0.008, text, fontsize=8, color="#595959", va="bottom")

    for name, (x, y, title, text, stages) in FLOW_BOXES.items():
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0.003,rounding_size=0.012",
                                    facecolor=FLOW_COLOURS[name], edgecolor="#595959", linewidth=1))
        ax.text(x, y + BOX_H / 2 - 0.03, title, ha="center", va="top", fontsize=10, fontweight="bold")
        ax.text(x, y + BOX_H / 2 - 0.09, text, ha="center", va="top", fontsize=7.2, linespacing=1.3)
        if stages:
            ax.text(x, y - BOX_H / 2 + 0.02, stages, ha="center", va="bottom", fontsize=7, style="italic",
                    color=STAGE_TEXT)
    for start, end, label in FLOW_ARROWS:
        x0, y, *_ = FLOW_BOXES[start]
        x1 = FLOW_BOXES[end][0]
        arrow((x0 + BOX_W / 2, y), (x1 - BOX_W / 2, y))
        if label:
            ax.text((x0 + x1) / 2, y + 0.015, label, ha="center", va="bottom", fontsize=6.5, linespacing=1.1)
    # the store's tiles go down to the reader threads: down, left, down
    (sx, sy, *_), (rx, ry, *_) = FLOW_BOXES["store"], FLOW_BOXES["readers"]
    middle = (sy - BOX_H / 2 + ry + BOX_H / 2) / 2 - 0.01
    ax.plot([sx, sx, rx + 0.03], [sy - BOX_H / 2, middle, middle], color="#404040", linewidth=1.3)
    arrow((rx + 0.03, middle), (rx + 0.03, ry + BOX_H / 2))
    ax.text((sx + rx) / 2 + 0.015, middle + 0.012, "tiles, by ranged reads of shards", ha="center",
            va="bottom", fontsize=7)
    ax.text(0.62, FLOW_BOXES["store"][1], "or in a bucket (s3://, gs://, az://): each node keeps\n"
            "the shards it reads in a local cache (stage: download)", ha="left", va="center", fontsize=7.5,
            color="#595959")
    frame(0.005, 0.575, 0.61, 0.935, "once, offline")
    frame(0.005, 0.095, 0.795, 0.445, "every epoch, on each rank: tilefeed.Loader")
    ax.text(0.995, 0.03, "italic: the stages Loader.stats() times there (the stages picture's names)",
            ha="right", fontsize=7.5, style="italic", color=STAGE_TEXT)
    fig.suptitle("How data flows through tilefeed", x=0.01, ha="left", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


# -- the command -----------------------------------------------------------------------------------
def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["record"]:
        rest = args[1:]
        record(rest[1:] if rest[:1] == ["--"] else rest)
        return 0
    parser = argparse.ArgumentParser(prog="tools/render_pictures.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("picture", choices=("sweep", "stages", "flow", "all"))
    parser.add_argument("paths", nargs="*", type=Path, help="the JSON to draw (not for flow), then the PNG")
    parsed = parser.parse_args(args)
    from tilefeed.bench.harness.plots import save_figure, stages_figure, sweep_figure

    jobs = {"sweep": (sweep_figure, IMG / "sweep.json", IMG / "sweep.png"),
            "stages": (stages_figure, IMG / "sweep.json", IMG / "stages.png")}
    names = list(jobs) + ["flow"] if parsed.picture == "all" else [parsed.picture]
    for name in names:
        paths = parsed.paths if parsed.picture != "all" else []
        if name == "flow":
            out = paths[0] if paths else IMG / "flow.png"
            print(f"wrote {save_figure(flow_figure(), out)}")
            continue
        draw, source, out = jobs[name]
        source = paths[0] if paths else source
        out = paths[1] if len(paths) > 1 else out
        print(f"wrote {save_figure(draw(_load(source)), out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
