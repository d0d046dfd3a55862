"""Generated image sets: ImageNet-like sizes and JPEG file sizes, several classes, reproducible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def synthetic_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth shapes plus sensor-like noise: compresses like a photo (about 80-120 KB at q90)."""
    coarse = rng.integers(0, 256, (max(2, height // 24), max(2, width // 24), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BICUBIC))
    noise = rng.normal(0.0, 11.0, (height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def make_image_folder(
    root: str | Path, *, classes: int = 4, per_class: int = 32, seed: int = 0,
    sizes: tuple[tuple[int, int], ...] = ((500, 375), (375, 500), (500, 333), (640, 480)),
    quality: int = 90,
) -> Path:
    """Write ``classes`` x ``per_class`` JPEGs under root/class_k/; skips files already there."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = sizes[int(rng.integers(len(sizes)))]
            path = folder / f"img_{i:05d}.jpg"
            image_seed = int(rng.integers(2**31))
            if not path.exists():
                img = synthetic_image(np.random.default_rng(image_seed), w, h)
                img.save(path.with_suffix(".tmp"), "JPEG", quality=quality)
                path.with_suffix(".tmp").rename(path)
    return root
