"""The training scripts the swap tests run, and the small image set they train on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_folder
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

HERE = Path(__file__).parent
SRC = Path(__file__).parents[2] / "src"


def swapped(script: str, files: tuple[str, ...], into: Path) -> Path:
    """A temporary copy of ``script``'s files with its ``swap.patch`` applied; the test skips,
    naming the folder, where the script's own files are not there."""
    folder = HERE / script
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"{script}'s {', '.join(missing)} not in {folder} (see tests/scripts/README.md)")
    into.mkdir(parents=True)
    for name in files:
        shutil.copy2(folder / name, into / name)
    subprocess.run(["patch", "-p1", "--quiet", "-i", str(folder / "swap.patch")], cwd=into, check=True)
    return into


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """A script run as a user runs it, on the CPU, importing this checkout's tilefeed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def image_set(root: Path, val_name: str, classes: int = 3) -> Path:
    """``train/`` (``classes`` x 8 pictures) and ``{val_name}/`` (``classes`` x 4) image folders,
    each preprocessed into ``store-train`` and ``store-{val_name}`` (32 px tiles)."""
    for split, per_class, seed in (("train", 8, 1), (val_name, 4, 2)):
        src = write_folder(root / split, classes=classes, per_class=per_class, size=(48, 40), seed=seed)
        preprocess(src, root / f"store-{split}", TileSettings(tile=32, fit="crop"),
                   StoreSettings(codec="lz4", shard_size=8), workers=1)
    return root
