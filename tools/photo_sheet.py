"""Contact sheets of real photographs, for the docs: docs/img/contact-{stored,train,eval}.png.

    python -m pip install scikit-image     # only for this tool; tilefeed does not depend on it
    PYTHONPATH=src python tools/photo_sheet.py [--work DIR] [--out docs/img]

scikit-image ships a few photographs under free licences (``skimage.data``: public domain or CC0,
each named below with its credit). This tool saves them as JPEGs in class folders, each once
whole and once cut to a tall frame (so the pad fit shows its bars on both sides: the photographs
are all landscape or square), preprocesses the folder with ``tilefeed preprocess --fit pad``,
and draws three sheets of the same samples with ``tilefeed.pipeline.sheet``: the stored tiles
with each picture's box, the training crops of epoch 0 (seed 0), and the evaluation framing.

Where PIL is pillow-simd, ``pip install scikit-image`` lays plain Pillow over it (pip does not
know pillow-simd provides PIL); install it beside instead:
``python -m pip install --no-deps scikit-image imageio lazy-loader tifffile scipy networkx``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# class folder -> the skimage.data photographs in it, with their credit and licence
PHOTOS: dict[str, dict[str, str]] = {
    "animals": {"chelsea": "Stefan van der Walt, CC0"},
    "food": {"coffee": "Rachel Michetti, CC0"},
    "objects": {"coins": "Brooklyn Museum, no known copyright restrictions",
                "clock": "Stefan van der Walt, public domain"},
    "people": {"astronaut": "NASA, public domain", "camera": "Lav Varshney, CC0"},
    "science": {"retina": "Mikael Häggström, CC0",
                "immunohistochemistry": "CMMI, no known copyright restrictions"},
    "space": {"rocket": "SpaceX, public domain", "hubble_deep_field": "NASA, public domain"},
}
TALL = 0.6  # the tall frame's width over its height
TILE = 128  # stored tile side: the sheets show tiles 1:1
SIZE = 112  # the Loader's output side for the training and evaluation sheets
SHOWN = 12  # samples on each sheet: the same ones on all three


def save_photos(folder: Path) -> int:
    """Each photograph as a JPEG in its class folder, whole and in a tall centre frame; how many."""
    try:
        from skimage import data
    except ImportError:
        raise SystemExit("photo_sheet needs scikit-image (only for this tool): "
                         "python -m pip install scikit-image (see this file's note on pillow-simd)") from None
    from PIL import Image

    written = 0
    for label, photos in PHOTOS.items():
        (folder / label).mkdir(parents=True, exist_ok=True)
        for name in photos:
            pixels = np.asarray(getattr(data, name)())
            height, width = pixels.shape[:2]
            tall = min(width, int(round(TALL * height)))
            left = (width - tall) // 2
            for suffix, part in (("", pixels), ("-tall", pixels[:, left:left + tall])):
                Image.fromarray(np.ascontiguousarray(part)).save(folder / label / f"{name}{suffix}.jpg",
                                                                 quality=92)
                written += 1
    return written


def preprocess(folder: Path, store: Path) -> None:
    """``tilefeed preprocess --fit pad`` of the folder, with this Python."""
    done = subprocess.run([sys.executable, "-m", "tilefeed", "preprocess", str(folder), str(store),
                           "--size", str(TILE), "--fit", "pad", "--workers", "1", "--overwrite", "--quiet"],
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"tilefeed preprocess failed (exit {done.returncode})")


def shown(count: int) -> list[int]:
    """``SHOWN`` samples spread over the store (every class, whole and tall frames alike)."""
    return sorted({int(round(v)) for v in np.linspace(0, count - 1, SHOWN)})


def draw_sheets(store: Path, out: Path) -> list[Path]:
    """The three sheets of the same samples, as the docs show them."""
    from tilefeed.pipeline.reading.reader import StoreReader
    from tilefeed.pipeline.sheet import contact_sheet

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with StoreReader(store) as reader:
        samples = shown(len(reader))
        sheets = {"stored": contact_sheet(reader, samples=samples, show_stored=True),
                  "train": contact_sheet(reader, samples=samples, train=True, epoch=0, seed=0, size=SIZE),
                  "eval": contact_sheet(reader, samples=samples, train=False, size=SIZE)}
        for name, sheet in sheets.items():
            path = out / f"contact-{name}.png"
            sheet.image.save(path, format="PNG", optimize=True)
            written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(prog="tools/photo_sheet.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the JPEGs and the store (default: a temporary one, removed)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder for the PNGs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="photo-sheet-") as scratch:
        work = args.work or Path(scratch)
        photos = work / "photos"
        count = save_photos(photos)
        print(f"saved {count} JPEGs in {photos}")
        preprocess(photos, work / "store")
        for path in draw_sheets(work / "store", args.out):
            print(f"wrote {path} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
