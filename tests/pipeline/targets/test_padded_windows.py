"""Windows that reach past the picture: SSD's zoom-out canvases and large-scale jitter's cut
are distributed as torchvision's own (``RandomZoomOut``; ``ScaleJitter`` then the detection
reference's ``FixedSizeCrop``: two-sample Kolmogorov-Smirnov at alpha = 0.001, fixed sample
sizes, a changed setting told apart); the graph's own operations (DALI on the CPU) and the
host's PIL path paste the part inside the picture on the fill where torchvision resizes and
pads; existing windows are untouched by the paste."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from tests.helpers import ks
from tests.pipeline.recipe.helpers import ks_critical
from tilefeed.pipeline.targets.geometry import Framing, transform_boxes
from tilefeed.pipeline.targets.objects import Objects
from tilefeed.pipeline.targets.windows import (ScaleJitter, ZoomOut, pasted, scale_jitter_framing,
                                               scale_jitter_sizes, zoom_out_canvases)
from tilefeed.store.errors import ConfigError

N = 1500  # draws on each side
ALPHA = 0.001
H, W = 40, 50
REFERENCE = Path(__file__).resolve().parents[2] / "scripts" / "torchvision_detection" / "transforms.py"
FILL = (123, 117, 104)  # the detection presets' mean


def torchvisions_zoom_out(n: int = N) -> np.ndarray:
    """(n, 4) canvas top, left (the picture's offset, negated), height, width from ``RandomZoomOut``
    itself: the canvas its output has, and where a box at the picture's corner went."""
    torch.manual_seed(0)
    zoom = v2.RandomZoomOut(fill=0)
    image = tv_tensors.Image(torch.zeros(1, H, W, dtype=torch.uint8))
    corner = tv_tensors.BoundingBoxes(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), format="XYXY", canvas_size=(H, W))
    out = []
    for _ in range(n):
        zoomed, box = zoom(image, corner)
        out.append((-float(box[0, 1]), -float(box[0, 0]), zoomed.shape[1], zoomed.shape[2]))
    return np.array(out, np.float64)


def test_zoom_out_canvases_are_distributed_as_torchvisions() -> None:
    theirs = torchvisions_zoom_out()
    pictures = np.tile([0, 0, H, W], (N, 1))
    mine = zoom_out_canvases(ZoomOut(), 0, 0, np.arange(N), pictures)
    limit = ks_critical(N, N, ALPHA)
    for k, name in enumerate(("top", "left", "height", "width")):
        assert ks(mine[:, k], theirs[:, k]) < limit, name
    applied, their_applied = (mine[:, 2] > H).mean(), (theirs[:, 2] > H).mean()
    assert abs(applied - their_applied) < 4 * np.sqrt(2 * 0.25 / N)  # two proportions, four sigmas
    # negative control: a narrower side range is told apart
    narrower = zoom_out_canvases(ZoomOut(side_range=(1.0, 3.0)), 0, 0, np.arange(N), pictures)
    assert ks(narrower[:, 3], theirs[:, 3]) > limit
    # every canvas holds its picture, in whole pixels
    top, left, height, width = mine.T
    assert (top <= 0).all() and (left <= 0).all() and (top + height >= H).all() and (left + width >= W).all()
    assert np.array_equal(mine, np.round(mine))


def fixed_size_crop() -> Any:
    if not REFERENCE.exists():
        pytest.skip(f"torchvision's detection reference transforms.py not in {REFERENCE.parent} "
                    "(see tests/scripts/README.md)")
    spec = importlib.util.spec_from_file_location("detection_reference_transforms", REFERENCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FixedSizeCrop


def test_large_scale_jitter_cuts_are_distributed_as_the_reference_presets() -> None:
    """ScaleJitter's sizes and FixedSizeCrop's offsets (one draw for both axes), read from the
    reference's own crop of a picture whose pixels number themselves."""
    crop_of = fixed_size_crop()
    side = 32
    torch.manual_seed(0)
    jitter, cut = v2.ScaleJitter((side, side)), crop_of(size=(side, side))
    image = tv_tensors.Image(torch.zeros(3, H, W))
    theirs = []
    for _ in range(N):
        new_h, new_w = jitter.make_params([image])["size"]
        numbered = torch.arange(new_h * new_w, dtype=torch.float64).reshape(1, new_h, new_w)
        first = int(cut(numbered)[0][0, 0, 0])
        theirs.append((new_h, new_w, first // new_w, first % new_w))
    reference = np.array(theirs, np.float64)
    pictures = np.tile([0, 0, H, W], (N, 1))

    def ours(jitter: ScaleJitter) -> np.ndarray:
        framing = scale_jitter_framing(jitter, 3, 0, np.arange(N), pictures, side)
        return np.concatenate([framing.resized, framing.anchor], axis=1)

    mine = ours(ScaleJitter((side, side)))
    limit = ks_critical(N, N, ALPHA)
    for k, name in enumerate(("height", "width", "top", "left")):
        assert ks(mine[:, k], reference[:, k]) < limit, name
    # one draw for both offsets: their excess-relative positions go together where both axes
    # are cut (floored, so not exactly), in the reference as here; independent draws would not
    def together(cuts: np.ndarray) -> float:
        both = (cuts[:, 0] > side + 4) & (cuts[:, 1] > side + 4)
        rel = cuts[both, 2:] / (cuts[both, :2] - side)
        return float(np.corrcoef(rel[:, 0], rel[:, 1])[0, 1])

    assert together(mine) > 0.8 and together(reference) > 0.8
    # negative control: a narrower scale range is told apart
    assert ks(ours(ScaleJitter((side, side), (0.5, 2.0)))[:, 1], reference[:, 1]) > limit


def test_a_paste_lands_on_the_windows_own_mapping() -> None:
    # large-scale jitter's cut: the picture's bottom and right land on whole output pixels
    jitter = ScaleJitter((48, 48), (0.2, 2.0))
    pictures = np.array([[5, 3, 40, 50]] * 200, np.float64)
    framing = scale_jitter_framing(jitter, 1, 0, np.arange(200), pictures, 48)
    start, end = framing.window()
    cut = pasted(start, end, pictures, 48)
    np.testing.assert_array_equal(cut.place, 0)
    np.testing.assert_allclose(cut.cut_size, np.minimum(framing.resized - framing.anchor, 48), atol=1e-9)
    np.testing.assert_allclose(cut.cut_start, start, atol=1e-9)
    # a window wholly inside the picture is the window itself, pasted over the whole output
    inside = pasted(np.array([[6.0, 4.0]]), np.array([[30.0, 40.0]]), pictures[:1], 48)
    assert inside.place.tolist() == [[0, 0]] and inside.cut_size.tolist() == [[48, 48]]
    # a zoomed-out canvas cut whole: the picture sits at its offset, at one pixel a pixel
    corner = np.array([[-7.0, -11.0]])
    whole = pasted(corner, corner + 96, np.array([[0, 0, 40, 50]]), 96)
    assert whole.place.tolist() == [[7, 11]] and whole.cut_size.tolist() == [[40, 50]]
    # a window that misses its picture is all fill
    missed = pasted(np.array([[100.0, 100.0]]), np.array([[120.0, 120.0]]), np.array([[0, 0, 40, 50]]), 16)
    assert (missed.place >= 16).all()


def reference_lsj(picture: np.ndarray, new: tuple[int, int], anchor: tuple[int, int], side: int,
                  flip: bool) -> np.ndarray:
    """torchvision's ``lsj`` preset on a PIL picture (its backend): ScaleJitter's resize to
    ``new``, FixedSizeCrop at ``anchor`` padded with the fill, the flip."""
    resized = F.resize(Image.fromarray(picture), list(new), antialias=True)
    top, left = anchor
    cut = F.crop(resized, top, left, min(side, new[0] - top), min(side, new[1] - left))
    padded = F.pad(cut, [0, 0, side - cut.size[0], side - cut.size[1]], fill=FILL)
    out = np.asarray(F.horizontal_flip(padded) if flip else padded)
    return out


def smooth(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.asarray(Image.fromarray(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8))
                      .resize((w, h), Image.Resampling.BICUBIC))


def batch_of(values: np.ndarray) -> Any:
    """A source of no argument that gives ``values`` as a batch."""
    return lambda: list(values)


def dali_paste(tiles: np.ndarray, start: np.ndarray, end: np.ndarray, cut: Any, side: int) -> np.ndarray:
    """The graph's own cut-resize and paste (``graph._decode_and_resize``, ``graph.paste``) on
    DALI's CPU backend, for lossless tiles."""
    from nvidia.dali import fn, pipeline_def

    from tilefeed.pipeline.engine.augment import Augment
    from tilefeed.pipeline.engine.graph_ops import _decode_and_resize, paste

    n = len(tiles)
    values = {"start": start, "end": end, "size": np.full((n, 2), side), "cut_start": cut.cut_start,
              "cut_end": cut.cut_end, "cut_size": cut.cut_size, "paste_anchor": -cut.place}
    augment = Augment(train=True, tile=tiles.shape[1], normalize=False, half=False, channels_first=False,
                      windows=True)

    @pipeline_def(batch_size=n, num_threads=1, device_id=None)
    def graph() -> Any:
        pixels = fn.external_source(source=lambda: list(tiles), batch=True, layout="HWC")
        inputs = {name: fn.external_source(source=batch_of(np.asarray(v, np.float32)), batch=True)
                  for name, v in values.items()}
        return paste(_decode_and_resize(pixels, inputs, augment, gpu=False, jpeg=False), inputs, FILL)

    pipe = graph()
    pipe.build()
    return np.stack([np.asarray(t) for t in pipe.run()[0]])


def pil_paste(tiles: np.ndarray, cut: Any, side: int) -> np.ndarray:
    """The host path's cut, resize and paste (``BatchSource._cut_and_resize``)."""
    from tilefeed.pipeline.engine.batch_source import BatchSource

    class Tiles:  # the reader face the cut reads: lossless tiles, their payloads and codec
        is_image_coded = False

        class codec:  # noqa: N801
            shape = tiles.shape[1:]

            @staticmethod
            def decode(payload: np.ndarray, out: np.ndarray) -> None:
                out[:] = payload

        def payloads(self, indices: list[int]) -> list[np.ndarray]:
            return [tiles[i] for i in indices]

    source = BatchSource.__new__(BatchSource)
    source.reader, source.recipe, source.scaled_decode, source.fast_idct = Tiles(), None, False, False
    source.fill = np.asarray(FILL, np.uint8)
    out = np.empty((len(tiles), side, side, 3), np.uint8)
    inputs = {"cut_start": cut.cut_start, "cut_end": cut.cut_end, "cut_size": cut.cut_size,
              "paste_anchor": -cut.place}
    source._cut_and_resize(np.arange(len(tiles)), cut.cut_start, cut.cut_end, out, inputs=inputs)
    return out


@pytest.mark.parametrize("path", ["dali", "pil"])
def test_large_scale_jitter_pixels_equal_the_reference_presets(path: str) -> None:
    n, tile, side = 6, 64, 48
    pictures = np.array([[0, 0, 64, 64], [8, 0, 48, 64], [0, 10, 64, 44]] * 2, np.float64)
    tiles = np.stack([smooth(tile, tile, k) for k in range(n)])
    framing = scale_jitter_framing(ScaleJitter((side, side), (0.3, 2.0)), 5, 0, np.arange(n), pictures, side)
    assert (framing.resized < side).any() and (framing.resized > side).any()  # pads and cuts
    start, end = framing.window()
    cut = pasted(start, end, pictures, side)
    got = dali_paste(tiles, start, end, cut, side) if path == "dali" else pil_paste(tiles, cut, side)
    for k in range(n):
        top, left, h, w = (int(v) for v in pictures[k])
        new = (int(framing.resized[k, 0]), int(framing.resized[k, 1]))
        anchor = (int(framing.anchor[k, 0]), int(framing.anchor[k, 1]))
        want = reference_lsj(tiles[k, top:top + h, left:left + w], new, anchor, side, False)
        pad = np.all(want == FILL, axis=2) & np.all(got[k] == FILL, axis=2)
        inside = min(side, new[0] - anchor[0]), min(side, new[1] - anchor[1])
        # the fill exactly where the reference pads; the picture within resampling's difference
        assert np.array_equal(got[k, inside[0]:], want[inside[0]:]) and np.array_equal(got[k, :, inside[1]:],
                                                                                    want[:, inside[1]:])
        diff = np.abs(got[k].astype(int) - want.astype(int))[: inside[0], : inside[1]]
        if h < tile or w < tile:
            # a letterboxed picture: the resampling filter reads past its edge into the tile's
            # padding here, and stops at it in torchvision's picture: the edges' pixels differ
            diff = diff[3:-3, 3:-3]
        tolerance = 1 if path == "pil" else 8  # PIL against PIL; DALI's linear filter against PIL's
        assert diff.max() <= tolerance and diff.mean() < (0.1 if path == "pil" else 1.0), (k, diff.max())
        assert pad.sum() >= (side * side - inside[0] * inside[1])
    # negative control: the reference at another anchor differs
    k = int(np.argmax(framing.anchor.sum(axis=1)))
    assert framing.anchor[k].sum() > 0
    top, left, h, w = (int(v) for v in pictures[k])
    other = reference_lsj(tiles[k, top:top + h, left:left + w],
                          (int(framing.resized[k, 0]), int(framing.resized[k, 1])), (0, 0), side, False)
    assert np.abs(got[k].astype(int) - other.astype(int)).mean() > 3


def test_zoomed_out_pixels_and_boxes_equal_torchvisions_at_one_pixel_a_pixel() -> None:
    """The whole canvas at its own size: the picture pasted at its offset on the fill, exactly as
    ``RandomZoomOut`` pads it, and the boxes moved as torchvision moves them."""
    picture = smooth(H, W, 9)
    canvas = zoom_out_canvases(ZoomOut(p=1.0), 2, 0, np.arange(1), np.array([[0, 0, H, W]]))[0]
    top, left, ch, cw = canvas
    side = int(max(ch, cw))
    start, end = np.array([[top, left]]), np.array([[top + side, left + side]])
    cut = pasted(start, end, np.array([[0, 0, H, W]]), side)
    tiles = picture[None]
    want = np.asarray(F.pad(Image.fromarray(picture), [int(-left), int(-top), int(side + left - W),
                                                        int(side + top - H)], fill=FILL))
    for got in (dali_paste(tiles, start, end, cut, side)[0], pil_paste(tiles, cut, side)[0]):
        np.testing.assert_array_equal(got, want)
    rows = np.array([[5.0, 6.0, 30.0, 20.0, 1, 0]])
    boxes = transform_boxes(Framing.windows(start, end, side), Objects.from_rows(np.array([0, 1]), rows)).boxes
    ref = F.pad(tv_tensors.BoundingBoxes(torch.tensor(rows[:, :4]), format="XYXY", canvas_size=(H, W)),
                [int(-left), int(-top), int(side + left - W), int(side + top - H)])
    np.testing.assert_allclose(boxes, ref.numpy(), atol=1e-9)


def test_settings_of_the_padded_crops_are_checked() -> None:
    from tilefeed.pipeline.recipe.recipe import Recipe

    with pytest.raises(ConfigError, match="side_range"):
        ZoomOut(side_range=(0.5, 2.0))
    with pytest.raises(ConfigError, match="^fill must be"):
        Recipe(crop="lsj", fill=(1, 2))
    with pytest.raises(ConfigError, match="^crop='zoom_iou' takes no vflip and no auto_augment$"):
        Recipe(crop="zoom_iou", vflip=0.5)
    assert Recipe(crop="lsj", fill=7).fill == (7, 7, 7)
    # the sizes draw on their own stream: large-scale jitter leaves other draws alone
    a = scale_jitter_sizes(ScaleJitter((32, 32)), 0, 0, np.arange(8), np.full(8, H), np.full(8, W))
    b = scale_jitter_sizes(ScaleJitter((32, 32)), 0, 0, np.arange(8), np.full(8, H), np.full(8, W))
    assert np.array_equal(a[0], b[0])
