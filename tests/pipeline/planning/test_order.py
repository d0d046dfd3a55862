from __future__ import annotations

import itertools
import time
from collections import Counter

import numpy as np
import pytest

from tilefeed.pipeline.options import Shuffle
from tilefeed.pipeline.planning.order import (
    EpochOrder,
    Remainder,
    Segment,
    batches_per_rank,
    epoch_order,
    rank_indices,
    remaining,
    samples_per_rank,
    sorted_distinct,
)

SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 97, 101, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025,
         65535, 65536, 65537, 100_000]

SHUFFLES = ("global", "shard", "none")  # the options as a caller writes them

# -- the reference: the order materialised, as tilefeed did it before ------------------------------
def reference_rank(order: np.ndarray, rank: int, world_size: int, batch_size: int,
                   drop_last: bool) -> np.ndarray:
    per_rank = samples_per_rank(len(order), world_size, batch_size, drop_last)
    total = per_rank * world_size
    if total > len(order):
        order = np.resize(order, total)  # pads cyclically with the order's first samples
    return order[rank * per_rank : (rank + 1) * per_rank]


def reference_remaining(order: np.ndarray, segments: list[Segment]) -> np.ndarray:
    for s in segments:
        handed = [reference_rank(order, r, s.world_size, s.batch_size, s.drop_last)[: s.batches * s.batch_size]
                  for r in range(s.world_size)]
        order = order[~np.isin(order, np.concatenate(handed))]
    return order


# -- a bijection of the epoch, fixed by (seed, epoch) -----------------------------------------------
@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_every_sample_once_for_many_sizes(shuffle: str) -> None:
    for n, shard_size in itertools.product(SIZES, (1, 7, 64)):
        if shuffle != "shard" and shard_size != 7:
            continue  # only the shard order depends on the shard size
        order = epoch_order(n, shuffle=shuffle, seed=5, epoch=2, shard_size=shard_size, window=3)
        whole = order[:]
        assert len(order) == n and whole.dtype == np.int64
        np.testing.assert_array_equal(np.sort(whole), np.arange(n), err_msg=f"{n}, {shard_size}")
        if n:  # any positions, in any order, give the samples at those places
            at = np.random.default_rng(n).integers(0, n, size=min(n, 1000))
            np.testing.assert_array_equal(order.at(at), whole[at])


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_order_is_fixed_by_seed_and_epoch(shuffle: str) -> None:
    def order(seed: int, epoch: int, n: int = 103) -> np.ndarray:
        return epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch, shard_size=10)[:]

    np.testing.assert_array_equal(order(1, 0), order(1, 0))
    np.testing.assert_array_equal(order(1, 0, 100_003), order(1, 0, 100_003))
    if shuffle == "none":
        np.testing.assert_array_equal(order(1, 0), np.arange(103))
        return
    orders = {tuple(order(seed, epoch)) for seed in range(4) for epoch in range(4)}
    assert len(orders) == 16  # every (seed, epoch) its own order
    assert not np.array_equal(order(1, 0), np.arange(103))


def test_the_order_is_the_same_on_every_machine() -> None:
    # pinned: the keys come from SHAKE-256, the arithmetic is uint64, so this never changes
    # without a new STATE_VERSION (a saved state's batches would name other samples)
    assert epoch_order(12, shuffle="global", seed=0, epoch=0, shard_size=4)[:].tolist() == \
        PINNED_GLOBAL
    assert epoch_order(12, shuffle="shard", seed=0, epoch=0, shard_size=4, window=2)[:].tolist() == \
        PINNED_SHARD


PINNED_GLOBAL = [10, 3, 5, 9, 4, 2, 8, 6, 1, 7, 11, 0]
PINNED_SHARD = [1, 3, 11, 10, 8, 0, 9, 2, 5, 4, 6, 7]


def test_a_global_order_looks_random() -> None:
    n = 100_000
    for seed in range(3):
        order = epoch_order(n, shuffle="global", seed=seed, epoch=0, shard_size=10)[:]
        assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.02  # position says nothing of sample
        assert abs(np.corrcoef(order[:-1], order[1:])[0, 1]) < 0.02  # nor of the next sample
        first = np.histogram(order[: n // 100], bins=10, range=(0, n))[0]
        assert first.min() > 60 and first.max() < 140, first  # the first 1% spread over the store
        assert 0.48 < np.mean((order & 1) == (np.arange(n) & 1)) < 0.52  # low bits mixed too


def test_over_seeds_each_sample_is_equally_likely_at_each_place() -> None:
    n, seeds = 10, 4000
    counts = np.zeros((n, n), dtype=np.int64)
    for seed in range(seeds):
        counts[np.arange(n), epoch_order(n, shuffle="global", seed=seed, epoch=0, shard_size=4)[:]] += 1
    expected = seeds / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < (n - 1) ** 2 + 4 * np.sqrt(2 * (n - 1) ** 2), chi2  # 81 degrees of freedom


def whole_shard_groups(order: np.ndarray, size: int, window: int) -> int:
    """How many pieces ``order`` (a permutation of 0..n-1) cuts into where the shards begun so
    far are complete; fails unless each piece is a permutation of at most ``window`` whole shards."""
    n = len(order)
    need = {s: min(size, n - s * size) for s in range(-(-n // size))}
    pieces, left, shards = 0, 0, set()
    for sample in order.tolist():
        shard = sample // size
        if shard not in shards:
            shards.add(shard)
            left += need[shard]
        left -= 1
        if left == 0:
            assert len(shards) <= window, (n, size, window, shards)
            pieces, shards = pieces + 1, set()
    assert left == 0
    return pieces


def test_shard_order_is_whole_groups_of_window_shards() -> None:
    for n, size, window in ((1000, 50, 4), (1030, 50, 4), (1030, 50, 3), (7, 3, 2), (50, 8, 4)):
        order = epoch_order(n, shuffle="shard", seed=3, epoch=1, shard_size=size, window=window)[:]
        shards = -(-n // size)
        assert whole_shard_groups(order, size, window) == -(-shards // window)
        batches = [order[i : i + size] for i in range(0, n, size)]
        assert max(len({s // size for s in b.tolist()}) for b in batches) <= 2 * window
        if n == 1000:  # aligned groups: each 200 samples cover exactly 4 shards
            assert all(len({i // 50 for i in order[s : s + 200].tolist()}) == 4 for s in range(0, 1000, 200))
    visits = [epoch_order(1000, shuffle="shard", seed=s, epoch=0, shard_size=50)[::50] // 50 for s in range(3)]
    assert len({tuple(v) for v in visits}) == 3  # the shards come in another order per seed


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_a_subset_is_permuted_among_itself(shuffle: str) -> None:
    subset = np.sort(np.random.default_rng(1).choice(10_000, size=997, replace=False))
    order = epoch_order(10_000, shuffle=shuffle, seed=2, epoch=0, shard_size=32, subset=subset)[:]
    np.testing.assert_array_equal(np.sort(order), subset)
    if shuffle == "none":
        np.testing.assert_array_equal(order, subset)
    if shuffle == "shard":  # runs of 32 members of the subset stay together, 4 runs at a time
        assert whole_shard_groups(np.searchsorted(subset, order), 32, 4) == 8


# -- ranks and padding ------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("samples,batch", [(50, 4), (7, 3), (2, 4), (60, 5), (1, 2), (0, 3)])
def test_ranks_see_every_sample_once_with_equal_batches(world: int, drop_last: bool, samples: int,
                                                        batch: int) -> None:
    order = epoch_order(samples, shuffle="global", seed=0, epoch=0, shard_size=8)
    parts = [rank_indices(order, rank=r, world_size=world, batch_size=batch, drop_last=drop_last)
             for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    assert -(-len(parts[0]) // batch) == batches_per_rank(samples, world, batch, drop_last)
    seen = Counter(int(i) for p in parts for i in p)
    if drop_last:
        assert max(seen.values(), default=1) == 1
        assert samples - len(seen) < world * batch
        assert all(len(p) % batch == 0 for p in parts)
    else:
        assert len(seen) == samples
        assert sum(seen.values()) - samples < world
        padded = np.concatenate(parts)[samples:]  # the padding: the order's own first samples
        np.testing.assert_array_equal(padded, np.resize(order[:], len(padded)) if samples else padded)


def _random_segments(rng: np.random.Generator, n: int) -> list[Segment]:
    segments = []
    left = n
    for _ in range(int(rng.integers(0, 4))):
        world, batch, drop_last = int(rng.integers(1, 10)), int(rng.integers(1, 17)), bool(rng.integers(2))
        batches = int(rng.integers(0, batches_per_rank(left, world, batch, drop_last) + 2))
        segments.append(Segment(world, batch, drop_last, batches))
        left = len(reference_remaining(np.arange(left), segments[-1:]))
    return segments


def test_elastic_shares_equal_the_materialised_reference() -> None:
    rng = np.random.default_rng(0)
    cases = 0
    for _ in range(600):
        n = int(rng.choice([0, 1, 2, 3, 5, 8, 17, 50, 97, 200, 513]))
        shuffle = str(rng.choice(SHUFFLES))
        subset = None
        if n and rng.integers(3) == 0:
            subset = np.sort(rng.choice(3 * n, size=n, replace=False))
        order = epoch_order(3 * n if subset is not None else n, shuffle=shuffle, seed=int(rng.integers(9)),
                            epoch=int(rng.integers(3)), shard_size=int(rng.integers(1, 9)),
                            window=int(rng.integers(1, 4)), subset=subset)
        segments = _random_segments(rng, n)
        whole = order[:]
        left = reference_remaining(whole, segments)
        got = remaining(len(order), segments)
        np.testing.assert_array_equal(order.at(got.positions(0, len(got))), left)
        world, batch, drop_last = int(rng.integers(1, 10)), int(rng.integers(1, 17)), bool(rng.integers(2))
        for rank in range(world):
            expected = reference_rank(left, rank, world, batch, drop_last)
            mine = rank_indices(order, rank=rank, world_size=world, batch_size=batch, drop_last=drop_last,
                                after=segments)
            np.testing.assert_array_equal(mine, expected, err_msg=f"{n} {shuffle} {segments} {world} {batch}")
        cases += 1
    assert cases == 600


def test_the_remainder_stays_a_few_intervals() -> None:
    segments = [Segment(64, 256, False, 1000), Segment(32, 128, True, 500), Segment(8, 512, False, 7)]
    left = remaining(400_000_000, segments)
    assert len(left.starts) <= 1 + sum(s.world_size for s in segments)
    assert (left.starts < left.ends).all() and (left.ends[:-1] < left.starts[1:]).all()
    # every rank's share is longer than what it delivered, so no padding wrapped
    assert len(left) == 400_000_000 - 64 * 256 * 1000 - 32 * 128 * 500 - 8 * 512 * 7
    assert len(Remainder.whole(0)) == 0 and len(remaining(0, segments)) == 0


def test_a_rank_share_of_a_huge_epoch_costs_only_the_share() -> None:
    # a trillion samples: the whole order would be 8 TB, a rank's share is 2**20 samples
    n, world = 10**12, 10**12 // 2**20
    for shuffle in SHUFFLES:
        order = epoch_order(n, shuffle=shuffle, seed=1, epoch=0, shard_size=10**6)
        mine = rank_indices(order, rank=world - 1, world_size=world, batch_size=256, drop_last=True)
        assert len(mine) == 2**20 - 2**20 % 256
        assert (np.diff(np.sort(mine)) > 0).all() and mine.min() >= 0 and mine.max() < n
    # resumed on half the ranks after each delivered 300 batches: the share of the remainder
    order = epoch_order(n, shuffle="global", seed=1, epoch=0, shard_size=10**6)
    after = [Segment(world, 256, False, 300)]
    mine = rank_indices(order, rank=3, world_size=world // 2, batch_size=256, drop_last=False, after=after)
    assert len(mine) == -(-(n - world * 256 * 300) // (world // 2))


@pytest.mark.parametrize("shuffle", ["global", "shard"])
def test_an_imagenet_share_takes_well_under_a_second(shuffle: str) -> None:
    order = epoch_order(1_281_167, shuffle=shuffle, seed=0, epoch=0, shard_size=1024)
    best = float("inf")
    for _ in range(3):  # the best of three: the machine may be busy with other tests
        began = time.perf_counter()
        mine = rank_indices(order, rank=0, world_size=1, batch_size=256, drop_last=False)
        best = min(best, time.perf_counter() - began)
    np.testing.assert_array_equal(np.sort(mine), np.arange(1_281_167))
    assert best < 1.0, best


def test_order_cost_measures_each_stage_in_a_fresh_process() -> None:
    from tilefeed.bench.suites.order_cost import STAGES, order_cost

    result = order_cost(100_000, 4, shuffle="shard", rank=3, batch_size=64)
    assert set(result.stages) == set(STAGES)
    assert result.stages["order"]["items"] == 25_000
    # saved at 4 ranks after 195 of 391 batches, resumed on 2: the rest split in two
    assert result.stages["resume"]["items"] == (100_000 - 4 * 195 * 64) // 2
    assert all(s["seconds"] > 0 and s["peak_mib"] >= 0 for s in result.stages.values())
    table = result.table()
    assert "100,000 samples, world size 4" in table and all(title in table for title in STAGES.values())


# -- the typed option and the shared helper ---------------------------------------------------------
def test_shuffle_members_are_their_strings_and_give_the_same_orders() -> None:
    assert [m.value for m in Shuffle] == list(SHUFFLES) and Shuffle.SHARD == "shard"
    for name in SHUFFLES:
        by_name = epoch_order(1000, shuffle=name, seed=3, epoch=2, shard_size=16)
        by_member = epoch_order(1000, shuffle=Shuffle(name), seed=3, epoch=2, shard_size=16)
        assert by_name.shuffle is Shuffle(name)  # a string becomes the member
        np.testing.assert_array_equal(by_name[:], by_member[:])
    with pytest.raises(ValueError, match=r"^shuffle must be one of global, shard, none, got 'random'$"):
        EpochOrder(10, shuffle="random", seed=0, epoch=0, shard_size=4)


@pytest.mark.parametrize("values", [[], [5], [3, 3, 3], [9, 1, 5, 1, 9, 2**62, 0], list(range(50, 0, -1)) * 2])
def test_sorted_distinct_is_np_unique_and_leaves_its_input(values: list[int]) -> None:
    given = np.array(values, dtype=np.int64)
    kept = given.copy()
    out = sorted_distinct(given)
    np.testing.assert_array_equal(out, np.unique(given))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(given, kept)
    # sorted runs laid end to end, as the ledger's tallies merge them
    runs = np.concatenate([np.unique(given), np.unique(given[::2]), np.arange(3, dtype=np.int64)])
    np.testing.assert_array_equal(sorted_distinct(runs), np.unique(runs))
