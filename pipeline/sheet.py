"""A contact sheet (PNG) of samples as the model receives them (``tilefeed show`` draws it).

A training run that goes wrong because of its input (crops that miss the object, padding in the
crops, wrong labels, a normalisation applied twice) is cheapest to catch by looking. The sheet is
made by the ``Loader`` itself, on the CPU, so it shows the very crops, flips and framing a run
with the same seed and epoch gets; only the normalisation is undone, for the eye. ``--stored``
shows the tiles as written instead, with each picture's box, and ``--rejects`` what preprocessing
refused and why. A store made with targets shows them on each cell: each object's box in its
category's colour, and the masks laid over the pixels (a colour per class or per object). A store
with captions shows each sample's caption (its first, or the one named) under its other lines,
wrapped over a few lines and shortened to fit.

Which samples: a list given with ``--samples``, else the first ``--count`` of the epoch's order
on rank 0 of one (``pipeline.planning.order``, as the Loader orders them). Either way they are loaded
through ``Loader(indices=...)``: crops and flips are a function of (seed, epoch, sample) alone,
so a subset gets each sample's own, and only the samples shown are read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw, ImageFile, ImageFont

from tilefeed.pipeline.planning.order import epoch_order
from tilefeed.pipeline.reading.reader import source_paths
from tilefeed.store import format as fmt
from tilefeed.store.errors import ConfigError
from tilefeed.store.inspection import printable
from tilefeed.store.storage import is_url

if TYPE_CHECKING:
    import torch

    from tilefeed.pipeline.reading.reader import StoreReader

DEFAULT_COUNT = 64
MIN_DISPLAY = 96  # smaller tiles are enlarged (nearest, by a whole factor) to at least this side
THUMB = 128  # side of a rejected input's thumbnail
GAP = 4  # pixels between cells and around the sheet
SHEET_COLOUR = (24, 24, 24)
TEXT_COLOUR = (235, 235, 235)
BOX_COLOUR = (255, 0, 255)  # the picture box on stored tiles: a colour photos rarely hold
THUMB_MAX_PIXELS = 64_000_000  # rejected inputs larger than this (after JPEG draft) are not drawn
MASK_ALPHA = 0.45  # a mask's colour over the pixels: enough to see, not enough to hide them
IGNORE = 255  # a semantic mask's "ignore" value (and its padding): left uncoloured
TEXT_LINES = 3  # a caption is wrapped over at most this many lines under a cell, the last shortened


def palette(value: int) -> tuple[int, int, int]:
    """A colour for a category or instance id: hues a golden angle apart, so ids next to each
    other differ at a glance, and the same id has the same colour on every sheet."""
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((value * 0.618033988749895) % 1.0, 0.85, 1.0)
    return int(r * 255), int(g * 255), int(b * 255)


def overlay(tile: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``tile`` (H, W, 3) uint8 with each nonzero, non-ignore id of ``ids`` (H, W) coloured over it."""
    shown = ids.astype(np.int64)
    marked = (shown != 0) & (shown != IGNORE)
    if not marked.any():
        return tile
    table = np.array([palette(v) for v in range(256)], dtype=np.float32)
    colours = table[np.clip(shown, 0, 255)]
    mixed = np.where(marked[..., None], tile * (1 - MASK_ALPHA) + colours * MASK_ALPHA, tile)
    return np.clip(np.rint(mixed), 0, 255).astype(np.uint8)


def mask_ids(target: dict[str, Any]) -> np.ndarray | None:
    """A sample's masks as one id map: a semantic mask as it is; per-object masks (k, H, W) as
    object ``m`` = id ``m + 1`` (the later object on top where they overlap)."""
    masks = target.get("masks")
    if masks is None:
        return None
    masks = np.asarray(masks)
    if masks.ndim == 2:
        return masks
    ids = np.zeros(masks.shape[1:], dtype=np.int64)
    for m in range(len(masks)):
        ids[masks[m] != 0] = m + 1
    return ids


@dataclass(frozen=True)
class Sheet:
    """A drawn contact sheet and what it shows, so callers (and tests) need not read pixels back
    to know which sample lies where."""

    image: Image.Image
    captions: list[tuple[str, ...]]  # per cell, the caption's lines before they are fitted
    cells: list[tuple[int, int]]  # per cell, the (x, y) of its tile's top-left on the sheet
    side: int  # the tiles' side on the sheet
    scale: int  # sheet pixels per pixel of the tiles (nearest-neighbour enlargement)
    indices: list[int]  # the store sample of each cell (empty for rejected inputs)
    text: str = ""  # the caption name drawn under each cell ('': none)
    texts: list[tuple[str, ...]] = field(default_factory=list)  # per cell, its caption's lines as drawn


# -- which samples ---------------------------------------------------------------------------------
def select(reader: StoreReader, *, train: bool, epoch: int, seed: int, count: int | None,
           samples: Sequence[int] | None) -> np.ndarray:
    """The samples to show: ``samples`` as given, else the first ``count`` of the epoch's order.

    The order is the Loader's own (``epoch_order``; rank 0 of a world of one is the whole order),
    shuffled when training as ``Loader(shuffle=True)`` is, the store order in evaluation.
    """
    if samples is not None:
        chosen = np.asarray(samples, dtype=np.int64)
        bad = chosen[(chosen < 0) | (chosen >= len(reader))]
        if bad.size:
            raise ConfigError(f"--samples: {int(bad[0])} is not a sample of this store "
                              f"(0..{len(reader) - 1})")
        if len(np.unique(chosen)) != len(chosen):
            raise ConfigError("--samples names a sample twice: list each once")
        return chosen
    order = epoch_order(len(reader), shuffle="global" if train else "none", seed=seed, epoch=epoch,
                        shard_size=reader.shard_size)
    return order[: count or DEFAULT_COUNT]


# -- pixels ----------------------------------------------------------------------------------------
def to_pixels(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Float NCHW batches as the model gets them, back to (N, H, W, 3) uint8 for the eye:
    the Loader normalises in 0..255 units, x = (pixel - mean) / std."""
    hwc = images.float().permute(0, 2, 3, 1).cpu().numpy()
    pixels = hwc * np.asarray(std, dtype=np.float32) + np.asarray(mean, dtype=np.float32)
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def held_targets(reader: StoreReader) -> tuple[str, ...]:
    """What a Loader over ``reader`` can hand over besides images: ``("boxes", "masks")``, one
    of them, or nothing."""
    store = reader.targets
    if store is None:
        return ()
    boxes = store.offsets is not None
    masks = store.masks is not None
    return (("boxes",) if boxes else ()) + (("masks",) if masks else ())


def loaded(reader: StoreReader, indices: np.ndarray, *, train: bool, epoch: int, seed: int,
           size: int | None) -> tuple[np.ndarray, np.ndarray, int, list[dict[str, Any]] | None]:
    """(pixels, labels, side, targets) of ``indices``, in that order, from the Loader on the CPU:
    the crops, flips and framing training (or evaluation) with this seed and epoch gets, and,
    for a store with targets, each sample's boxes and masks through them (else None)."""
    from tilefeed.pipeline.loader.loader import Loader

    asked = held_targets(reader)
    with Loader(reader, len(indices), shuffle=False, seed=seed, rank=0, world_size=1,
                device="cpu", train=train, size=size, with_index=True, indices=indices,
                targets=asked or None) as loader:
        loader.set_epoch(epoch)
        # (images, labels or targets, ids); a store without class labels hands over none
        images, *middle, got = next(iter(loader))
        pixels = to_pixels(images, loader.augment.mean, loader.augment.std)
        side = loader.size
    where = {int(i): k for k, i in enumerate(got.tolist())}  # store order -> the order asked for
    order = [where[int(i)] for i in indices]
    if asked:  # the image labels stay the store's: the batch holds the targets in their place
        targets: list[dict[str, Any]] = list(middle[0])
        return pixels[order], reader.labels[indices], side, [targets[k] for k in order]
    if not middle:  # every label 0, the one class the store names
        return pixels[order], reader.labels[indices], side, None
    return pixels[order], middle[0].numpy()[order], side, None


def stored_targets(reader: StoreReader, indices: np.ndarray) -> list[dict[str, Any]] | None:
    """The targets of ``indices`` as stored, in tile pixels (None: the store holds none)."""
    store = reader.targets
    if store is None:
        return None
    out: list[dict[str, Any]] = []
    masks = None
    if store.masks is not None:
        masks = np.empty((len(indices), store.tile, store.tile), dtype=np.uint8)
        store.read_masks_into(indices, masks)
    for k, rows in enumerate(store.rows(indices)):
        target: dict[str, Any] = {"boxes": rows[:, :4], "labels": rows[:, 4].astype(np.int64)}
        if masks is not None:
            target["masks"] = masks[k]  # an instance store's ids are the objects' rows + 1 already
        out.append(target)
    return out


def stored(reader: StoreReader, indices: np.ndarray) -> np.ndarray:
    """The tiles of ``indices`` as written (no Loader, so no DALI or torch)."""
    out = np.empty((len(indices), *reader.codec.shape), dtype=np.uint8)
    return reader.read_batch_into([int(i) for i in indices], out)


def enlargement(side: int) -> int:
    """The whole factor that brings ``side`` to at least MIN_DISPLAY: whole, so every pixel of
    the tile stays a block of equal pixels on the sheet."""
    return max(1, math.ceil(MIN_DISPLAY / side))


# -- captions --------------------------------------------------------------------------------------
def sample_captions(reader: StoreReader, indices: np.ndarray, labels: np.ndarray) -> list[tuple[str, ...]]:
    """Per sample: its class name, its index and its source path (when the store keeps it)."""
    sources = source_paths(reader, indices)
    return [tuple(line for line in (printable(reader.classes[int(label)]), f"#{int(i)}", printable(src))
                  if line)
            for i, label, src in zip(indices, labels, sources, strict=True)]


def _fit(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any, keep_end: bool) -> str:
    """``text`` shortened with '...' to ``width`` pixels; paths keep their end (the file name)."""
    if draw.textlength(text, font=font) <= width:
        return text
    for cut in range(1, len(text)):
        short = "..." + text[cut:] if keep_end else text[:-cut] + "..."
        if draw.textlength(short, font=font) <= width:
            return short
    return ""


def caption_name(reader: StoreReader, name: str | None) -> str | None:
    """The caption to draw under each sample.

    Parameters
    ----------
    reader : StoreReader
        The store.
    name : str or None
        A caption name the store holds; None: the store's first.

    Returns
    -------
    str or None
        The name, or None for a store without captions (and ``name`` None).

    Raises
    ------
    ConfigError
        ``name`` is not a caption of the store (the message names those it holds).
    """
    held = reader.meta.texts
    if name is None:
        return held[0] if held else None
    if name not in held:
        raise ConfigError(f"text: the store holds no caption named {printable(name)!r} "
                          f"(it holds: {', '.join(held) or 'none'})")
    return name


def sample_texts(reader: StoreReader, indices: np.ndarray, name: str) -> list[str]:
    """Each sample's caption, ready to draw.

    Every chunk of the caption array is checked as it is read (``read_strings``).

    Parameters
    ----------
    reader : StoreReader
        The store.
    indices : numpy.ndarray
        Sample indices.
    name : str
        A caption name the store holds.

    Returns
    -------
    list of str
        Per sample, the caption of its source, runs of whitespace (newlines too) as one space
        and other control characters escaped.
    """
    from tilefeed.store.pairs import read_strings, sample_rows

    captions = read_strings(reader.root, reader.meta, fmt.text_array(name))
    rows = sample_rows(reader.root, reader.meta)[indices]
    return [printable(" ".join(str(captions[int(row)]).split())) for row in rows]


def _longest(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any, suffix: str = "") -> int:
    """The most leading characters of ``text`` that fit ``width`` pixels followed by ``suffix``
    (a search, not a scan: a caption may be 32 KiB)."""
    low, high = 0, min(len(text), width)  # no drawn character is narrower than a pixel
    while low < high:
        mid = (low + high + 1) // 2
        if draw.textlength(text[:mid] + suffix, font=font) <= width:
            low = mid
        else:
            high = mid - 1
    return low


def wrap(draw: ImageDraw.ImageDraw, text: str, width: int, font: Any,
         lines: int = TEXT_LINES) -> tuple[str, ...]:
    """A caption laid over lines of a cell's width.

    Parameters
    ----------
    draw : PIL.ImageDraw.ImageDraw
        What measures the text.
    text : str
        One line of text.
    width : int
        The most pixels a line may take.
    font : PIL.ImageFont.FreeTypeFont or PIL.ImageFont.ImageFont
        The font it is drawn in.
    lines : int
        The most lines it may take.

    Returns
    -------
    tuple of str
        At most ``lines`` lines, broken at spaces where a line holds one (inside a word wider
        than the line), the last shortened with '...' when the text goes on; empty for ''.
    """
    out: list[str] = []
    rest = text
    while rest and len(out) < lines:
        if draw.textlength(rest, font=font) <= width:
            out.append(rest)
            break
        if len(out) == lines - 1:
            out.append(rest[: _longest(draw, rest, width, font, "...")].rstrip() + "...")
            break
        fits = _longest(draw, rest, width, font)
        space = rest.rfind(" ", 0, fits + 1)
        cut = space if space > 0 else max(fits, 1)  # a word wider than the line is cut inside it
        out.append(rest[:cut])
        rest = rest[cut:].lstrip()
    return tuple(out)


# -- the sheet -------------------------------------------------------------------------------------
def draw_sheet(tiles: Sequence[np.ndarray], captions: list[tuple[str, ...]], *, scale: int,
               boxes: np.ndarray | None = None, indices: Sequence[int] = (),
               path_line: int | None = None, targets: Sequence[dict[str, Any]] | None = None,
               texts: Sequence[str] | None = None, text: str = "") -> Sheet:
    """Tiles in a grid of ceil(sqrt(n)) columns, each enlarged ``scale`` times (nearest) and
    captioned underneath; ``boxes`` (top, left, height, width per tile, in its pixels) drawn in
    BOX_COLOUR along their inner edge, so the box's outermost picture pixels carry it. Caption
    lines too long for the tile are shortened at the end, but line ``path_line`` (a path) at its
    start, keeping the file name. ``targets``: per tile, its ``boxes`` (XYXY in its pixels) drawn
    in their ``labels``' colours, and its ``masks`` laid over it (``mask_ids``). ``texts``: per
    tile, a caption (named ``text``) drawn under its other lines, wrapped (``wrap``); the band
    under the cells grows by the most lines one takes."""
    font = ImageFont.load_default()
    line = int(font.getbbox("Ag")[3]) + 2
    side = max(max(t.shape[0], t.shape[1]) for t in tiles) * scale
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    wrapped = [wrap(measure, t, side, font) for t in texts] if texts is not None else []
    strip = line * (max(len(c) for c in captions) + max(map(len, wrapped), default=0)) + GAP
    columns = math.ceil(math.sqrt(len(tiles)))
    rows = math.ceil(len(tiles) / columns)
    sheet = Image.new("RGB", (GAP + columns * (side + GAP), GAP + rows * (side + strip + GAP)),
                      SHEET_COLOUR)
    draw = ImageDraw.Draw(sheet)
    cells = []
    for k, (tile, caption) in enumerate(zip(tiles, captions, strict=True)):
        row, column = divmod(k, columns)
        x, y = GAP + column * (side + GAP), GAP + row * (side + strip + GAP)
        cells.append((x, y))
        target = targets[k] if targets is not None else None
        ids = mask_ids(target) if target is not None else None
        if ids is not None:
            tile = overlay(np.asarray(tile), ids)
        picture = Image.fromarray(np.ascontiguousarray(tile), "RGB")
        if scale > 1:
            picture = picture.resize((picture.width * scale, picture.height * scale),
                                     Image.Resampling.NEAREST)
        # a thumbnail smaller than the cell sits in its middle
        sheet.paste(picture, (x + (side - picture.width) // 2, y + (side - picture.height) // 2))
        if boxes is not None:
            top, left, height, width = (int(v) * scale for v in boxes[k])
            draw.rectangle((x + left, y + top, x + left + width - 1, y + top + height - 1),
                           outline=BOX_COLOUR)
        if target is not None and "boxes" in target:
            for (x0, y0, x1, y1), label in zip(np.asarray(target["boxes"], dtype=np.float64).tolist(),
                                               np.asarray(target["labels"]).tolist(), strict=True):
                # continuous XYXY: the box covers pixels x0 .. x1 - 1
                draw.rectangle((x + round(x0 * scale), y + round(y0 * scale), x + round(x1 * scale) - 1,
                                y + round(y1 * scale) - 1), outline=palette(int(label)), width=max(1, scale))
        lines = [_fit(draw, t, side, font, keep_end=n == path_line) for n, t in enumerate(caption)]
        for n, fitted in enumerate([*lines, *(wrapped[k] if wrapped else ())]):
            draw.text((x, y + side + GAP // 2 + n * line), fitted, fill=TEXT_COLOUR, font=font)
    return Sheet(sheet, captions, cells, side, scale, [int(i) for i in indices], text, wrapped)


def contact_sheet(reader: StoreReader, *, train: bool = False, epoch: int = 0, seed: int = 0,
                  size: int | None = None, count: int | None = None,
                  samples: Sequence[int] | None = None, show_stored: bool = False,
                  text: str | None = None) -> Sheet:
    """The sheet of the chosen samples: as the Loader yields them, or (``show_stored``) as
    stored, with each picture's box drawn where the store holds padding. On a store with
    captions, each sample's caption ``text`` (None: the store's first) is drawn under it."""
    name = caption_name(reader, text)
    indices = select(reader, train=train, epoch=epoch, seed=seed, count=count, samples=samples)
    boxes = None
    if show_stored:
        pixels, labels, side = stored(reader, indices), reader.labels[indices], reader.tile
        targets = stored_targets(reader, indices)
        if reader.padded:
            boxes = reader.boxes[indices]
    else:
        pixels, labels, side, targets = loaded(reader, indices, train=train, epoch=epoch, seed=seed, size=size)
    texts = sample_texts(reader, indices, name) if name is not None else None
    return draw_sheet(list(pixels), sample_captions(reader, indices, labels), scale=enlargement(side),
                      boxes=boxes, indices=indices.tolist(), path_line=2, targets=targets,
                      texts=texts, text=name or "")


# -- rejected inputs -------------------------------------------------------------------------------
def thumbnail(path: str) -> tuple[np.ndarray | None, str]:
    """(a thumbnail of what PIL decodes of ``path``, '') or (None, why it cannot be drawn).

    Rejected files are often truncated: what decodes is drawn, the rest left grey, which is
    exactly what a look at them should show."""
    if is_url(path):
        return None, "not a local file"
    file = Path(path)
    if not file.is_file():  # also keeps devices and fifos from being read
        return None, "no longer there" if not file.exists() else "not a regular file"
    truncated = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True  # PIL's switch for partial decodes; restored below
    try:
        with Image.open(file) as image:
            image.draft("RGB", (THUMB, THUMB))  # JPEG: decode at a reduced scale
            if image.width * image.height > THUMB_MAX_PIXELS:
                return None, f"{image.width}x{image.height} is too large to draw"
            image.thumbnail((THUMB, THUMB))
            return np.asarray(image.convert("RGB")), ""
    except Exception as e:  # noqa: BLE001 - any decoder failure is a reason, not a crash
        return None, f"does not decode: {printable(str(e) or type(e).__name__)}"
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = truncated


def reject_sheet(rejects: Sequence[tuple[str, str]]) -> tuple[Sheet | None, list[str]]:
    """(a sheet of the rejected inputs that still partly decode, or None; one line per reject)."""
    tiles: list[np.ndarray] = []
    captions: list[tuple[str, ...]] = []
    lines: list[str] = []
    for path, reason in rejects:
        line = f"rejected   {printable(path)}: {printable(reason)}"
        picture, why = thumbnail(path)
        if picture is None:
            line += f"  (not drawn: {why})"
        else:
            tiles.append(picture)
            captions.append((printable(Path(path).name), printable(reason)))
        lines.append(line)
    sheet = draw_sheet(tiles, captions, scale=1, path_line=0) if tiles else None
    return sheet, lines
