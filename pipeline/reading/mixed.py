"""Several open stores read as one: ``MixedReader``, and ``combine_labels`` for their classes.

Source ``s``'s sample ``i`` is the global id ``offsets[s] + i`` (``offsets[s]``: the sizes of
the sources before it). Everything a ``StoreReader`` offers the Loader, its reader threads and
its graph is here, taking global ids. Local sources' tiles are read as one store's are: every
tile of a batch in one pass, in the batch's order, each from its own store's shard. Otherwise
(a source in a bucket) a batch's ids are split by source, each source is called once with its
own ids in the batch's order, and the results go back in the batch's order.
Labels and boxes are ``MixedArray`` views that gather from the sources' own (memory-mapped)
arrays at each lookup, so memory does not grow with the stores. Their boxes and masks, each
sample's from its own store: ``targets`` (``reading.mixed_targets``).

What can be mixed: stores of one tile side, and of one decoder. JPEG tiles are decoded by
nvJPEG or the host's JPEG decoder, lossless ones on the host, and a graph is built for one kind;
lossless stores must also share the codec, since tiles cut and resized on the host are decoded by
one codec, ``reader.codec`` (``source.BatchSource``). JPEG stores of different qualities mix.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Sequence
from enum import StrEnum
from functools import cached_property
from typing import Any, Final

import numpy as np

from tilefeed.pipeline.reading.mixed_targets import MixedTargets
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.store.codec import TileCodec
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError
from tilefeed.store.shard import read_tiles_into
from tilefeed.store.remote import RemoteStore



class LabelRule(StrEnum):
    """How the class lists of a mixture's stores combine (``combine_labels``, ``Mix(labels=)``);
    a member equals its string."""

    SAME = "same"
    OFFSET = "offset"
    NAMES = "names"


LABEL_RULES: Final = tuple(rule.value for rule in LabelRule)  # plain strings, for messages
SHOWN: Final = 8  # classes of a list an error message shows


def combine_labels(classes: Sequence[Sequence[str]], names: Sequence[str],
                   rule: LabelRule | str = LabelRule.SAME) -> tuple[list[str], list[np.ndarray]]:
    """The class list of a mixture of sources with ``classes`` (one list each, sources called
    ``names``), and per source an int64 array mapping its label ids to the mixture's.

    ``"same"``: every list must equal the first (else a ConfigError naming the first two that
    differ); labels are unchanged. ``"offset"``: each source's classes come after the previous
    sources', kept apart even where names repeat, each named ``"<source>/<class>"`` so the list
    says whose it is. ``"names"``: one class per distinct name, in order of first appearance over
    the sources in order; a name is the same class in every source (for sources whose names are
    all different this is ``"offset"``'s labels without the prefixes)."""
    if len(classes) != len(names):
        raise ValueError(f"classes and names must have the same length, got {len(classes)} and {len(names)}")
    lists = [list(c) for c in classes]
    rule = choice(LabelRule, rule, "labels")
    if rule is LabelRule.SAME:
        for name, other in zip(names[1:], lists[1:], strict=True):
            if other != lists[0]:
                raise ConfigError(_differ(names[0], lists[0], name, other))
        return (list(lists[0]) if lists else []), [np.arange(len(c), dtype=np.int64) for c in lists]
    if rule is LabelRule.OFFSET:
        starts = itertools.accumulate((len(c) for c in lists[:-1]), initial=0)
        merged = [f"{name}/{c}" for name, one in zip(names, lists, strict=True) for c in one]
        return merged, [np.arange(start, start + len(one), dtype=np.int64)
                        for start, one in zip(starts, lists, strict=True)]
    index: dict[str, int] = {}  # LabelRule.NAMES
    lookups = [np.array([index.setdefault(c, len(index)) for c in one], dtype=np.int64) for one in lists]
    return list(index), lookups


def _differ(first: str, a: list[str], name: str, b: list[str]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    there = " and ".join(repr(c[at]) if at < len(c) else "nothing" for c in (a, b))
    return (f"the stores of a mixture must have the same classes under labels='same': {first!r} has "
            f"{_shown(a)}, {name!r} has {_shown(b)} (first difference at class {at}: {there}); "
            "labels='offset' keeps each store's classes apart, labels='names' merges classes by name")


def _shown(classes: list[str]) -> str:
    if len(classes) <= SHOWN:
        return repr(classes)
    return f"{len(classes)} classes [{', '.join(map(repr, classes[:SHOWN]))}, ...]"


def _as_ids(key: Any) -> np.ndarray:
    """``key`` as an integer array (any shape; empty ones int64), as numpy indexes with it."""
    ids = np.asarray(key)
    if ids.size == 0:
        return ids.astype(np.int64)
    if ids.dtype.kind not in "iu":
        raise IndexError(f"sample ids must be integers, got {ids.dtype}")
    if ids.dtype.kind == "u" and ids.max() > np.iinfo(np.int64).max:
        raise IndexError(f"sample id {ids.max()} is out of range")
    return ids.astype(np.int64, copy=False)  # unsigned ids would turn offsets into floats


class MixedArray:
    """Per-sample arrays of several sources seen as one, indexed by global ids (an int, a slice,
    an integer or boolean array) as a numpy array is: each lookup gathers from the sources' own
    arrays (``parts``), nothing is concatenated. ``lookups``: per source, a map applied to its
    values (its label ids to the mixture's)."""

    def __init__(self, parts: Sequence[np.ndarray], lookups: Sequence[np.ndarray] | None = None) -> None:
        if not parts or len({p.shape[1:] for p in parts}) != 1:
            raise ValueError(f"parts must be one or more arrays of one row shape, got "
                             f"{[p.shape for p in parts]}")
        self.parts = tuple(np.asarray(p) for p in parts)  # a memmap's rows, without its subclass's costs
        self.lookups = None if lookups is None else tuple(lookups)
        self._ends = np.cumsum([len(p) for p in parts], dtype=np.int64)
        self._starts = self._ends - [len(p) for p in parts]
        self.shape: tuple[int, ...] = (int(self._ends[-1]), *parts[0].shape[1:])
        self.dtype = np.result_type(*(self.lookups if self.lookups is not None else self.parts))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        if type(key) is np.ndarray and key.ndim == 1 and key.dtype == np.int64 and key.size:
            if key.min() >= 0 and key.max() < self.shape[0]:  # a batch's ids: the hot path
                return self._gather(key, self._ends.searchsorted(key, side="right"))
        if isinstance(key, slice):
            ids = np.arange(*key.indices(len(self)), dtype=np.int64)
        elif (mask := np.asarray(key)).dtype == bool:
            if mask.shape != (len(self),):
                raise IndexError(f"a boolean index must have shape ({len(self)},), got {mask.shape}")
            ids = np.flatnonzero(mask)
        else:
            ids = _as_ids(mask)
        flat = ids.ravel()
        if flat.size:
            low, high = int(flat.min()), int(flat.max())
            if low < 0:  # counted from the end, as numpy does
                flat = np.where(flat < 0, flat + len(self), flat)
                low, high = int(flat.min()), int(flat.max())
            if low < 0 or high >= len(self):
                bad = low if low < 0 else high
                raise IndexError(f"index {bad - len(self) if bad < 0 else bad} is out of bounds for "
                                 f"{len(self)} samples")
            one = int(np.searchsorted(self._ends, low, side="right"))
            if high < self._ends[one]:  # all from one source (store order, or a small batch)
                rows = self.parts[one][flat - self._starts[one]]
                out = rows if self.lookups is None else self.lookups[one][rows]
                return out.astype(self.dtype, copy=False).reshape((*ids.shape, *self.shape[1:]))[()]
        out = self._gather(flat, self._ends.searchsorted(flat, side="right"))
        return out.reshape((*ids.shape, *self.shape[1:]))[()]  # an int key: a scalar or one row

    def _gather(self, ids: np.ndarray, source: np.ndarray) -> np.ndarray:
        """The rows of 1-D ``ids`` (in range), ``source`` their sources."""
        out = np.empty((ids.size, *self.shape[1:]), dtype=self.dtype)
        for s, part in enumerate(self.parts):  # a batch's ids, gathered per source
            picked = source == s
            rows = part[ids[picked] - self._starts[s]]
            out[picked] = rows if self.lookups is None else self.lookups[s][rows]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("a mixture's per-sample array is not copied whole (it would grow with the "
                        "stores): index it with sample ids")

    def __repr__(self) -> str:
        return f"MixedArray(shape={self.shape}, dtype={self.dtype}, parts={len(self.parts)})"


class RemoteCaches:
    """A mixture's ``remote`` when some source is in a bucket: what ``stats()`` and its advice ask
    of one store's (``remote.cache.counts``), the counts of every bucket source's cache summed."""

    def __init__(self, remotes: Sequence[RemoteStore]) -> None:
        self.remotes = tuple(remotes)

    @property
    def cache(self) -> RemoteCaches:
        return self

    @property
    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for remote in self.remotes:
            for key, value in remote.cache.counts.items():
                total[key] = total.get(key, 0) + value
        return total


class MixedReader:
    """Open ``StoreReader``s (``sources``, called ``names`` in messages and by ``source_of``) read
    as one store of ``sum(sizes)`` samples; ``labels`` is the rule combining their classes
    (``combine_labels``). Safe to share between threads, as each source is; ``close()`` closes
    every source (a closed StoreReader maps its shards again when read)."""

    def __init__(self, sources: Sequence[StoreReader], names: Sequence[str],
                 labels: LabelRule | str = LabelRule.SAME, background: Collection[str] = ()) -> None:
        self.sources = tuple(sources)
        self.names = tuple(names)
        self.background = frozenset(background)
        if not self.sources:
            raise ConfigError("a mixture needs at least one store")
        if len(self.names) != len(self.sources):
            raise ConfigError(f"a mixture needs one name per store: {len(self.sources)} stores, "
                              f"names {list(self.names)!r}")
        if not all(isinstance(n, str) and n for n in self.names) or len(set(self.names)) != len(self.names):
            raise ConfigError(f"the stores of a mixture need distinct non-empty names, got "
                              f"{list(self.names)!r}")
        self.codec: TileCodec = self._check_decoding()
        self._check_background()
        self.tile: int = self.sources[0].tile
        self.sizes = tuple(len(r) for r in self.sources)
        self.offsets = tuple(itertools.accumulate(self.sizes[:-1], initial=0))
        self.samples: int = sum(self.sizes)
        # runs of the smallest shard size lie within at most two shards of any one source
        self.shard_size: int = min(r.shard_size for r in self.sources)
        self.padded = any(r.padded for r in self.sources)
        self.rule = choice(LabelRule, labels, "labels")  # checked here, after the stores, as combine_labels did
        self.classes, self._lookups = combine_labels([r.classes for r in self.sources], self.names, self.rule)
        self.locations = tuple(r.location for r in self.sources)
        self.location = "mixture of " + ", ".join(
            f"{n} ({loc})" for n, loc in zip(self.names, self.locations, strict=True))
        self._starts = np.asarray(self.offsets, dtype=np.int64)
        self._ends = self._starts + self.sizes
        self._shard_sizes = np.array([r.shard_size for r in self.sources], dtype=np.int64)
        self._shard_files = (None if any(r.remote is not None for r in self.sources)
                             else tuple(r.shard_file for r in self.sources))
        self._views()

    def _check_decoding(self) -> TileCodec:
        """The one codec every tile decodes with (see the module docstring), else a ConfigError."""
        first, codec, tile = self.names[0], self.sources[0].codec, self.sources[0].tile
        for name, r in zip(self.names[1:], self.sources[1:], strict=True):
            if r.tile != tile:
                raise ConfigError(f"the stores of a mixture must share the tile side: {first!r} has "
                                  f"{tile}x{tile} tiles, {name!r} has {r.tile}x{r.tile}")
            if r.is_image_coded != codec.is_image_coded:
                raise ConfigError(
                    f"a mixture cannot mix JPEG and lossless stores: {first!r} is {codec.name}, "
                    f"{name!r} is {r.codec.name} (a graph decodes one kind: JPEG tiles with nvJPEG "
                    "or the host's JPEG decoder, lossless ones on the host)")
            if not codec.is_image_coded and r.codec.name != codec.name:
                raise ConfigError(
                    f"the lossless stores of a mixture must share the codec: {first!r} is "
                    f"{codec.name}, {name!r} is {r.codec.name} (tiles cut and resized on the host "
                    "are decoded by one codec, the reader's)")
        return codec

    def _check_background(self) -> None:
        """A background store is one whose images hold no objects: it must hold no targets."""
        unknown = sorted(self.background - set(self.names))
        if unknown:
            raise ConfigError(f"a mixture's background names stores it does not hold: {unknown}")
        for name, r in zip(self.names, self.sources, strict=True):
            if name in self.background and r.targets is not None:
                raise ConfigError(f"the mixture's store {name!r} holds targets, so its images are not "
                                  "background images: drop it from background")

    @cached_property
    def targets(self) -> MixedTargets | None:
        """The stores' targets by global id (``MixedTargets``); None when no store holds any."""
        if all(r.targets is None for r in self.sources):
            return None
        return MixedTargets([r.targets for r in self.sources], self.names, self.sizes,
                            [r.boxes for r in self.sources], self.tile, self.background)

    def _views(self) -> None:
        self.labels = MixedArray([r.labels for r in self.sources], self._lookups)  # (N,) int64
        self.boxes = MixedArray([r.boxes for r in self.sources])  # (N, 4) as each store's

    def __len__(self) -> int:
        return self.samples

    @property
    def is_image_coded(self) -> bool:
        return self.codec.is_image_coded

    @property
    def remote(self) -> RemoteCaches | None:
        """None unless some source is in a bucket; then its caches' counts summed."""
        remotes = [r.remote for r in self.sources if r.remote is not None]
        return RemoteCaches(remotes) if remotes else None

    def source_of(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(source id, sample within that source), int64 and shaped as ``ids`` (global ids)."""
        ids = _as_ids(ids)
        flat = ids.ravel()
        if flat.size and (flat.min() < 0 or flat.max() >= self.samples):
            bad = flat.min() if flat.min() < 0 else flat.max()
            raise IndexError(f"sample {bad} is out of range for {self.samples} samples")
        source = self._ends.searchsorted(flat, side="right")  # an empty source is skipped
        local = flat - self._starts[source]
        return source.reshape(ids.shape), local.reshape(ids.shape)

    def _groups(self, ids: Any) -> Iterator[tuple[StoreReader, np.ndarray, np.ndarray]]:
        """Per source with ids among ``ids``: the source, where its ids lie in ``ids`` and its
        samples there, both in the order of ``ids``."""
        source, local = self.source_of(ids)
        source, local = source.ravel(), local.ravel()
        if source.size and source[0] == source[-1] and (source == source[0]).all():
            yield self.sources[int(source[0])], np.arange(source.size), local  # one source's batch
            return
        for s, reader in enumerate(self.sources):
            places = np.flatnonzero(source == s)
            if places.size:
                yield reader, places, local[places]

    def will_read(self, indices: np.ndarray) -> None:
        """The samples about to be read, in order: each source is told its own, in that order
        (none: a bucket source drops the plan it had)."""
        source, local = self.source_of(indices)
        source, local = source.ravel(), local.ravel()
        for s, reader in enumerate(self.sources):
            reader.will_read(local[source == s])

    def payloads(self, indices: Sequence[int]) -> list[memoryview]:
        """The encoded chunks of ``indices``, in their order, checksum verified."""
        places: list[np.ndarray] = []
        found: list[memoryview] = []
        for reader, where, local in self._groups(indices):
            places.append(where)
            found.extend(reader.payloads(local.tolist()))
        if not places:
            return []
        order = np.concatenate(places)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return [found[j] for j in inverse.tolist()]

    def read_batch_into(self, indices: list[int], out: np.ndarray, fast_idct: bool = False) -> np.ndarray:
        """Decode samples ``indices`` into ``out[k]`` (``fast_idct``: JPEG tiles, see
        ``codec.decode_jpeg``). Local sources' tiles are read in one pass, in the batch's order,
        as one store's are; a source in a bucket reads its own."""
        if self._shard_files is not None and indices:
            if min(indices) < 0 or max(indices) >= self.samples:
                self.source_of(indices)  # raises, naming the sample
            ids = np.array(indices, dtype=np.int64)
            source = self._ends.searchsorted(ids, side="right")
            shard, place = np.divmod(ids - self._starts[source], self._shard_sizes[source])
            opened = self._shard_files
            files = [opened[s](i) for s, i in zip(source.tolist(), shard.tolist(), strict=True)]
            read_tiles_into(files, place.tolist(), self.codec, out, range(len(files)), fast_idct)
            return out
        for reader, where, local in self._groups(indices):  # each source decodes in place
            rows = None if len(where) == len(indices) else where.tolist()
            reader.read_batch_into(local.tolist(), out, fast_idct, rows=rows)
        return out

    def read_into(self, index: int, out: np.ndarray) -> np.ndarray:
        """Decode sample ``index`` into ``out`` (T, T, 3) uint8."""
        source, local = self.source_of(index)
        return self.sources[int(source)].read_into(int(local), out)

    def read(self, index: int) -> np.ndarray:
        source, local = self.source_of(index)
        return self.sources[int(source)].read(int(local))

    def stored_nbytes(self, indices: np.ndarray) -> int:
        """Bytes the samples ``indices`` occupy in their shards (``StoreReader.stored_nbytes``)."""
        return sum(reader.stored_nbytes(local) for reader, _where, local in self._groups(indices))

    def close(self) -> None:
        for reader in self.sources:
            reader.close()

    def __enter__(self) -> MixedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
