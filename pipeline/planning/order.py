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

Nothing here holds the whole epoch: an order is a keyed bijection from positions to samples
(``EpochOrder``), evaluated for the positions one rank reads, so a rank's order costs memory in
proportion to its share (a 400 M-sample epoch would be 3.2 GB of int64 per rank otherwise). What
is left of an epoch after a resume is a short list of position intervals (``Remainder``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from tilefeed.pipeline.options import Shuffle
from tilefeed.store.choices import choice
from tilefeed.store.format import ceil_div



# Rounds of add, multiply, xorshift: six bring even a ten-sample epoch close to uniform over keys
# (where a sample lands, across seeds), where four left a measurable bias
# (tests/pipeline/planning/test_order.py).
ROUNDS: Final = 6
CHUNK: Final = 1 << 18  # positions evaluated at a time: temporaries of 2 MiB each, whatever the share
_U64 = np.uint64


# -- a keyed bijection of [0, n) ------------------------------------------------------------------
@dataclass(frozen=True)
class _Key:
    adds: tuple[np.uint64, ...]
    muls: tuple[np.uint64, ...]  # odd: multiplying by them is invertible modulo any power of two
    tweak: np.uint64  # mixed with a group number so every shard group gets a permutation of its own


def _key(seed: int, epoch: int, purpose: str) -> _Key:
    """Round constants from (purpose, seed, epoch) by SHAKE-256: the same on every machine and
    numpy version (numpy's generators promise their bit streams, not every method's use of them)."""
    digest = hashlib.shake_256(f"tilefeed.order/{purpose}/{seed}/{epoch}".encode()).digest(8 * (2 * ROUNDS + 1))
    words = np.frombuffer(digest, dtype="<u8").astype(_U64)
    return _Key(adds=tuple(words[:ROUNDS]), muls=tuple(words[ROUNDS : 2 * ROUNDS] | _U64(1)),
                tweak=words[2 * ROUNDS])


def _mix(values: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``values + key``: unrelated 64-bit words for neighbouring numbers."""
    z = values.astype(_U64) * _U64(0x9E3779B97F4A7C15) + key
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


@dataclass(frozen=True)
class _Domains:
    """Per element (or one for all): the size ``n`` of the range it is permuted within, the
    enclosing power of two as a mask, the xorshift distance and the key tweak."""

    n: np.ndarray | np.uint64
    mask: np.ndarray | np.uint64
    shift: np.ndarray | np.uint64
    tweak: np.ndarray | np.uint64

    @classmethod
    def of(cls, sizes: np.ndarray, tweaks: np.ndarray) -> _Domains:
        """Domains for each of ``sizes`` (>= 1): bit lengths taken exactly, per distinct size."""
        distinct = sorted_distinct(sizes)
        which = np.searchsorted(distinct, sizes)
        bits = np.array([int(s - 1).bit_length() for s in distinct.tolist()], dtype=_U64)[which]
        return cls(n=sizes.astype(_U64), mask=(_U64(1) << bits) - _U64(1), shift=(bits + _U64(1)) >> _U64(1),
                   tweak=tweaks.astype(_U64))

    @classmethod
    def single(cls, size: int) -> _Domains:
        bits = max(size - 1, 0).bit_length()
        return cls(n=_U64(size), mask=_U64((1 << bits) - 1), shift=_U64((bits + 1) // 2), tweak=_U64(0))

    def take(self, at: np.ndarray) -> _Domains:
        """The domains of the elements ``at`` (a shared domain stays shared)."""
        def pick(v: np.ndarray | np.uint64) -> np.ndarray | np.uint64:
            return v[at] if isinstance(v, np.ndarray) else v
        return _Domains(pick(self.n), pick(self.mask), pick(self.shift), pick(self.tweak))


def _scramble(x: np.ndarray, domains: _Domains, key: _Key) -> None:
    """In place, a bijection of [0, mask]: adding a constant, multiplying by an odd one and
    ``x ^= x >> shift`` are each invertible modulo 2**bits, and uint64 arithmetic wraps modulo
    2**64, a multiple of 2**bits, so masking after each step keeps them exact."""
    for add, mul in zip(key.adds, key.muls, strict=True):
        x += add ^ domains.tweak
        x &= domains.mask
        x *= mul
        x &= domains.mask
        x ^= x >> domains.shift


def _permute(x: np.ndarray, domains: _Domains, key: _Key) -> np.ndarray:
    """The images of ``x`` (uint64, each below its ``n``) under a keyed bijection of [0, n).

    The power-of-two bijection is applied again to values that land at or past ``n`` (cycle
    walking): the cycle through x comes back below n, so the walk ends, and two values that
    start apart stay apart. The enclosing power of two is under 2n, so a walk takes under two
    steps on average."""
    y = x.astype(_U64, copy=True)
    _scramble(y, domains, key)
    out = np.flatnonzero(y >= domains.n)
    while out.size:
        walking = domains.take(out)
        z = y[out]
        _scramble(z, walking, key)
        y[out] = z
        out = out[z >= walking.n]
    return y


# -- the epoch's order ------------------------------------------------------------------------
class EpochOrder:
    """The epoch's sample order as a function of position, identical on every run and machine.

    ``global``: a keyed permutation of all positions. ``shard``: shards in a random order, then
    ``window`` consecutive shards at a time merged and permuted together, so reads stay within
    a few shards while batches still mix classes. ``none``: store order.
    ``subset``: the sorted sample ids an epoch covers (a Loader's ``indices``); the order
    permutes them instead, ``shard`` taking runs of ``shard_size`` consecutive members as shards
    so reads keep their locality in the store.

    Only the shard order (one entry per shard) is held; ``at`` computes any positions' samples.
    """

    def __init__(self, samples: int, *, shuffle: Shuffle | str, seed: int, epoch: int, shard_size: int,
                 window: int = 4, subset: np.ndarray | None = None) -> None:
        if shard_size < 1 or window < 1:
            raise ValueError(f"shard_size and window must be >= 1, got {shard_size} and {window}")
        self.shuffle, self.seed, self.epoch = choice(Shuffle, shuffle, "shuffle"), seed, epoch
        self.shard_size, self.window = shard_size, window
        self.subset = None if subset is None else np.asarray(subset, dtype=np.int64)
        self.length = samples if self.subset is None else len(self.subset)
        self._key = _key(seed, epoch, self.shuffle.value)  # the plain string: the key is hashed from text
        if self.shuffle is Shuffle.GLOBAL:
            self._whole = _Domains.single(self.length)
        elif self.shuffle is Shuffle.SHARD:
            self._plan_shards()

    def _plan_shards(self) -> None:
        n, size = self.length, self.shard_size
        shards = ceil_div(n, size)
        order = _permute(np.arange(shards, dtype=_U64), _Domains.single(shards),
                         _key(self.seed, self.epoch, "shards"))
        self._shards = order.astype(np.int64)  # the shard at each place of the shard order
        sizes = np.full(shards, size, dtype=np.int64)
        if shards:
            sizes[self._shards == shards - 1] = n - (shards - 1) * size  # the last shard may be partial
        # where each shard, then each group of ``window`` shards, begins in the epoch order
        self._shard_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._group_start = np.append(self._shard_start[:-1][:: self.window], n).astype(np.int64)
        groups = len(self._group_start) - 1
        tweaks = _mix(np.arange(groups, dtype=_U64), self._key.tweak)
        self._groups = _Domains.of(np.diff(self._group_start), tweaks)

    def __len__(self) -> int:
        return self.length

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The samples (int64) at ``positions`` (each in [0, len)) of the epoch order."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty(len(positions), dtype=np.int64)
        for start in range(0, len(positions), CHUNK):
            out[start : start + CHUNK] = self._at(positions[start : start + CHUNK])
        return out

    def __getitem__(self, key: slice) -> np.ndarray:
        """A stretch of the order, as numpy slices it (``order[:k]`` of a shorter order is all of it)."""
        return self.at(np.arange(*key.indices(self.length), dtype=np.int64))

    def _at(self, positions: np.ndarray) -> np.ndarray:
        if self.shuffle is Shuffle.GLOBAL:
            members = _permute(positions, self._whole, self._key).astype(np.int64)
        elif self.shuffle is Shuffle.SHARD:
            members = self._in_shards(positions)
        else:
            members = positions
        return members if self.subset is None else self.subset[members]

    def _in_shards(self, positions: np.ndarray) -> np.ndarray:
        group = np.searchsorted(self._group_start, positions, side="right") - 1
        base = self._group_start[group]
        # permuted within the group: a place among the group's shards, laid end to end
        place = base + _permute(positions - base, self._groups.take(group), self._key).astype(np.int64)
        shard = np.searchsorted(self._shard_start, place, side="right") - 1
        return self._shards[shard] * self.shard_size + (place - self._shard_start[shard])


def epoch_order(samples: int, *, shuffle: Shuffle | str, seed: int, epoch: int, shard_size: int,
                window: int = 4, subset: np.ndarray | None = None) -> EpochOrder:
    """The epoch's order (see ``EpochOrder``); ``subset`` holds the sorted sample ids it covers."""
    return EpochOrder(samples, shuffle=shuffle, seed=seed, epoch=epoch, shard_size=shard_size,
                      window=window, subset=subset)


def samples_per_rank(samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    if drop_last:
        return samples // (world_size * batch_size) * batch_size
    return ceil_div(samples, world_size)


def batches_per_rank(samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    return ceil_div(samples_per_rank(samples, world_size, batch_size, drop_last), batch_size)


# -- what is left of an epoch -------------------------------------------------------------------
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


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals [start, end) merged into sorted, disjoint ones."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate([[True], starts[1:] > reach[:-1]]))
    return starts[first], np.maximum.reduceat(ends, first)


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """The distinct ``values``, ascending.

    np.unique and np.union1d hash large integers, several times slower than sorting; a stable
    sort also merges the sorted runs of concatenated sorted arrays in one pass each (the
    ledger's tallies, ``Remainder``'s cuts).

    Parameters
    ----------
    values : numpy.ndarray
        A 1-D array, in any order, repeats allowed; it is not changed.

    Returns
    -------
    numpy.ndarray
        A new array of the same dtype holding each value once, in ascending order.
    """
    values = np.sort(values, kind="stable")
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if values.size else values


def _complement(starts: np.ndarray, ends: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The gaps in [0, size) between sorted, disjoint intervals."""
    lo, hi = np.concatenate([[0], ends]), np.concatenate([starts, [size]])
    keep = hi > lo
    return lo[keep], hi[keep]


@dataclass(frozen=True)
class Remainder:
    """What is left of an epoch order, in epoch order: the positions in sorted, disjoint
    intervals [starts[i], ends[i]). Its items are those positions numbered from 0."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def whole(cls, length: int) -> Remainder:
        bounds = np.array([[0, length]] if length else np.zeros((0, 2)), dtype=np.int64)
        return cls(bounds[:, 0], bounds[:, 1])

    def __len__(self) -> int:
        return int((self.ends - self.starts).sum())

    def _offsets(self) -> np.ndarray:
        """The item each interval begins at, and the item count last."""
        return np.concatenate([[0], np.cumsum(self.ends - self.starts)]).astype(np.int64)

    def positions(self, start: int, stop: int) -> np.ndarray:
        """The epoch positions of items ``start`` to ``stop - 1``, wrapping past the last item
        onto the first ones (how a padded share repeats the order's first samples)."""
        items = np.arange(start, stop, dtype=np.int64)
        if not items.size:
            return items
        items %= len(self)
        offsets = self._offsets()
        piece = np.searchsorted(offsets, items, side="right") - 1
        return self.starts[piece] + (items - offsets[piece])

    def without(self, segment: Segment) -> Remainder:
        """What is left once ``segment`` split this remainder over its ranks (as a fresh epoch
        is split) and every rank delivered ``segment.batches`` batches of its share."""
        size = len(self)
        share = samples_per_rank(size, segment.world_size, segment.batch_size, segment.drop_last)
        taken = min(segment.batches * segment.batch_size, share)
        if size == 0 or taken <= 0:
            return self
        # rank r delivered items [r * share, r * share + taken) of the remainder padded by
        # repeating it. A run that wraps past the end goes on with the first items, which rank 0
        # delivered itself (no run is longer than rank 0's [0, taken)), so runs are cut there.
        first = np.arange(segment.world_size, dtype=np.int64) * share % size
        return self._items(*_complement(*_union(first, np.minimum(first + taken, size)), size))

    def _items(self, starts: np.ndarray, ends: np.ndarray) -> Remainder:
        """The remainder made of items in sorted, disjoint intervals [starts[i], ends[i])."""
        if not len(starts):
            return Remainder.whole(0)
        offsets = self._offsets()
        cuts = sorted_distinct(np.concatenate([offsets, starts, ends]))
        lo, hi = cuts[:-1], cuts[1:]  # item runs that lie in one interval of each list
        inside = np.searchsorted(starts, lo, side="right") - 1
        keep = (inside >= 0) & (lo < ends[np.maximum(inside, 0)])
        lo, hi = lo[keep], hi[keep]
        piece = np.searchsorted(offsets, lo, side="right") - 1
        begin = self.starts[piece] + (lo - offsets[piece])
        end = begin + (hi - lo)
        # runs that continue one another in the epoch order become one interval again
        first = np.flatnonzero(np.concatenate([[True], begin[1:] != end[:-1]]))
        last = np.append(first[1:], len(begin)) - 1
        return Remainder(begin[first], end[last])


def remaining(samples: int, segments: Sequence[Segment]) -> Remainder:
    """What is left of an epoch of ``samples`` positions after ``segments``, in epoch order,
    each sample once.

    Elastic resume: a new world size or batch size splits this remainder over its ranks by the
    same rules as a fresh epoch, so over the whole epoch every sample is still delivered once
    (up to the drop_last and padding rules of the stretch that finishes the epoch).
    """
    left = Remainder.whole(samples)
    for segment in segments:
        left = left.without(segment)
    return left


def rank_indices(order: EpochOrder, *, rank: int, world_size: int, batch_size: int, drop_last: bool,
                 after: Sequence[Segment] = ()) -> np.ndarray:
    """This rank's samples of what is left of the epoch after ``after`` (all of it by default),
    in order (see the module docstring for the rules): memory in proportion to the share."""
    left = remaining(len(order), after)
    share = samples_per_rank(len(left), world_size, batch_size, drop_last)
    first = rank * share
    out = np.empty(share, dtype=np.int64)
    for start in range(0, share, CHUNK):
        stop = min(start + CHUNK, share)
        out[start:stop] = order.at(left.positions(first + start, first + stop))
    return out
