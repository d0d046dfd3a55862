"""A Loader over several stores mixed by weight: ``Loader(Mix({...}, weights={...}), ...)``.

A ``Mix`` names its sources (folders or bucket URLs), their weights, the samples an epoch holds
and how their class lists combine. The Loader then reads one ``MixedReader`` (one index space:
source ``s``'s sample ``i`` is ``offsets[s] + i``): the epoch's positions are ordered and split
over ranks exactly as a single store's samples are (``pipeline.planning.order``), each position then
located in its source by the ``MixturePlan`` (``pipeline.mixing.plan``). So every promise of the
single store holds per position: exactly once over all ranks, mid-epoch and elastic resume, the
ledger (which records positions: a position is one entry of the epoch's planned multiset of
samples), and crops and flips are drawn from the position (a repeated sample is cut anew).

Orders: ``shuffle=True`` interleaves the sources uniformly at random; ``"none"`` reads source
after source, each its full passes in store order, then its extras (in store order too);
``"shard"`` shuffles runs of ``shard_size`` consecutive positions (the smallest source's shard
size), which are runs of a source's store order, so reads stay within a few shards (a store
taken sparsely spreads a run over more of its shards).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tilefeed.pipeline.reading.mixed import LabelRule
from tilefeed.pipeline.mixing.plan import MixturePlan, finite_weight, is_weight
from tilefeed.pipeline.options import Shuffle
from tilefeed.pipeline.mixing.where import narrowed
from tilefeed.pipeline.settings import LoaderSettings, store_subset
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError
from tilefeed.store.storage import is_url

if TYPE_CHECKING:
    from tilefeed.pipeline.reading.mixed import MixedReader
    from tilefeed.pipeline.reading.reader import StoreReader


@dataclass(frozen=True)
class Mix:
    """Several stores read as one, each epoch taking ``weights`` shares of ``epoch_samples``.

    Pass it to ``Loader`` in place of a store.

    Parameters
    ----------
    stores : mapping of str to str or Path
        Name -> folder or bucket URL (each opened with the Loader's storage options and cache).
    weights : mapping of str to float, optional
        Name -> weight (any non-negative numbers); default each source's size, so an epoch reads
        every sample once.
    epoch_samples : int, optional
        Positions an epoch holds (default the sum of the sources' sizes). A source whose share
        exceeds its size repeats, each sample at most once more than any other; one whose share is
        smaller is sub-sampled, every sample visited before any again over consecutive epochs.
    labels : {"same", "offset", "names"}, default "same"
        How class lists combine: ``"same"`` (the stores' lists must be equal), ``"offset"`` (each
        source's classes after the previous sources') or ``"names"`` (merged by class name).
    indices : mapping of str to sequence of int, optional
        Name -> the samples of that store the mixture takes (a train/validation split, as the
        Loader's ``indices`` for one store); its size is then the subset's.
    background : collection of str, optional
        Names of stores made without targets whose images hold no objects (detection's
        background images). A Loader asking for ``targets`` reads each of their samples with no
        boxes and, with masks, an all-background mask; without being named here, a store without
        targets is refused in a Loader that asks for them. Every other store of the mixture must
        hold the targets asked; category ids are kept as each store numbers them, and stores that
        name one id differently are refused.
    replacement : bool, default False
        Draw each position's sample with replacement from its store (open_clip's
        ``--dataset-resampled``): each store still fills its weight's share of the epoch's
        positions, exactly, but which of its samples is a draw of (seed, epoch, position), the
        same across resume and world sizes, so a sample may come twice in an epoch or not at
        all (exactly-once does not apply). open_clip's ``--train-data-upsampling-factors`` are
        weights of each store's size times its factor, ``--train-num-samples`` is
        ``epoch_samples``.
    """

    stores: Mapping[str, str | Path]
    weights: Mapping[str, float] | None = None
    epoch_samples: int | None = None
    labels: LabelRule | str = LabelRule.SAME  # a LabelRule once made
    indices: Mapping[str, Any] | None = None
    background: Collection[str] = ()  # a sorted tuple once made
    replacement: bool = False
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        stores = dict(self.stores)
        if not stores:
            raise ConfigError("Mix needs at least one store")
        if not all(isinstance(n, str) and n for n in stores):
            raise ConfigError(f"Mix store names must be non-empty strings, got {list(stores)!r}")
        if not all(isinstance(v, (str, Path)) for v in stores.values()):
            raise ConfigError("Mix stores must be folders or bucket URLs (str or Path): the Loader opens "
                              "and closes them")
        if self.weights is not None:
            if set(self.weights) != set(stores):
                raise ConfigError(f"Mix weights must name the same sources as the stores: stores "
                                  f"{sorted(stores)}, weights {sorted(self.weights)}")
            weights = list(self.weights.values())
            if not all(is_weight(w) and finite_weight(w) and w >= 0 for w in weights) or not any(
                    w > 0 for w in weights):
                raise ConfigError(f"Mix weights must be finite numbers >= 0, one of them > 0, got "
                                  f"{dict(self.weights)!r}")
        if self.epoch_samples is not None and not (
                isinstance(self.epoch_samples, int) and not isinstance(self.epoch_samples, bool)
                and self.epoch_samples >= 1):
            raise ConfigError(f"Mix epoch_samples must be a whole number >= 1, got {self.epoch_samples!r}")
        if self.indices is not None and not set(self.indices) <= set(stores):
            unknown = sorted(set(self.indices) - set(stores))
            raise ConfigError(f"Mix indices name stores it does not hold: {unknown}")
        if isinstance(self.background, str) or not all(isinstance(n, str) for n in self.background):
            raise ConfigError(f"Mix background must be a collection of store names, got {self.background!r}")
        if not set(self.background) <= set(stores):
            unknown = sorted(set(self.background) - set(stores))
            raise ConfigError(f"Mix background names stores it does not hold: {unknown}")
        if not isinstance(self.replacement, bool):
            raise ConfigError(f"Mix replacement must be True or False, got {self.replacement!r}")
        object.__setattr__(self, "background", tuple(sorted(set(self.background))))
        object.__setattr__(self, "labels", choice(LabelRule, self.labels, "Mix labels"))
        object.__setattr__(self, "stores", stores)
        object.__setattr__(self, "names", tuple(stores))

    def plan(self, sizes: list[int], seed: int) -> MixturePlan:
        weights = sizes if self.weights is None else [self.weights[n] for n in self.names]
        try:
            return MixturePlan(sizes, weights, seed, self.epoch_samples, self.replacement)
        except ValueError as e:
            raise ConfigError(f"Mix {dict(zip(self.names, sizes, strict=True))} (sizes): {e}") from None


@dataclass(frozen=True, eq=False)  # eq=False: arrays are among the fields
class Mixture:
    """A mixture opened: its reader, each store's subset (None: all of it) and its plan."""

    mix: Mix
    reader: MixedReader
    subsets: tuple[np.ndarray | None, ...]
    plan: MixturePlan

    # the order runs over the plan's positions: a subset of a store is its own (``subsets``)
    subset: ClassVar[None] = None
    # a sample taken twice in an epoch is two positions: an id does not say which one it was
    ids_name_positions: ClassVar[bool] = False

    @property
    def positions(self) -> int:
        """The positions an epoch's order permutes: ``epoch_samples``."""
        return len(self.plan)

    @property
    def per_epoch(self) -> int:
        """Samples an epoch covers: one per position."""
        return len(self.plan)

    def locate(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The samples (global ids of the reader) at ``positions`` of ``epoch``."""
        sources, samples = self.plan.locate(epoch, positions)
        for s, subset in enumerate(self.subsets):
            if subset is not None:  # the plan counts a subset's members: to the store's samples
                mine = sources == s
                samples[mine] = subset[samples[mine]]
        return np.asarray(self.reader.offsets, dtype=np.int64)[sources] + samples

    @property
    def selected(self) -> int:
        """The samples the stores' subsets hold (``indices``, ``where``), repeats and shares aside."""
        stores = zip(self.reader.sources, self.subsets, strict=True)
        return sum(len(r) if s is None else len(s) for r, s in stores)

    def identity(self) -> str:
        """What a resumed state must agree on besides seed and shuffle: sources, sizes, subsets,
        quotas, labels, background stores."""
        subsets = [None if s is None else hashlib.sha256(s.tobytes()).hexdigest()[:16] for s in self.subsets]
        described = {"names": self.mix.names, "sizes": self.plan.sizes, "quotas": self.plan.quotas,
                     "labels": self.reader.rule.value, "shard_size": self.reader.shard_size, "subsets": subsets}
        if self.mix.background:  # which stores' images hold no objects decides a batch's targets
            described["background"] = list(self.mix.background)
        if self.mix.replacement:  # other draws entirely
            described["replacement"] = True
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """What the ledger records beside the epoch's positions: the sources and their blocks
        of them, for its audit per source."""
        return {"mixture": {"names": list(self.mix.names), "starts": list(self.plan.starts),
                            "quotas": list(self.plan.quotas)}}

    def source_of(self, ids: Any) -> tuple[list[str], np.ndarray]:
        """The store names and sample indices of ``with_index`` ids (a tensor on any device, or numbers)."""
        sources, samples = self.reader.source_of(_ids(ids))
        return [self.mix.names[k] for k in sources.tolist()], samples

    def epoch_labels(self, samples: np.ndarray) -> np.ndarray:
        """The labels of an epoch's ``samples``, gathered at once: gathered per batch, split by
        store, they cost the rate a few percent (``tilefeed bench loader``), far more than their
        own CPU time."""
        return self.reader.labels[samples]


@dataclass(frozen=True, eq=False)  # eq=False: an array is among the fields
class OneStore:
    """One store read as a mixture of one source under the identity plan: an epoch's positions
    are the store's samples (of ``subset``, when the Loader was given ``indices``), each its own
    position.

    Parameters
    ----------
    reader : StoreReader
        The store, opened.
    subset : numpy.ndarray or None
        The samples the Loader reads (sorted, checked against the store); None: all of them.
    """

    reader: StoreReader
    subset: np.ndarray | None
    ids_name_positions: ClassVar[bool] = True  # every sample is one position, named by its id

    @property
    def positions(self) -> int:
        """The positions an epoch's order permutes: the store's samples (the order takes the
        subset's among them)."""
        return len(self.reader)

    @property
    def per_epoch(self) -> int:
        """Samples an epoch covers: the store's, or the subset's."""
        return len(self.reader) if self.subset is None else len(self.subset)

    @property
    def selected(self) -> int:
        """The samples the subset holds (``indices``, ``where``): the store's without one."""
        return self.per_epoch

    def locate(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The identity plan: a position is the sample of the same index."""
        return positions

    def identity(self) -> None:
        """What a resumed state must agree on besides seed, shuffle, samples and subset: nothing
        more (the state names no mixture)."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the ledger records beside the epoch's positions: nothing, since one store's
        positions are its samples (no sources and blocks to audit apart)."""
        return {}

    def source_of(self, ids: Any) -> tuple[list[str], np.ndarray]:
        """The store's location and the sample indices of ``with_index`` ids."""
        samples = _ids(ids)
        return [self.reader.location] * len(samples), samples

    def epoch_labels(self, samples: np.ndarray) -> None:
        """None: each batch gathers its own labels from the one store, as cheap as in one go."""
        return None


# What a Loader reads: one store, or several mixed by weight.
Sources = OneStore | Mixture


def _ids(ids: Any) -> np.ndarray:
    """``with_index`` ids (a tensor on any device, or numbers) as int64."""
    return np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids, dtype=np.int64)


def open_reader(store: str | Path | StoreReader, settings: LoaderSettings) -> StoreReader:
    """``store`` opened (a ``StoreReader`` given is taken as it is), set to stream in the order
    ``settings`` read it: shards in random order under a global shuffle, windows of
    ``shuffle_window`` shards under a shard shuffle."""
    from tilefeed.pipeline.reading.reader import StoreReader

    reader = store if isinstance(store, StoreReader) else StoreReader(
        store, storage_options=settings.storage_options, cache_dir=settings.cache_dir,
        cache_limit=settings.cache_limit)
    reader.stream(random_order=settings.shuffle is Shuffle.GLOBAL,
                  window=settings.shuffle_window if settings.shuffle is Shuffle.SHARD else 1)
    return reader


def open_sources(store: str | Path | StoreReader | Mix, settings: LoaderSettings) -> Sources:
    """What a Loader reads: a ``Mix``'s stores (``open_mix``), or one store with the Loader's
    ``indices`` (``open_reader``)."""
    if isinstance(store, Mix):
        return open_mix(store, settings)
    reader = open_reader(store, settings)
    try:
        return OneStore(reader, narrowed(reader, settings.where, settings.subset(len(reader)), reader.location))
    except BaseException:
        if reader is not store:  # the caller's own reader stays open
            reader.close()
        raise


def open_mix(mix: Mix, settings: LoaderSettings) -> Mixture:
    """Each source opened (as ``open_reader`` opens one store) and checked against the others by
    ``MixedReader``; the plan keyed on the Loader's seed."""
    from tilefeed.pipeline.reading.mixed import MixedReader
    from tilefeed.pipeline.reading.reader import StoreReader

    if settings.indices is not None:
        raise ConfigError("indices selects samples of one store; a Mix takes none (sub-sample a "
                          "store with its weight and epoch_samples)")
    opened: list[StoreReader] = []
    try:
        for store in mix.stores.values():  # the bucket options are for the stores in buckets
            opened.append(open_reader(store if is_url(store) else StoreReader(store), settings))
        reader = MixedReader(opened, list(mix.names), mix.labels, mix.background)
        given = mix.indices or {}
        subsets = tuple(narrowed(r, settings.where, None if n not in given else store_subset(
                            given[n], len(r), f"Mix indices of {n!r}"), n)
                        for n, r in zip(mix.names, opened, strict=True))
        sizes = [len(r) if s is None else len(s) for r, s in zip(opened, subsets, strict=True)]
        return Mixture(mix, reader, subsets, mix.plan(sizes, settings.seed))
    except BaseException:
        for one in opened:
            one.close()
        raise
