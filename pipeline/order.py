"""Which samples each rank reads, in which order: a function of (seed, epoch) alone.

Per epoch, over all ranks, every sample is yielded exactly once, except that every rank gets
the same number of batches (as with torch's DistributedSampler):

* ``drop_last=True``: each rank gets ``N // (world_size * batch_size)`` full batches; fewer than
  ``world_size * batch_size`` samples are left out of the epoch, and none repeat.
* ``drop_last=False``: the order is padded with its own first samples to a multiple of
  ``world_size``; fewer than ``world_size`` samples repeat, none are left out, and every rank's
  last batch has the same, possibly partial, size.

Ranks take contiguous blocks of the epoch order, so with ``shuffle="shard"`` each rank still
reads whole runs of few shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from tilefeed.preprocess.format import ceil_div

SHUFFLES: Final = ("global", "shard", "none")


def epoch_order(samples: int, *, shuffle: str, seed: int, epoch: int, shard_size: int,
                window: int = 4, subset: np.ndarray | None = None) -> np.ndarray:
    """The epoch's sample order (int64), identical on every run and machine.

    ``shard``: shards in a random order, then ``window`` consecutive shards at a time merged and
    shuffled together, so reads stay within a few shards while batches still mix classes.
    ``subset``: a boolean mask over the store; the order is the full order filtered to it, so a
    subset keeps the locality of ``shard`` and a uniformly random order under ``global``.
    """
    order = _full_order(samples, shuffle=shuffle, seed=seed, epoch=epoch, shard_size=shard_size,
                        window=window)
    return order if subset is None else order[subset[order]]


def _full_order(samples: int, *, shuffle: str, seed: int, epoch: int, shard_size: int,
                window: int) -> np.ndarray:
    if shuffle == "none":
        return np.arange(samples, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    if shuffle == "global":
        return rng.permutation(samples).astype(np.int64)
    if shuffle != "shard":
        raise ValueError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
    shards = rng.permutation(ceil_div(samples, shard_size))
    parts = []
    for start in range(0, len(shards), window):
        group = np.concatenate([
            np.arange(s * shard_size, min(samples, (s + 1) * shard_size), dtype=np.int64)
            for s in shards[start : start + window]
        ])
        parts.append(rng.permutation(group))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def samples_per_rank(samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    if drop_last:
        return samples // (world_size * batch_size) * batch_size
    return ceil_div(samples, world_size)


def batches_per_rank(samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    return ceil_div(samples_per_rank(samples, world_size, batch_size, drop_last), batch_size)


def rank_indices(order: np.ndarray, *, rank: int, world_size: int, batch_size: int,
                 drop_last: bool) -> np.ndarray:
    """This rank's samples for the epoch, in order (see the module docstring for the rules)."""
    per_rank = samples_per_rank(len(order), world_size, batch_size, drop_last)
    total = per_rank * world_size
    if total > len(order):
        order = np.resize(order, total)  # pads cyclically with the order's first samples
    return order[rank * per_rank : (rank + 1) * per_rank]


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch run with one set of settings: every rank delivered ``batches``
    batches of its share of what was left of the epoch when the stretch began."""

    world_size: int
    batch_size: int
    drop_last: bool
    batches: int

    def to_list(self) -> list[int | bool]:
        return [self.world_size, self.batch_size, self.drop_last, self.batches]

    @classmethod
    def from_list(cls, value: list[int | bool]) -> Segment:
        world_size, batch_size, drop_last, batches = value
        return cls(int(world_size), int(batch_size), bool(drop_last), int(batches))


def delivered(order: np.ndarray, segment: Segment) -> np.ndarray:
    """The samples every rank handed over in ``segment``, which split ``order`` by the usual rules."""
    per_rank = [
        rank_indices(order, rank=r, world_size=segment.world_size, batch_size=segment.batch_size,
                     drop_last=segment.drop_last)[: segment.batches * segment.batch_size]
        for r in range(segment.world_size)
    ]
    return np.concatenate(per_rank) if per_rank else np.zeros(0, dtype=np.int64)


def remaining(order: np.ndarray, segments: list[Segment]) -> np.ndarray:
    """What is left of the epoch ``order`` after ``segments``, in epoch order, each sample once.

    Elastic resume: a new world size or batch size splits this remainder over its ranks by the
    same rules as a fresh epoch, so over the whole epoch every sample is still delivered once
    (up to the drop_last and padding rules of the stretch that finishes the epoch).
    """
    for segment in segments:
        order = order[~np.isin(order, delivered(order, segment))]
    return order
