"""The Loader's options, checked and settled before any store is opened: ``LoaderSettings``.

One table: each field of ``LoaderSettings`` is an option, and its ``option(check)`` says how a
caller's value becomes the field's (aliases resolved, defaults filled in, strings turned into
enum members once); ``check`` runs them in the fields' order, so the first bad option is the one
named, then the rules between options (``_together``). Everything here is a value: opening the
store, building the graph and its advice happen in the rooms above (``loader.assembly``,
``mixing.mix``). What each option does is in the ``Loader`` docstring; its defaults are in the
Loader's signature, the one place a caller reads them.
"""

from __future__ import annotations

import inspect
import math
import operator
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import fields as table
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import numpy as np
import torch

from tilefeed.pipeline.device import dali_extra, default_device
from tilefeed.pipeline.options import (
    DATALOADER_ONLY,
    Layout,
    Shuffle,
    Targets,
    TargetsLayout,
    TextChoice,
    parse_fields,
    parse_targets,
    parse_text,
    parse_tokenizer,
    parse_where,
    Where,
)
from tilefeed.pipeline.planning.sizes import Schedule, check_size
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError, DaliMissingError
from tilefeed.store.host import usable_cores

T = TypeVar("T")
C = TypeVar("C", bound=type)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
DEVICE_KINDS = ("cpu", "cuda")
# DataLoader's names for two options, beside tilefeed's older ones: either may be given, not both
ALIASES = {"workers": "num_workers", "prefetch": "prefetch_factor"}
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


def _dataloader_only(dataloader_options: dict[str, Any]) -> None:
    """DataLoader's options that mean nothing here pass with one warning each, saying why; any
    other unknown keyword is a typo."""
    unknown = set(dataloader_options) - set(DATALOADER_ONLY)
    if unknown:
        raise TypeError(f"Loader() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    for name, value in dataloader_options.items():
        if value not in (None, 0) and name not in _warned:
            _warned.add(name)
            # stacklevel 4: past this function, LoaderSettings.check and Loader.__init__ to the caller
            warnings.warn(f"Loader ignores DataLoader's {name}=: {DATALOADER_ONLY[name]}", stacklevel=4)


def _targets_with(recipe: Recipe) -> None:
    """Refuse, in one line, a recipe's operation that boxes and masks have no meaning of."""
    if recipe.batch_mix is not None:
        raise ConfigError("targets: mixup/cutmix mix image labels into soft targets, which boxes and "
                          "masks have no meaning of; train with targets without batch_mix")


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


def option(check: Callable[[Any], Any]) -> Any:
    """A ``LoaderSettings`` field that is a Loader option: ``check`` turns the caller's value
    (the Loader's default where none was given) into the field's, or raises a ``ConfigError``
    naming the option."""
    return field(metadata={"check": check})


def derived() -> Any:
    """A ``LoaderSettings`` field no caller gives: ``_together`` settles it from the options."""
    return field(metadata={"check": None})


def _given(value: Any) -> Any:
    """An option taken as it is given (what it means is checked where it is used, or with others)."""
    return value


def _shuffle(value: Any) -> Shuffle:
    if isinstance(value, bool):
        return Shuffle.GLOBAL if value else Shuffle.NONE
    if value not in tuple(Shuffle):
        raise ConfigError(f"shuffle must be True, False or one of {', '.join(Shuffle)}, got {value!r}")
    return Shuffle(value)


def _dtype(value: Any) -> torch.dtype:
    if value not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(map(str, DTYPES))}, got {value!r}")
    return value  # type: ignore[no-any-return]


def _crop_pct(value: Any) -> float | None:
    """None until ``_together`` knows whether targets are asked (the default differs)."""
    if value is not None and not 0 < value <= 1:
        raise ConfigError(f"crop_pct must be in (0, 1], got {value!r}")
    return None if value is None else float(value)


def _scale(value: Any) -> tuple[float, float]:
    if not 0 < value[0] <= value[1] <= 1:
        raise ConfigError(f"scale must satisfy 0 < min <= max <= 1, got {value!r}")
    return (value[0], value[1])


def _ratio(value: Any) -> tuple[float, float]:
    if not 0 < value[0] <= value[1]:
        raise ConfigError(f"ratio must satisfy 0 < min <= max, got {value!r}")
    return (value[0], value[1])


def _at_least(name: str, minimum: int) -> Callable[[Any], int]:
    """An int option of at least ``minimum`` (None is refused as any other non-int is)."""
    return lambda value: check_int(name, value, minimum)


def _optional(name: str, minimum: int, default: int | None = None) -> Callable[[Any], int | None]:
    """An int option of at least ``minimum``, or None (``default`` where one replaces it)."""
    def checked(value: Any) -> int | None:
        return default if value is None else check_int(name, value, minimum)
    return checked


def _labels(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"labels must be True, False or None, got {value!r}")
    return value  # type: ignore[no-any-return]


def _recipe(value: Any) -> Recipe | None:
    if value is not None and not isinstance(value, Recipe):
        raise ConfigError(f"recipe must be a tilefeed Recipe or None, got {type(value).__name__}")
    return value  # type: ignore[no-any-return]


def _workers(value: Any) -> int:
    return min(4, usable_cores()) if value is None else check_int("num_workers", value, 1)


@dataclass(frozen=True, eq=False, kw_only=True)  # eq=False: an array and a dict are among the fields
class LoaderSettings:
    """Every ``Loader`` option, checked, with its aliases resolved and its defaults filled in.

    Made by ``check`` from the Loader's keyword arguments, one field per option in the order of
    the Loader's signature; the options that need the open store (the tile side, the subset's
    range) are settled by ``subset`` and the Loader.
    """

    batch_size: int = option(_at_least("batch_size", 1))
    shuffle: Shuffle = option(_shuffle)
    seed: int = option(_at_least("seed", 0))
    drop_last: bool = option(bool)
    rank: int = option(_given)  # both or neither, with world_size: see _together
    world_size: int = option(_given)
    device: torch.device = option(parse_device)
    train: bool = option(bool)
    size: int | Schedule | None = option(_schedule)  # None: the tile side, known once the store is open
    crop_pct: float = option(_crop_pct)
    dtype: torch.dtype = option(_dtype)
    layout: Layout = option(lambda value: choice(Layout, value, "layout"))
    with_index: bool = option(bool)
    workers: int = option(_workers)  # DALI's CPU threads: DataLoader's num_workers
    prefetch: int = option(_optional("prefetch_factor", 1, default=2))  # DataLoader's prefetch_factor
    pin_memory: bool = option(bool)
    persistent_workers: bool = option(bool)
    indices: np.ndarray | None = option(_indices)  # unsorted, unchecked against the store: see subset()
    ledger: str | Path | None = option(_given)
    scale: tuple[float, float] = option(_scale)
    ratio: tuple[float, float] = option(_ratio)
    mean: tuple[float, float, float] = option(_given)  # 0..255 units, from either unit: see _together
    std: tuple[float, float, float] = option(_given)
    shuffle_window: int = option(_at_least("shuffle_window", 1))
    # credentials: never printed
    storage_options: dict[str, Any] | None = field(repr=False, metadata={"check": _given})
    cache_dir: str | Path | None = option(_given)
    cache_limit: int | None = option(_optional("cache_limit", 1))
    fast_idct: bool = option(bool)
    scaled_decode: bool = option(bool)
    stats: bool = option(bool)
    recipe: Recipe | None = option(_recipe)
    targets: frozenset[Targets] = option(parse_targets)  # what a batch holds besides its images
    targets_layout: TargetsLayout = option(lambda value: choice(TargetsLayout, value, "targets_layout"))
    max_objects: int | None = option(_optional("max_objects", 1))
    text: TextChoice | None = option(parse_text)  # the captions a batch carries (loader.pairs)
    tokenizer: Callable[[list[str]], Any] | None = field(repr=False, metadata={"check": parse_tokenizer})
    fields: tuple[str, ...] = option(parse_fields)  # the metadata fields a batch carries
    labels: bool | None = option(_labels)  # None: class labels where the store has them and no text is asked
    where: Where | None = option(parse_where)  # the samples read, by their fields (mixing.where)
    # rank and world size defaulted to 0 of 1 with no process group yet: checked again as each
    # epoch begins (``check_alone``), since a group (or a launcher's WORLD_SIZE) may say otherwise
    alone: bool = derived()

    @classmethod
    def check(cls, given: dict[str, Any], dataloader_options: dict[str, Any] | None = None) -> LoaderSettings:
        """The Loader's keyword arguments, every option present (its signature holds the
        defaults), checked one after another in the fields' order: the first bad one is the one
        named. ``dataloader_options`` are DataLoader's that mean nothing here (warned about once).
        """
        _dataloader_only(dataloader_options or {})
        given = dict(given)
        for name, dataloader_name in ALIASES.items():
            given[name] = _alias(dataloader_name, given.pop(dataloader_name, None), name, given.get(name))
        values: dict[str, Any] = {}
        for f in table(cls):
            check = f.metadata["check"]
            if check is not None:
                values[f.name] = check(given.pop(f.name))
        if given:
            raise TypeError(f"Loader() got unexpected keyword arguments: {', '.join(sorted(given))}")
        _together(values)
        return cls(**values)

    def subset(self, samples: int) -> np.ndarray | None:
        """``indices`` checked against a store of ``samples`` samples, in store order."""
        return None if self.indices is None else store_subset(self.indices, samples)


class Setting(Generic[T]):
    """A Loader attribute read from its checked settings, the one copy of them; fixed once the
    Loader is made (as DataLoader refuses a new ``batch_size`` after it is made). Made by
    ``read_back``, never written by hand."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, owner_instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, owner_instance: object, owner: type) -> T: ...

    def __get__(self, owner_instance: object | None, owner: type) -> Setting[T] | T:
        if owner_instance is None:
            return self
        value: T = getattr(owner_instance.settings, self.name)  # type: ignore[attr-defined]
        return value

    def __set__(self, owner_instance: object, value: object) -> None:
        raise AttributeError(f"{self.name} is fixed when the Loader is made: make another Loader")


def read_back(cls: C) -> C:
    """``cls``'s annotated attributes read from its ``settings`` (a ``LoaderSettings``): each
    annotation names an option of the table and says its type, for type checkers; the type must
    be the table's, so the two cannot drift apart. The attributes are ``Setting`` descriptors,
    made here from the table."""
    options = {f.name: f for f in table(LoaderSettings)}
    # as written: this module's and the Loader's (``from __future__ import annotations``) are strings
    annotations = inspect.get_annotations(cls)
    if not annotations:
        raise TypeError(f"{cls.__name__} annotates no option to read back")
    for name, annotation in annotations.items():
        if name not in options:
            raise TypeError(f"{cls.__name__}.{name} is annotated, but LoaderSettings has no option {name}")
        if options[name].metadata["check"] is None:
            raise TypeError(f"{cls.__name__}.{name} is annotated, but LoaderSettings settles {name} from the "
                            "options: it is none")
        if annotation != options[name].type:
            raise TypeError(f"{cls.__name__}.{name} is annotated {annotation}, "
                            f"but its option in LoaderSettings is {options[name].type}")
        setattr(cls, name, Setting(name))
    return cls


def _alias(new: str, new_value: Any, old: str, old_value: Any) -> Any:
    if new_value is not None and old_value is not None:
        raise ConfigError(f"give {new} or {old}, not both (they are the same setting)")
    return new_value if new_value is not None else old_value


def _together(values: dict[str, Any]) -> None:
    """The rules between options, once each is checked on its own; settles the fields that
    depend on several (``rank`` and ``world_size``, ``crop_pct``'s default, ``mean`` and ``std``'s
    units, ``alone``)."""
    alone = values["rank"] is None and values["world_size"] is None and not process_group()
    values["rank"], values["world_size"] = _ranks(values["rank"], values["world_size"])
    values["alone"] = alone
    # detection evaluates whole pictures; classification, torchvision's 224 of 256
    if values["crop_pct"] is None:
        values["crop_pct"] = 1.0 if values["targets"] else 0.875
    values["mean"], values["std"] = pixel_units(values["mean"], values["std"])  # kept in 0..255 units
    recipe: Recipe | None = values["recipe"]
    if recipe is not None and recipe.per_batch and values["dtype"] == torch.uint8 and values["train"]:
        raise ConfigError("random erasing and mixup/cutmix act on the normalised batch: give a float "
                          "dtype (float32, float16 or bfloat16), not uint8")  # evaluation: the filter alone
    if values["tokenizer"] is not None and values["text"] is None:
        raise ConfigError("tokenizer needs text=: name the captions it tokenises")
    if values["labels"] is False and values["targets"]:  # targets take the labels' place in a batch
        raise ConfigError("labels=False with targets: the boxes and masks are a batch's labels; "
                          "leave labels out")
    if values["text"] is not None and values["targets"]:
        raise ConfigError("text and targets cannot be asked together: a batch carries captions or boxes "
                          "and masks")
    if values["targets"] and recipe is not None and values["train"]:
        _targets_with(recipe)
