"""The targets of a mixture of stores: ``MixedTargets``, what ``StoreTargets`` offers the Loader,
indexed by the mixture's global ids.

Each sample's objects, frame and mask tile come from its own store (``offsets[s] + i`` is source
``s``'s sample ``i``, as ``MixedReader`` numbers them). The object rows are gathered once into one
table (``offsets``, ``objects``) so a batch's boxes, and SSD's IoU crop, index them as one store's;
the rows are the small arrays every store already holds in memory, so this doubles only those.

Category ids are kept as each store holds them (a box's label is the id its annotations gave):
stores that name the same id must give it the same name, or the mixture is refused, naming the
id and both names. A store named in ``background`` holds no targets and its images no objects
(detection's background images): each of its samples has no boxes, and as a mask, background
(instance masks: 0 everywhere; semantic masks: the class named ``background`` inside the picture
and 255, ignore, in the tile's pad, as a semantic store's pad is).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import cached_property
from typing import Final

import numpy as np

from tilefeed.store import format as fmt
from tilefeed.store.errors import ConfigError
from tilefeed.store.format import MaskKind
from tilefeed.store.targets import StoreTargets, object_counts, object_rows

BACKGROUND_CLASS: Final = "background"  # the semantic class a background image's pixels get


def combine_categories(tables: Sequence[Sequence[tuple[int, str]]],
                       names: Sequence[str]) -> tuple[tuple[int, str], ...]:
    """One category table for stores whose boxes keep their ids: the union of ``tables`` (one
    per store, the stores called ``names``), by id.

    Parameters
    ----------
    tables : sequence of sequence of (int, str)
        Each store's (id, name) pairs.
    names : sequence of str
        The stores' names in the mixture, for messages.

    Returns
    -------
    tuple of (int, str)
        Every id any store names, sorted, with its name.

    Raises
    ------
    ConfigError
        Two stores give one id different names.
    """
    merged: dict[int, tuple[str, str]] = {}  # id -> (name, the first store naming it)
    for store, table in zip(names, tables, strict=True):
        for category, name in table:
            first = merged.setdefault(category, (name, store))
            if first[0] != name:
                raise ConfigError(
                    f"the stores of a mixture keep their category ids, and name category {category} "
                    f"differently: {first[1]!r} calls it {first[0]!r}, {store!r} calls it {name!r} "
                    "(number one store's categories as the other's when preprocessing it)")
    return tuple((category, merged[category][0]) for category in sorted(merged))


class MixedTargets:
    """The targets of a mixture's stores (``MixedReader.targets``), by global sample id.

    Parameters
    ----------
    sources : sequence of StoreTargets or None
        Each store's targets (None: a store without targets).
    names : sequence of str
        The stores' names in the mixture.
    sizes : sequence of int
        Each store's samples.
    pictures : sequence of numpy.ndarray
        Each store's picture boxes ((n, 4) top, left, height, width in its tiles).
    tile : int
        The tile side every store shares.
    background : collection of str
        Stores whose images hold no objects (each must be one without targets).

    Attributes
    ----------
    offsets : numpy.ndarray or None
        (N+1,) int64: sample i's objects are rows ``offsets[i]:offsets[i+1]`` of ``objects``
        (None when no store holds boxes).
    objects : numpy.ndarray or None
        (M, 6) float64 rows as ``StoreTargets.objects``, every store's in order.
    masks : MaskKind or None
        The stores' mask kind (None when none holds masks; ``check`` refuses kinds that differ).
    """

    def __init__(self, sources: Sequence[StoreTargets | None], names: Sequence[str], sizes: Sequence[int],
                 pictures: Sequence[np.ndarray], tile: int, background: Collection[str] = ()) -> None:
        self.sources = tuple(sources)
        self.names = tuple(names)
        self.sizes = tuple(int(n) for n in sizes)
        self.background = frozenset(background)
        self.tile = tile
        self.location = "mixture of " + ", ".join(self.names)
        self._pictures = tuple(pictures)
        self._starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        kinds = [t.masks for t in self.sources if t is not None and t.masks is not None]
        self.masks: MaskKind | None = kinds[0] if kinds else None
        self.offsets, self.objects = self._rows()

    @cached_property
    def categories(self) -> tuple[tuple[int, str], ...]:
        """The stores' category tables merged (``combine_categories``; a ConfigError where two
        stores name one id differently)."""
        return combine_categories([() if t is None else t.record.categories for t in self.sources], self.names)

    def _rows(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Every store's object rows as one table; a store without boxes adds none."""
        if not any(t is not None and t.offsets is not None for t in self.sources):
            return None, None
        counts, tables = [], []
        for t, size in zip(self.sources, self.sizes, strict=True):
            if t is None or t.offsets is None or t.objects is None:
                counts.append(np.zeros(size, dtype=np.int64))
            else:
                counts.append(np.diff(t.offsets))
                tables.append(t.objects)
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int64)
        objects = np.concatenate(tables) if tables else np.zeros((0, 6))
        return offsets, objects

    def check(self, boxes: bool, masks: bool, what: str = "targets") -> None:
        """Refuse, in one line naming the store, a store that cannot give what is asked: one
        without targets not named in ``background``, one without the boxes or masks asked,
        masks of two kinds, stores naming one category id differently, or a semantic background
        image whose class the tables do not name.

        Parameters
        ----------
        boxes, masks : bool
            Boxes, masks asked.
        what : str
            The option asking, for messages.
        """
        for name, t in zip(self.names, self.sources, strict=True):
            if name in self.background:
                continue
            if t is None:
                raise ConfigError(
                    f"{what}: the mixture's store {name!r} holds no boxes or masks; if its images hold "
                    f"no objects (background images), name it in Mix(background=...)")
            if boxes and t.offsets is None:
                raise ConfigError(f"{what}: boxes asked of the mixture's store {name!r}, which holds none")
            if masks and t.masks is None:
                raise ConfigError(f"{what}: masks asked of the mixture's store {name!r}, which holds none")
            if masks and t.masks is not self.masks:
                first = next(n for n, s in zip(self.names, self.sources, strict=True)
                             if s is not None and s.masks is self.masks)
                raise ConfigError(f"{what}: the mixture's masks differ in kind: {first!r} holds "
                                  f"{self.masks} masks, {name!r} {t.masks} masks")
        _ = self.categories  # stores that name one id differently are refused here
        if masks and self.masks is MaskKind.SEMANTIC and self.background:
            self._background_class()

    def _background_class(self) -> int:
        found = [i for i, n in self.categories if n == BACKGROUND_CLASS]
        if not found:
            raise ConfigError(
                "targets: a background store's semantic masks need the class its pixels are: the "
                f"mixture's stores name no category {BACKGROUND_CLASS!r} (their classes.txt)")
        return found[0]

    def _located(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._starts[-1]):
            raise IndexError(f"sample {idx.min() if idx.min() < 0 else idx.max()} is out of range for "
                             f"{int(self._starts[-1])} samples")
        source = self._starts[1:].searchsorted(idx, side="right")
        return source, idx - self._starts[source]

    def rows(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Each sample's object rows, (k, 6) float64 (read-only views); empty rows without boxes."""
        return object_rows(self.offsets, self.objects, indices)

    def counts(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Each sample's object count, int64."""
        return object_counts(self.offsets, indices)

    def frames_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """(n, 4) float64: each sample's sx, sy, tx, ty; a ConfigError for a sample of a store
        without targets (its frames were not kept)."""
        source, local = self._located(indices)
        out = np.empty((len(source), 4), dtype=np.float64)
        for s, t in enumerate(self.sources):
            mine = source == s
            if not mine.any():
                continue
            if t is None:
                raise ConfigError(f"the mixture's store {self.names[s]!r} holds no frames (it was made "
                                  "without targets): its boxes cannot be mapped to its source images")
            out[mine] = t.frames_of(local[mine])
        return out

    def read_masks_into(self, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> None:
        """The mask tiles of ``indices`` decoded into ``out`` ((n, T, T) uint8), each from its own
        store (``StoreTargets.read_masks_into``'s checks); a background store's as background."""
        if self.masks is None:
            raise ValueError("no store of this mixture holds masks")
        source, local = self._located(indices)
        t = self.tile
        if out.dtype != np.uint8 or out.shape != (len(source), t, t):
            raise ValueError(f"out must be uint8 ({len(source)}, {t}, {t}), got {out.dtype} {out.shape}")
        for s, targets in enumerate(self.sources):
            places = np.flatnonzero(source == s)
            if not places.size:
                continue
            if targets is None or targets.masks is None:
                self._background_masks(s, local[places], out, places)
            elif places.size == len(source) and out.flags.c_contiguous:
                targets.read_masks_into(local, out)  # one store's batch: in place
            else:
                part = np.empty((places.size, t, t), dtype=np.uint8)
                targets.read_masks_into(local[places], part)
                out[places] = part

    def _background_masks(self, source: int, local: np.ndarray, out: np.ndarray, places: np.ndarray) -> None:
        if self.masks is MaskKind.INSTANCE:
            out[places] = 0
            return
        inside = self._background_class()
        pictures = self._pictures[source][local]
        for k, (top, left, height, width) in zip(places.tolist(), pictures.tolist(), strict=True):
            out[k] = fmt.MASK_IGNORE  # the pad, as a semantic store's
            out[k, top:top + height, left:left + width] = inside

    def close(self) -> None:
        """Nothing of its own to close: each store's targets close with their reader."""
