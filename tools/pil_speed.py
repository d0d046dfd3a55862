"""What pillow-simd buys over plain Pillow: times, in the Python that runs it, the two PIL
operations tilefeed leans on, on generated photo-like JPEGs, and prints one JSON line.

    python tools/pil_speed.py [--rounds 7]

- ``decode+fit``: decode a 500x375 q90 JPEG (draft mode off) and resize it to fit 256 px,
  bicubic (``preprocess``'s default resampling; its work per image before encoding the tile);
- ``window``: cut a random-resized-crop window of a 256 px tile and resize it to 224 px,
  bilinear, antialiased (the Loader's CPU training path, per sample).

Run it once with each PIL (the checkout's venv with pillow-simd 12.1.1.post0, and a venv with
``pip install pillow==12.1.1 numpy``: the same upstream version), alternately, and compare the
medians. Needs only PIL and numpy.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import numpy as np
from PIL import Image


def photo(seed: int, width: int = 500, height: int = 375) -> bytes:
    """A smooth picture with sensor-like noise, as a q90 JPEG (compresses like a photo)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 24, width // 24, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BICUBIC))
    pixels = np.clip(base + rng.normal(0, 11, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


def per_second(work: list[object], run: object, seconds: float = 0.5) -> float:
    """Items of ``work`` done per second by ``run`` over at least ``seconds``."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for item in work:
            run(item)  # type: ignore[operator]
        done += len(work)
    return done / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds; medians reported")
    args = parser.parse_args()
    jpegs = [photo(seed) for seed in range(16)]
    tile = Image.open(io.BytesIO(jpegs[0])).convert("RGB").resize((256, 256), Image.Resampling.BILINEAR)
    rng = np.random.default_rng(0)
    windows = []
    for _ in range(64):
        side = int(256 * np.sqrt(rng.uniform(0.08, 1.0)))
        top, left = (int(v) for v in rng.integers(0, 256 - side + 1, 2))
        windows.append((left, top, left + side, top + side))

    def decode_fit(data: object) -> None:
        with Image.open(io.BytesIO(data)) as im:  # type: ignore[arg-type]
            im.convert("RGB").resize((256, 192), Image.Resampling.BICUBIC, reducing_gap=None)

    def window(box: object) -> None:
        tile.resize((224, 224), Image.Resampling.BILINEAR, box=box)  # type: ignore[arg-type]

    rates: dict[str, list[float]] = {"decode+fit": [], "window": []}
    for _ in range(args.rounds):
        rates["decode+fit"].append(per_second(jpegs, decode_fit))  # type: ignore[arg-type]
        rates["window"].append(per_second(windows, window))  # type: ignore[arg-type]
    import PIL

    print(json.dumps({"pil": PIL.__version__, "simd": "post" in PIL.__version__,
                      **{k: {"median_per_s": statistics.median(v), "min": min(v), "max": max(v)}
                         for k, v in rates.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
