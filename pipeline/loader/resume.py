"""The Loader's resume state: the small JSON-able dict ``state_dict`` writes, and the checks
``load_state_dict`` makes before trusting one (same store, seed, shuffle and subset; any world
size or batch size)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tilefeed.pipeline.mixing.mix import Sources
from tilefeed.pipeline.settings import LoaderSettings, check_int
from tilefeed.pipeline.options import Shuffle
from tilefeed.pipeline.planning.order import Segment
from tilefeed.pipeline.planning.sizes import check_size
from tilefeed.store.errors import ConfigError

# 3: the order became a keyed bijection of positions (pipeline.planning.order), so every seed's batches
# changed and a state saved before cannot say which samples its epoch has left
# 4: the output size may change between epochs: the state carries the size of the epoch in
# progress and any set_size(), without which a resumed epoch could come out at another size
# 5: a Loader may read a mixture of stores: the state names it (sources, sizes, subsets, quotas,
# labels, shard size), its samples count the mixture's positions, and under shuffle="shard" it
# names the shuffle window (the order depends on it)
# 6: a Loader may apply a training recipe: the state names it (each sample's operations are
# drawn from the seed and the sample, mixup/cutmix from the batch's position in the epoch), and
# an epoch resumed under another recipe would not deliver what the interrupted run would have
# 7: a Loader may hand over boxes and masks: the state names which (and how laid out), since a
# batch resumed under others would not be the batch the interrupted run trained on
# 8: a recipe names its fill (the colour past the picture of the crops that pad), so every
# recipe's identity holds it: a version 7 state's recipe would read as another recipe; and the
# auto-augment policies take torchvision's own magnitude tables (torch's linspace, an ulp off
# numpy's at some bins: TrivialAugmentWide's translation at bin 15 moves 15 px, not 16), so a
# version 7 state's epoch would not resume on the pixels it began with
# 9: a recipe may solarize (``pixel_ops``: torchvision's RandomSolarize), which its identity names
# while on: a version 8 Loader given such a state would refuse it as saved under another recipe,
# where the version says what happened (a newer tilefeed saved it) and what to do
# 10: a batch may carry captions picked by weight from (seed, epoch, sample) and metadata
# fields: the state names which, since an epoch resumed under others would carry other texts
STATE_VERSION = 10


@dataclass(frozen=True)
class Loaded:
    """A state read back: the epoch it is in and what of that epoch was handed over."""

    epoch: int
    segments: list[Segment]  # the stretches that handed something over
    size: int | None  # the size the epoch began at; None when nothing of it was handed over
    fixed: int | None  # set_size()'s, for every epoch not yet begun


def identity(settings: LoaderSettings, sources: Sources) -> dict[str, Any]:
    """What a state must agree on to be resumed here: it decides the epoch's order."""
    subset = sources.subset
    digest = None if subset is None else hashlib.sha256(subset.tobytes()).hexdigest()[:16]
    # .value: a plain str, which torch.save and JSON store as they did before Shuffle
    return {"seed": settings.seed, "shuffle": settings.shuffle.value, "samples": sources.positions,
            "subset": digest, "window": settings.shuffle_window if settings.shuffle is Shuffle.SHARD else None,
            "mixture": sources.identity(),
            # the recipe decides each sample's pixels as the seed does its crop: a resume under
            # another would deliver other samples than the run it continues
            "recipe": None if settings.recipe is None else settings.recipe.identity(),
            "targets": sorted(t.value for t in settings.targets) or None,
            "targets_layout": settings.targets_layout.value if settings.targets else None,
            "text": None if settings.text is None else settings.text.identity(),
            "fields": list(settings.fields) or None}


def saved(settings: LoaderSettings, mine: dict[str, Any], epoch: int, segments: list[Segment],
          size: int, fixed: int | None) -> dict[str, Any]:
    """The state of ``epoch`` after ``segments``, at ``size``, for a Loader of ``identity`` ``mine``."""
    return {"version": STATE_VERSION, "epoch": epoch, "segments": [s.to_list() for s in segments],
            "size": size, "set_size": fixed, **mine, "batch": segments[-1].batches if segments else 0,
            "world_size": settings.world_size, "batch_size": settings.batch_size,
            "drop_last": settings.drop_last}


def _segment(value: Any) -> Segment:
    """A saved stretch of an epoch, checked: a ConfigError rather than a division by zero."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ConfigError("state_dict segment must be [world_size, batch_size, drop_last, batches], "
                          f"got {value!r}")
    world, batch, drop_last, batches = value
    return Segment(check_int("state_dict world_size", world, 1),
                   check_int("state_dict batch_size", batch, 1), bool(drop_last),
                   check_int("state_dict batches", batches, 0))


def load(state: dict[str, Any], mine: dict[str, Any]) -> Loaded:
    """``state`` checked against this version and this Loader's ``identity`` ``mine``."""
    version = state.get("version")
    if version != STATE_VERSION:
        # another version orders or augments the epoch otherwise: its count of delivered batches
        # would name other samples here (or the same samples otherwise cut), and exactly-once or
        # the bit-identical resume would silently break
        raise ConfigError(
            f"state_dict is version {version!r}, this Loader reads version {STATE_VERSION} (their "
            "epochs deliver other samples); start the epoch afresh (set_epoch without load_state_dict) or "
            "resume with the tilefeed that saved it")
    for key, value in mine.items():
        if state.get(key) != value:
            raise ConfigError(
                f"state_dict was saved with {key}={state.get(key)!r}, this Loader has {value!r}; "
                "resume with the same store (or mixture), seed, shuffle, indices, recipe and targets "
                "(world size and batch size may differ)")
    segments = [_segment(s) for s in state.get("segments", [])]
    size = check_size(state.get("size"), "state_dict size")
    fixed = state.get("set_size")
    fixed = None if fixed is None else check_size(fixed, "state_dict set_size")
    begun = [s for s in segments if s.batches > 0]
    # an epoch begun goes on at the size it began with, whatever the schedule says now
    return Loaded(check_int("state_dict epoch", state.get("epoch"), 0), begun,
                  size if begun else None, fixed)
