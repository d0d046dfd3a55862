"""Several stores mixed by weight, each epoch laid out as one "virtual store" of positions.

A ``MixturePlan`` epoch has ``E = epoch_samples`` positions (the sum of the sizes unless set).
``plan.locate(epoch, positions)`` says which source and which of its samples each position is;
an ``EpochOrder`` of ``len(plan)`` positions (pipeline/planning/order.py) decides in which order the
positions are read and how they are split over ranks, exactly as it does for one store.

The rules, all functions of (sizes, weights, seed, epoch_samples) and the epoch alone:

* Quotas. Source ``s`` gets ``q_s`` positions: its weight's share of ``E`` rounded by largest
  remainder (every share's floor, then one more for the shares with the largest fractional parts,
  ties to the lower source id; exact rational arithmetic on the weights as given: ints, floats,
  Fractions and numpy scalars, each taken as the fraction it is). The quotas add
  up to ``E``, each is within one of its share, and a weight of 0 gets none. A weight above 0 may
  get none too, when its share is below one.
* Blocks. Positions ``[Q_s, Q_s + q_s)``, ``Q_s = q_0 + ... + q_(s-1)``, are source s's list for
  the epoch. A shuffled order of the positions interleaves the sources uniformly at random; an
  unshuffled one reads them block after block.
* A source's list. With ``N`` samples and ``q = k*N + r`` (``0 <= r < N``), item ``j < k*N`` is
  sample ``j % N``: ``k`` full passes in store order (the positions are permuted afterwards, and
  store order keeps ``shuffle="shard"`` and ``"none"`` reading few shards at a time). Epoch ``e``
  takes the places ``[e*r, (e+1)*r)`` of the source's visit stream, ``r`` distinct samples (see
  below), and item ``k*N + i`` (``i < r``) is the ``i``-th smallest of them: the extras in store
  order too, so a sub-sampled source (all extras) reads few shards at a time as well.
* The visit stream. Cycle after cycle of ``N`` places, cycle ``c`` taking places
  ``[c*N, (c+1)*N)``. Two keyed bijections of order.py order it, both keyed on (seed, source):
  ``P_c = VisitStream.permutation(c)``, one per cycle, and ``F = VisitStream.fixed``, the same
  for every cycle (keyed apart from every ``P_c``). ``t_c = (c+1)*N % r`` is how many places of
  cycle ``c`` the epoch crossing its end takes (0 when an epoch ends there), and
  ``B_c = F[:t_c]`` the samples that end cycle ``c`` (``B_(-1)`` is empty). Cycle ``c`` is: the
  samples of ``P_c`` in neither ``B_(c-1)`` nor ``B_c``, in ``P_c``'s order; then ``B_(c-1)``
  without ``B_c``, then ``B_c``, both in ``F``'s order. The ``B`` are prefixes of ``F``, so
  ``B_(c-1)`` and ``B_c`` take ``max(t_(c-1), t_c)`` samples together.

Why it holds. The epoch crossing from cycle ``c-1`` into ``c`` takes ``B_(c-1)`` at the end of
``c-1`` and ``h = r - t_(c-1)`` places at the start of ``c``. These lie in ``c``'s first part,
of ``N - max(t_(c-1), t_c)`` places: ``h < N - t_(c-1)`` as ``r < N``, and ``h <= N - t_c`` as
the epochs crossing into and out of ``c`` are two (each is ``r < N`` places long) and take
disjoint places of it. The first part holds no sample of ``B_(c-1)``, so no epoch takes a sample
twice from the stream. Every cycle is an order of all ``N`` samples, and which one depends on
(seed, source, ``c``) and arithmetic only, never on another cycle.

What follows:

(a) In an epoch every sample of a source appears ``k`` or ``k+1`` times (``r`` of them ``k+1``).
(b) Each cycle visits every sample once and the epochs take the stream's places in turn, so over
    consecutive epochs a sub-sampled source (``q < N``) has all its samples visited before any is
    visited again (over epochs 0 to ``e``, any two samples' visits differ by at most one; which
    comes first within an epoch is the epoch order's to say); so do the extras of any.
(c) Equal arguments give equal plans and answers; another seed keys other permutations, so
    other extras (the full passes and the quotas do not depend on the seed).
(d) Counting the sources of all of an epoch's positions gives the quotas.

The price: the samples that end a cycle are always among the same fewer than ``r``, the first
ones of ``F``, so those few samples come late in every cycle, where a fresh draw per cycle would
move other ones to the end each time.

Cost. ``locate`` holds memory in proportion to the positions asked for, but for one thing: to
put an epoch's extras of a source in store order it holds all ``r`` of them, sorted (``r`` 4-byte
entries below 2**32 samples; ``r < N`` and within the source's quota). That is the one place where
memory grows with a source's extras rather than with the positions asked for. They are worked out
the first time any extra of the epoch is asked for, ``CHUNK`` places of the stream at a time and
one sort, and kept for the epochs within ``NEIGHBOURS`` of the latest one asked (a Loader
locates the next epoch while it reads one), so at most ``2*NEIGHBOURS + 1`` epochs' worth are held
and epochs asked in turn sort a source's extras once each. Every rank sorts all ``r``, not just
its share's.

The stream's places. Those of ``B_c`` and of ``B_(c-1)`` without it are places in ``F``; the
first part needs the places in ``P_c`` of the fewer than ``r`` samples of ``B_(c-1)`` and ``B_c``,
and order.py gives the sample at a place, not the place of a sample, so they come from one scan of
``P_c``, ``CHUNK`` places at a time against a set of ``N`` bits (none when ``t_(c-1) = t_c = 0``).
An epoch's places run into at most two cycles, and then all it takes of the first is ``B_c``, so
any epoch, the first of a resume too, costs its own places plus at most one scan. Each source
remembers the scans of its latest ``REMEMBERED`` cycles (arrays of fewer than ``r`` places), so
consecutive epochs scan each cycle once.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, TypeAlias

import numpy as np

from tilefeed.pipeline.planning.counters import uniforms

from tilefeed.pipeline.planning.order import CHUNK, EpochOrder, Shuffle

# cycles whose scans a stream keeps: the epochs in flight at once lie in a few neighbouring cycles
REMEMBERED: Final = 4
# epochs either side of the latest one asked whose sorted extras a stream keeps
NEIGHBOURS: Final = 1
# the epoch number that keys a stream's fixed order F; cycles key theirs with numbers >= 0
FIXED_ORDER: Final = -1
_NONE: Final = np.zeros(0, dtype=np.int64)
_NONE.flags.writeable = False


# the weights taken, each exactly: a float is the binary fraction it holds
Weight: TypeAlias = float | Fraction | np.integer[Any] | np.floating[Any]
_WEIGHT_TYPES: Final = (int, float, Fraction, np.integer, np.floating)


def is_weight(weight: object) -> bool:
    """A real number of a type ``_exact`` takes as it is (a bool is a flag, not a weight)."""
    return isinstance(weight, _WEIGHT_TYPES) and not isinstance(weight, bool)


def finite_weight(weight: Weight) -> bool:
    return isinstance(weight, (int, Fraction, np.integer)) or bool(np.isfinite(weight))


def _exact(weight: Weight) -> Fraction:
    """``weight`` (finite) as the fraction it is, with no rounding on the way."""
    if isinstance(weight, (int, np.integer)):
        return Fraction(int(weight))
    if isinstance(weight, Fraction):
        return weight
    return Fraction(*weight.as_integer_ratio())


def largest_remainder(weights: Sequence[Weight], total: int) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights`` (finite, >= 0, one > 0) by largest remainder,
    ties to the lower index: integers adding up to ``total``, each within one of its share."""
    exact_weights = [_exact(w) for w in weights]
    whole = sum(exact_weights, Fraction(0))
    shares = [w * total / whole for w in exact_weights]
    quotas = [math.floor(share) for share in shares]
    short = total - sum(quotas)  # the fractional parts add up to it, so as many are above 0
    by_remainder = sorted(range(len(shares)), key=lambda i: (quotas[i] - shares[i], i))
    for i in by_remainder[:short]:
        quotas[i] += 1
    return tuple(quotas)


def _places_of(permutation: EpochOrder, samples: np.ndarray) -> np.ndarray:
    """The places (sorted) where the distinct ``samples`` lie in ``permutation``: a scan of it,
    ``CHUNK`` places at a time, that stops once all are found. Membership is looked up in a set of
    one bit per sample (``len / 8`` bytes), far cheaper than a search among the samples."""
    members = np.zeros(-(-len(permutation) // 8), dtype=np.uint8)
    np.bitwise_or.at(members, samples >> 3, np.left_shift(1, samples & 7).astype(np.uint8))
    found: list[np.ndarray] = []
    left = len(samples)
    for start in range(0, len(permutation), CHUNK):
        if not left:
            break
        places = np.arange(start, min(start + CHUNK, len(permutation)), dtype=np.int64)
        there = permutation.at(places)
        hit = (members[there >> 3] >> (there & 7).astype(np.uint8) & 1).astype(bool)
        found.append(places[hit])
        left -= int(hit.sum())
    return np.concatenate(found) if found else _NONE


class VisitStream:
    """The visit stream of a source of ``size`` samples whose epochs take ``per_epoch`` places each
    (the rules are in the module docstring); ``seed`` keys its orders."""

    def __init__(self, size: int, per_epoch: int, seed: int) -> None:
        if not 0 <= per_epoch < size:
            raise ValueError(f"per_epoch must lie in [0, size), got {per_epoch} and size {size}")
        self.size, self.per_epoch, self.seed = size, per_epoch, seed
        self.fixed = EpochOrder(size, shuffle=Shuffle.GLOBAL, seed=seed, epoch=FIXED_ORDER, shard_size=1)
        self.scans = 0  # how many cycles' permutations were scanned, for tests of the cost
        self.sorts = 0  # how many epochs' samples were sorted, for the same
        self._scanned: dict[int, np.ndarray] = {}  # cycle: sorted places of B_(c-1) and B_c in P_c
        self._sorted: dict[int, np.ndarray] = {}  # epoch: its samples, ascending

    def permutation(self, cycle: int) -> EpochOrder:
        """Cycle ``cycle``'s keyed permutation ``P_c``."""
        return EpochOrder(self.size, shuffle=Shuffle.GLOBAL, seed=self.seed, epoch=cycle, shard_size=1)

    def crossing(self, cycle: int) -> int:
        """``t_c``: how many places at the end of ``cycle`` the epoch running on into the next
        cycle takes (0 when no epoch does, and before cycle 0)."""
        return (cycle + 1) * self.size % self.per_epoch if self.per_epoch else 0

    def window(self, epoch: int, items: np.ndarray) -> np.ndarray:
        """The samples at ``items`` (each in [0, per_epoch)) of ``epoch``'s places in the stream."""
        cycle, offset = divmod(operator.index(epoch) * self.per_epoch, self.size)
        places = offset + np.asarray(items, dtype=np.int64)
        later = places >= self.size  # the epoch's places run into the next cycle
        out = np.empty(len(places), dtype=np.int64)
        out[~later] = self.at(cycle, places[~later])
        if later.any():
            out[later] = self.at(cycle + 1, places[later] - self.size)
        return out

    def sorted_window(self, epoch: int) -> np.ndarray:
        """The ``per_epoch`` samples of ``epoch``'s places in the stream, ascending (read-only;
        uint32 below 2**32 samples), kept for the epochs within ``NEIGHBOURS`` of it."""
        epoch = operator.index(epoch)
        known = self._sorted.get(epoch)
        if known is None:
            self.sorts += 1
            known = np.empty(self.per_epoch, dtype=np.uint32 if self.size <= 1 << 32 else np.int64)
            for start in range(0, self.per_epoch, CHUNK):  # the window's temporaries stay CHUNK long
                items = np.arange(start, min(start + CHUNK, self.per_epoch), dtype=np.int64)
                known[start : start + len(items)] = self.window(epoch, items)
            known.sort()
            known.flags.writeable = False
            self._sorted[epoch] = known
        for old in [e for e in self._sorted if abs(e - epoch) > NEIGHBOURS]:
            del self._sorted[old]
        return known

    def at(self, cycle: int, places: np.ndarray) -> np.ndarray:
        """The samples at ``places`` (each in [0, size)) of ``cycle``'s order."""
        places = np.asarray(places, dtype=np.int64)
        before, after = self.crossing(cycle - 1), self.crossing(cycle)
        first = self.size - max(before, after)  # the first part's length
        out = np.empty(len(places), dtype=np.int64)
        tail = places >= first
        # past the first part: F[after:before] (empty unless before > after), then F[:after]
        past = places[tail] - first
        middle = max(before - after, 0)
        out[tail] = self.fixed.at(np.where(past < middle, past + after, past - middle))
        if not tail.all():
            out[~tail] = self._first_part(cycle, max(before, after), places[~tail])
        return out

    def _first_part(self, cycle: int, bounds: int, places: np.ndarray) -> np.ndarray:
        """The samples at ``places`` of ``P_c`` with the ``bounds`` samples ``F[:bounds]`` taken out."""
        permutation = self.permutation(cycle)
        if not bounds:
            return permutation.at(places)
        taken = self._scan(cycle, bounds)
        # the i-th place not taken is i plus the number of taken places up to it
        ahead = taken - np.arange(len(taken), dtype=np.int64)
        return permutation.at(places + np.searchsorted(ahead, places, side="right"))

    def _scan(self, cycle: int, bounds: int) -> np.ndarray:
        """The sorted places of ``F[:bounds]`` in ``P_c``, remembered for the latest cycles used."""
        known = self._scanned.pop(cycle, None)
        if known is None:
            self.scans += 1
            known = _places_of(self.permutation(cycle), self.fixed.at(np.arange(bounds, dtype=np.int64)))
            known.flags.writeable = False
        self._scanned[cycle] = known  # last in the dict: the most recently used
        for old in list(self._scanned)[:-REMEMBERED]:
            self._scanned.pop(old, None)
        return known


def _stream_seed(seed: int, source: int) -> int:
    """The key of source ``source``'s cycles, unrelated to the keys of a single store's epochs."""
    digest = hashlib.shake_256(f"tilefeed.mixture/{seed}/{source}".encode()).digest(8)
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class MixturePlan:
    """The epochs of a mixture of stores of ``sizes`` samples drawn by ``weights`` (see the module
    docstring for the rules). ``len(plan)`` is the number of positions per epoch."""

    sizes: Sequence[int]
    weights: Sequence[Weight]
    seed: int
    epoch_samples: int | None = None
    # each position's sample drawn with replacement from its source (open_clip's
    # --dataset-resampled): a function of (seed, source, epoch, item), no visit streams
    replacement: bool = False
    quotas: tuple[int, ...] = field(init=False)
    # each source's visit stream, None where its quota is a whole number of passes
    streams: tuple[VisitStream | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = tuple(operator.index(size) for size in self.sizes)
        weights = tuple(self.weights)  # as given: the quotas take them exactly
        if len(sizes) != len(weights):
            raise ValueError(f"sizes and weights must have the same length, got {len(sizes)} and "
                             f"{len(weights)}")
        if any(size < 0 for size in sizes):
            raise ValueError(f"sizes must be >= 0, got {list(sizes)}")
        if not all(is_weight(w) for w in weights):
            raise ValueError(f"weights must be real numbers (int, float, Fraction or a numpy scalar, not "
                             f"bool), got {list(weights)}")
        if not all(finite_weight(w) and w >= 0 for w in weights):
            raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
        if not any(w > 0 for w in weights):
            raise ValueError(f"at least one weight must be > 0, got {list(weights)}")
        empty = [s for s, (size, w) in enumerate(zip(sizes, weights, strict=True)) if size == 0 and w > 0]
        if empty:
            raise ValueError(f"source {empty[0]} has no samples but weight {weights[empty[0]]} > 0")
        total = sum(sizes) if self.epoch_samples is None else operator.index(self.epoch_samples)
        if total < 1:
            raise ValueError(f"epoch_samples must be >= 1, got {total}")
        quotas = largest_remainder(weights, total)
        streams = tuple(VisitStream(size, quota % size, _stream_seed(self.seed, s))
                        if size and quota % size and not self.replacement
                        else None for s, (size, quota) in enumerate(zip(sizes, quotas, strict=True)))
        for name, value in (("sizes", sizes), ("weights", weights), ("epoch_samples", total),
                            ("quotas", quotas), ("streams", streams)):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return sum(self.quotas)

    @property
    def starts(self) -> tuple[int, ...]:
        """The first position of each source's block."""
        return tuple(itertools.accumulate(self.quotas[:-1], initial=0))

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source id, sample within that source), int64 and shaped as ``positions`` (each in
        [0, len(plan))), for those positions of ``epoch``."""
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        positions = np.asarray(positions, dtype=np.int64)
        flat = positions.ravel()
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise ValueError(f"positions must lie in [0, {len(self)}), got {flat.min()} to {flat.max()}")
        starts = np.asarray(self.starts, dtype=np.int64)
        source = np.searchsorted(starts, flat, side="right") - 1  # a block of 0 positions is skipped
        item = flat - starts[source]
        sample = np.empty_like(flat)
        for s, (size, quota, stream) in enumerate(zip(self.sizes, self.quotas, self.streams, strict=True)):
            picked = np.flatnonzero(source == s)
            if not picked.size:
                continue
            items = item[picked]
            if self.replacement:  # uniform over the source's samples, drawn for this epoch and item
                draws = uniforms(_stream_seed(self.seed, s), epoch, items, 1)[:, 0]
                sample[picked] = np.minimum((draws * size).astype(np.int64), size - 1)
                continue
            passes = quota // size * size
            extra = items >= passes
            sample[picked[~extra]] = items[~extra] % size
            if stream is not None and extra.any():
                sample[picked[extra]] = stream.sorted_window(epoch)[items[extra] - passes]
        return source.reshape(positions.shape), sample.reshape(positions.shape)
