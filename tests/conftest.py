"""Shared fixtures: every test makes its own images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``tilefeed ARGS`` in a new process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tilefeed", *args], capture_output=True,
                          text=True, timeout=timeout)


def photo(seed: int, width: int, height: int) -> Image.Image:
    """A smooth random picture: JPEG-friendly, and different per seed."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BICUBIC)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def write_folder(root: Path, classes: int = 3, per_class: int = 5, size: tuple[int, int] = (96, 72),
                 seed: int = 0) -> Path:
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            photo(seed * 1000 + c * 100 + i, *size).save(d / f"{i:03d}.jpg", quality=92)
    return root


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "src")


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    """A class tree with one good image and one of every kind of bad input."""
    root = write_folder(tmp_path / "src", classes=2, per_class=2)
    bad = root / "c1"
    (bad / "zero.jpg").write_bytes(b"")
    good = (root / "c0" / "000.jpg").read_bytes()
    (bad / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (bad / "text.jpg").write_text("not an image at all")
    photo(3, 64, 64).save(bad / "garbled.png")
    png = bytearray((bad / "garbled.png").read_bytes())
    png[len(png) // 2 : len(png) // 2 + 16] = os.urandom(16)  # breaks the IDAT crc / zlib stream
    (bad / "garbled.png").write_bytes(bytes(png))
    photo(7, 400, 300).save(bad / "huge.png")  # over the --max-pixels the tests set
    return root
