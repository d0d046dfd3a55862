"""The Loader's options, checked and settled before any store is opened: ``LoaderSettings``.

Aliases resolved, defaults filled in (threads, queue depth, ranks, device), every value checked
with a ``ConfigError`` that names it, so a bad option fails at ``Loader(...)`` and never mid-run;
a missing DALI fails before them all (``require_dali``). What each option does is in the
``Loader`` docstring.
"""

from __future__ import annotations

import math
import operator
import os
import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.device import dali_extra, default_device
from tilefeed.pipeline.reading.mixed import AnyReader
from tilefeed.pipeline.planning.order import SHUFFLES, Shuffle
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.pipeline.planning.sizes import Schedule, check_size
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.pipeline.targets.batches import Targets, TargetsLayout, parse_targets
from tilefeed.pipeline.stats import Advice
from tilefeed.store.errors import ConfigError, DaliMissingError
from tilefeed.store.host import usable_cores

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)


class Layout(StrEnum):
    """How a batch's images are laid out (the Loader's ``layout``); a member equals its string.

    ``NCHW``: channels first, transposed in the graph. ``NHWC``: channels last, as decoded.
    ``CHANNELS_LAST``: NCHW shape over NHWC memory (torch.channels_last), with no transpose.
    """

    NCHW = "NCHW"
    NHWC = "NHWC"
    CHANNELS_LAST = "channels_last"


LAYOUTS = tuple(layout.value for layout in Layout)  # plain strings, for messages and choices
DEVICE_KINDS = ("cpu", "cuda")
# DataLoader options that mean nothing here: accepted so a swap runs, warned about once.
NO_EFFECT = ("collate_fn", "sampler", "batch_sampler", "worker_init_fn", "generator", "timeout",
             "multiprocessing_context")
_warned: set[str] = set()


def require_dali() -> None:
    """A one-line error naming the extra to install, before anything else fails without DALI."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        cuda = torch.version.cuda
        extra = dali_extra(cuda)
        raise DaliMissingError(
            f"the Loader runs on NVIDIA DALI, which is not installed: install tilefeed's [{extra}] extra, "
            f"the one of this torch's CUDA ({cuda or 'a CPU build: either runs without a GPU'})") from None


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int (numpy integers included), at least ``minimum``; else a ConfigError."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return number


def _alias(new: str, new_value: Any, old: str, old_value: Any) -> Any:
    if new_value is not None and old_value is not None:
        raise ConfigError(f"give {new} or {old}, not both (they are the same setting)")
    return new_value if new_value is not None else old_value


def _no_effect(dataloader_options: dict[str, Any]) -> None:
    """DataLoader's options that mean nothing here pass with one warning each; others are typos."""
    unknown = set(dataloader_options) - set(NO_EFFECT)
    if unknown:
        raise TypeError(f"Loader() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    for name, value in dataloader_options.items():
        if value not in (None, 0) and name not in _warned:
            _warned.add(name)
            # stacklevel 4: past this function, LoaderSettings.check and Loader.__init__ to the caller
            warnings.warn(f"Loader ignores DataLoader's {name}=: order, batching and augmentation "
                          "happen in its DALI graph (see the Loader docstring)", stacklevel=4)


def _targets_with(recipe: Recipe) -> None:
    """Refuse, in one line, a recipe's operation that boxes and masks have no meaning of."""
    if recipe.mix is not None:
        raise ConfigError("targets: mixup/cutmix mix image labels into soft targets, which boxes and "
                          "masks have no meaning of; train with targets without mix")


def process_group() -> bool:
    """A ``torch.distributed`` process group exists in this process."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def process_group_world() -> int:
    """The world size this process runs in: its process group's, else its launcher's
    (``WORLD_SIZE``, set by torchrun and accelerate before any group exists), else 1."""
    if process_group():
        return int(torch.distributed.get_world_size())
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_alone(rank: int, world_size: int) -> None:
    """A Loader whose rank and world size defaulted to 0 of 1 (no process group when it was
    built) refuses to run in a job of several processes: each would read every sample."""
    world = process_group_world()
    if world > 1:
        raise ConfigError(f"this Loader took rank {rank} of {world_size} (no process group when it was built), "
                          f"but the job runs {world} processes, so every one would read every sample: "
                          "build it after init_process_group() or Accelerator(), or pass rank= and world_size=")


def _ranks(rank: Any, world_size: Any) -> tuple[int, int]:
    """Both given, or both from ``torch.distributed`` (0 and 1 when it is not initialised)."""
    if (rank is None) != (world_size is None):
        raise ConfigError("give both rank and world_size, or neither (torch.distributed is used)")
    if rank is None or world_size is None:
        rank, world_size = ((torch.distributed.get_rank(), torch.distributed.get_world_size())
                            if process_group() else (0, 1))
    rank, world_size = check_int("rank", rank, 0), check_int("world_size", world_size, 1)
    if rank >= world_size:
        raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


def parse_device(device: str | torch.device | None) -> torch.device:
    """The training device: ``cpu`` or ``cuda[:N]`` (CUDA only where there is one); default
    ``pipeline.device``'s rule. A string of another kind is refused before torch reads it:
    torch knows kinds the Loader cannot feed, and its own error is not a ConfigError."""
    if isinstance(device, str) and device.split(":", 1)[0] not in DEVICE_KINDS:
        raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    try:
        chosen = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError) as e:  # torch's own words for a string it cannot parse
        raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}") from e
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {chosen} was asked for, but CUDA is not available")
    if chosen.type not in DEVICE_KINDS:
        raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {chosen}")
    return chosen


NORMALISATION_RULE = ("mean/std: std all <= 1 means 0..1 units (timm, torchvision; mean then in [0, 1]), "
                      "std all > 1 means 0..255 units (mean in [0, 255], all zero or some value > 1)")


def pixel_units(mean: Any, std: Any) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """``mean`` and ``std`` in 0..255 pixel units, from either unit the scripts use.

    Every ``std`` value <= 1: 0..1 units (timm's ``data_config``, torchvision's ``Normalize``);
    ``mean`` must then lie in [0, 1], and both are scaled by 255. Every ``std`` value > 1: 0..255
    units, kept as given; ``mean`` must lie in [0, 255] and be all zero or have a value > 1 (a
    mean that reads as 0..1 beside a 0..255 std is a unit mixed up). Anything else (std on both
    sides of 1, negative or zero values, not 3 values) is a ``ConfigError`` naming the rule.
    """
    try:
        m, s = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    except (TypeError, ValueError):
        raise ConfigError(f"{NORMALISATION_RULE}; got mean={mean!r}, std={std!r}") from None
    if len(m) != 3 or len(s) != 3 or min(s) <= 0 or min(m) < 0 or not all(map(math.isfinite, m + s)):
        raise ConfigError(f"{NORMALISATION_RULE}, 3 finite values each, std > 0, mean >= 0; "
                          f"got mean={mean!r}, std={std!r}")
    if max(s) <= 1:  # 0..1 units: what timm's and torchvision's recipes write
        if max(m) > 1:
            raise ConfigError(f"{NORMALISATION_RULE}; got std in 0..1 units with mean={mean!r}")
        return tuple(v * 255 for v in m), tuple(v * 255 for v in s)  # type: ignore[return-value]
    if min(s) <= 1:
        raise ConfigError(f"{NORMALISATION_RULE}; got std={std!r}, on both sides of 1")
    if max(m) > 255 or (max(m) > 0 and max(m) <= 1):
        raise ConfigError(f"{NORMALISATION_RULE}; got std in 0..255 units with mean={mean!r}")
    return m, s  # type: ignore[return-value]


def _schedule(size: Any) -> int | Schedule | None:
    """A checked size, or a schedule (checked each time it is asked); None for the tile side."""
    if size is None:
        return None
    if callable(size):
        check_size(size(0), "size(0)")  # a schedule that cannot answer fails here, not mid-run
        return size  # type: ignore[no-any-return]
    return check_size(size)


def _indices(indices: Any, what: str = "indices") -> np.ndarray | None:
    """The subset's samples as int64, before the store says how many there are."""
    if indices is None:
        return None
    subset = np.asarray(indices)
    if subset.ndim != 1 or subset.size == 0 or not np.issubdtype(subset.dtype, np.integer):
        raise ConfigError(f"{what} must be a non-empty 1-D sequence of ints")
    return subset.astype(np.int64)


def store_subset(indices: Any, samples: int, what: str = "indices") -> np.ndarray:
    """``indices`` (a subset of one store) checked against its ``samples`` samples, in store order."""
    subset = _indices(indices, what)
    assert subset is not None
    if subset.min() < 0 or subset.max() >= samples:
        raise ConfigError(f"{what} must lie in 0..{samples - 1}")
    if len(np.unique(subset)) != len(subset):
        raise ConfigError(f"{what} must not repeat a sample")
    return np.sort(subset)


@dataclass(frozen=True, eq=False)  # eq=False: an array and a dict are among the fields
class LoaderSettings:
    """Every ``Loader`` option, checked, with its aliases resolved and its defaults filled in.

    Made by ``check`` from the Loader's keyword arguments; the options that need the open store
    (the tile side, the subset's range) are settled by ``subset`` and the Loader.
    """

    batch_size: int
    shuffle: Shuffle
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    device: torch.device
    train: bool
    size: int | Schedule | None  # None: the tile side, known once the store is open
    crop_pct: float
    dtype: torch.dtype
    layout: Layout
    with_index: bool
    workers: int
    prefetch: int
    pin_memory: bool
    persistent_workers: bool
    indices: np.ndarray | None  # unsorted, unchecked against the store: see subset()
    ledger: str | Path | None
    scale: tuple[float, float]
    ratio: tuple[float, float]
    mean: tuple[float, float, float]  # 0..255 units, whichever the caller gave (pixel_units)
    std: tuple[float, float, float]
    shuffle_window: int
    storage_options: dict[str, Any] | None = field(repr=False)  # credentials: never printed
    cache_dir: str | Path | None
    cache_limit: int | None
    fast_idct: bool
    scaled_decode: bool
    stats: bool
    recipe: Recipe | None = None
    targets: frozenset[Targets] = frozenset()  # what a batch holds besides its images
    targets_layout: TargetsLayout = TargetsLayout.DICTS
    max_objects: int | None = None

    @classmethod
    def check(
        cls, batch_size: Any, *, shuffle: bool | str, seed: int, drop_last: bool, rank: int | None,
        world_size: int | None, device: str | torch.device | None, train: bool,
        size: int | Schedule | None, crop_pct: float | None, dtype: torch.dtype, layout: str,
        with_index: bool, num_workers: int | None, workers: int | None, prefetch_factor: int | None,
        prefetch: int | None, pin_memory: bool, persistent_workers: bool, indices: Any,
        ledger: str | Path | None, scale: tuple[float, float], ratio: tuple[float, float],
        mean: tuple[float, float, float], std: tuple[float, float, float], shuffle_window: int,
        storage_options: dict[str, Any] | None, cache_dir: str | Path | None,
        cache_limit: int | None, fast_idct: bool, scaled_decode: bool, stats: bool,
        recipe: Recipe | None = None, targets: Any = None, targets_layout: str = "dicts",
        max_objects: int | None = None, **dataloader_options: Any,
    ) -> LoaderSettings:
        """The Loader's keyword arguments (its signature holds the defaults), checked one after
        another: the first bad one is the one named. Strings become enum members here, once."""
        _no_effect(dataloader_options)
        batch_size = check_int("batch_size", batch_size, 1)
        if isinstance(shuffle, bool):
            shuffle = Shuffle.GLOBAL if shuffle else Shuffle.NONE
        if shuffle not in SHUFFLES:
            raise ConfigError(f"shuffle must be True, False or one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        order = Shuffle(shuffle)
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(map(str, DTYPES))}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'NCHW', 'NHWC' or 'channels_last', got {layout!r}")
        arrangement = Layout(layout)
        threads = _alias("num_workers", num_workers, "workers", workers)
        threads = min(4, usable_cores()) if threads is None else check_int("num_workers", threads, 1)
        depth = _alias("prefetch_factor", prefetch_factor, "prefetch", prefetch)
        depth = check_int("prefetch_factor", 2 if depth is None else depth, 1)
        asked = parse_targets(targets)
        if crop_pct is None:  # detection evaluates whole pictures; classification, torchvision's 224 of 256
            crop_pct = 1.0 if asked else 0.875
        if not 0 < crop_pct <= 1:
            raise ConfigError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ConfigError(f"ratio must satisfy 0 < min <= max, got {ratio!r}")
        shuffle_window = check_int("shuffle_window", shuffle_window, 1)
        rank, world_size = _ranks(rank, world_size)
        chosen = parse_device(device)
        limit = None if cache_limit is None else check_int("cache_limit", cache_limit, 1)
        schedule, subset = _schedule(size), _indices(indices)
        mean, std = pixel_units(mean, std)  # kept in 0..255 units, whichever were given
        if recipe is not None and not isinstance(recipe, Recipe):
            raise ConfigError(f"recipe must be a tilefeed Recipe or None, got {type(recipe).__name__}")
        if recipe is not None and recipe.per_batch and dtype == torch.uint8 and train:  # eval: the filter alone
            raise ConfigError("random erasing and mixup/cutmix act on the normalised batch: give a float "
                              "dtype (float32, float16 or bfloat16), not uint8")
        if targets_layout not in tuple(TargetsLayout):
            raise ConfigError(f"targets_layout must be one of {', '.join(TargetsLayout)}, "
                              f"got {targets_layout!r}")
        most = None if max_objects is None else check_int("max_objects", max_objects, 1)
        if asked and recipe is not None and train:
            _targets_with(recipe)
        return cls(
            batch_size, order, check_int("seed", seed, 0), bool(drop_last), rank, world_size,
            chosen, bool(train), schedule, float(crop_pct), dtype, arrangement, with_index, threads,
            depth, pin_memory, persistent_workers, subset, ledger,
            tuple(scale), tuple(ratio), mean, std,  # type: ignore[arg-type]
            shuffle_window, storage_options, cache_dir, limit, bool(fast_idct), bool(scaled_decode),
            bool(stats), recipe, asked, TargetsLayout(targets_layout), most)

    def subset(self, samples: int) -> np.ndarray | None:
        """``indices`` checked against a store of ``samples`` samples, in store order."""
        return None if self.indices is None else store_subset(self.indices, samples)

    def augment(self, tile: int, padded: bool) -> Augment:
        """What the graph does to each tile of a store of ``tile``-sided tiles (``padded``: some
        tile holds padding around its picture, so even evaluation cuts per-sample windows)."""
        return Augment(
            train=self.train, tile=tile, normalize=self.dtype != torch.uint8,
            half=self.dtype == torch.float16, channels_first=self.layout is Layout.NCHW,
            crop_pct=self.crop_pct, scale=self.scale, ratio=self.ratio, mean=self.mean,
            # with targets, evaluation frames whole tiles, padding included: the letterbox as stored
            std=self.std, windows=self.train or (padded and not self.targets), fast_idct=self.fast_idct,
            scaled_decode=self.scaled_decode, recipe=self.recipe)

    def open_store(self, store: str | Path | StoreReader) -> StoreReader:
        """``store`` opened (a ``StoreReader`` given is taken as it is), set to stream in the
        order these settings read it: shards in random order under a global shuffle, windows of
        ``shuffle_window`` shards under a shard shuffle."""
        reader = store if isinstance(store, StoreReader) else StoreReader(
            store, storage_options=self.storage_options, cache_dir=self.cache_dir, cache_limit=self.cache_limit)
        reader.stream(random_order=self.shuffle is Shuffle.GLOBAL,
                      window=self.shuffle_window if self.shuffle is Shuffle.SHARD else 1)
        return reader

    def advice(self, reader: AnyReader) -> Advice:
        """What ``stats()`` weighs its advice against: threads and cores, the store, these settings."""
        return Advice(workers=self.workers, cores=usable_cores(), jpeg=reader.is_image_coded,
                      bucket=reader.remote is not None, global_shuffle=self.shuffle is Shuffle.GLOBAL,
                      transposes=self.layout is Layout.NCHW, gpu=self.device.type == "cuda")
