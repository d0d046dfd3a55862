"""What the recipe tests share: tiles, the ops run in a real CPU DALI graph, torchvision's own
kernels applied with the same drawn parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from tilefeed.pipeline.recipe import ops
from tilefeed.pipeline.recipe.draws import Draws, draw
from tilefeed.pipeline.recipe.recipe import JITTER_ADJUSTMENTS, Recipe

# Kolmogorov-Smirnov critical constants c(alpha): reject at alpha when D > c * sqrt((n + m) / (n m))
KS_C = {0.01: 1.628, 0.001: 1.949}


def ks_critical(n: int, m: int, alpha: float) -> float:
    return KS_C[alpha] * float(np.sqrt((n + m) / (n * m)))


def tiles(count: int = 48, side: int = 32, seed: int = 0) -> list[np.ndarray]:
    """Smooth, saturated colour pictures: upsampled noise, as photographs are smooth at a pixel."""
    rng = np.random.default_rng(seed)
    return [np.asarray(Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
                       .resize((side, side), Image.Resampling.BICUBIC)) for _ in range(count)]


def run_graph(images: list[np.ndarray], recipe: Recipe, drawn: Draws, batch: int = 64,
              device_id: int | None = None) -> list[np.ndarray]:
    """``ops.apply`` in a DALI pipeline over ``images`` with the per-sample ``drawn`` inputs: on
    the CPU, or with ``device_id`` on that GPU (the images moved there, the inputs on the host)."""
    from nvidia.dali import fn, pipeline_def, types

    from tilefeed.pipeline.engine.graph_ops import DALI_TYPES

    inputs = drawn.inputs(recipe, True)
    names = tuple(n for n in inputs if n != "interp")
    n = len(images)
    out: list[np.ndarray] = []

    def batches() -> Any:
        for s in range(0, n, batch):
            yield (images[s : s + batch], *[inputs[k][s : s + batch] for k in names])

    it = batches()

    @pipeline_def(batch_size=batch, num_threads=1, device_id=device_id,
                  enable_conditionals=ops.conditional(recipe, True))
    def pipe() -> Any:
        raw, *extras = fn.external_source(source=lambda: next(it), num_outputs=1 + len(names), batch=True,
                                          layout=["HWC", *[None] * len(names)],
                                          dtype=[types.UINT8, *(DALI_TYPES[inputs[k].dtype] for k in names)])
        if device_id is not None:
            raw = raw.gpu()
        return ops.apply(raw, {name: extras[k] for k, name in enumerate(names)}, recipe)

    p = pipe()
    p.build()
    for s in range(0, n, batch):
        result = p.run()[0]
        if device_id is not None:
            result = result.as_cpu()
        out += [np.array(result[k]) for k in range(min(batch, n - s))]
    return out


def _torchvision_chain(x: Any, recipe: Recipe, drawn: Draws, k: int) -> Any:
    """Sample ``k`` of ``drawn`` through torchvision v2's functional ops, in timm's order: on a
    tensor they are its tensor kernels, on a PIL picture its PIL kernels."""
    if drawn.vflip[k]:
        x = F.vertical_flip(x)
    jitter = recipe.jitter
    if jitter is not None and drawn.jitter[k]:
        kernels = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
        ranges = jitter.ranges()
        for which in drawn.order[k].tolist():
            if ranges[JITTER_ADJUSTMENTS[which]] is not None:
                x = kernels[which](x, float(drawn.factors[k, which]))
    if drawn.grayscale[k]:
        x = F.rgb_to_grayscale(x, num_output_channels=3)
    return x


def torchvision_direct(image: np.ndarray, recipe: Recipe, drawn: Draws, k: int) -> np.ndarray:
    """Sample ``k`` of ``drawn`` through torchvision v2's tensor kernels, in timm's order."""
    x = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    return _torchvision_chain(x, recipe, drawn, k).permute(1, 2, 0).numpy()  # type: ignore[no-any-return]


def torchvision_pil(image: Image.Image, recipe: Recipe, drawn: Draws, k: int) -> np.ndarray:
    """Sample ``k`` of ``drawn`` through torchvision v2's functional ops on a PIL picture (its
    PIL kernels), in timm's order."""
    return np.asarray(_torchvision_chain(image, recipe, drawn, k))


def drawn_for(recipe: Recipe, n: int, seed: int = 0, epoch: int = 0) -> Draws:
    return draw(recipe, seed, epoch, np.arange(n))


def in_layout(nchw: torch.Tensor, layout: str) -> torch.Tensor:
    """An N, C, H, W batch laid out as ``layout`` (NCHW, NHWC or channels_last)."""
    if layout == "NHWC":
        return nchw.permute(0, 2, 3, 1).contiguous()
    if layout == "channels_last":
        return nchw.contiguous(memory_format=torch.channels_last)
    return nchw.contiguous()


def as_nchw(images: torch.Tensor, layout: str) -> torch.Tensor:
    """The N, C, H, W view of a batch laid out as ``layout``."""
    return images.permute(0, 3, 1, 2) if layout == "NHWC" else images
