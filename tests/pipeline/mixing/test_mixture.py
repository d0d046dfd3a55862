from __future__ import annotations

import itertools
import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefeed.pipeline.mixing.plan import NEIGHBOURS, REMEMBERED, MixturePlan, VisitStream, largest_remainder
from tilefeed.pipeline.planning.order import epoch_order

SIZES = [(50, 7, 1000), (1, 2, 3), (13, 1, 97), (1000,)]
WEIGHTS: dict[int, list[tuple[float, ...]]] = {
    1: [(1.0,)], 3: [(0.5, 0.3, 0.2), (0.8, 0.2, 0.0), (1.0, 1.0, 1.0), (0.0, 0.0, 2.5)]}
# epoch_samples as a fraction of the sizes' sum: fewer, the default, more
SCALES = [Fraction(1, 10), Fraction(2, 3), None, Fraction(7, 2)]
# (size, places per epoch): coprime, a common factor, more than half a cycle, one short of it
STREAMS = [(7, 2), (7, 3), (10, 4), (12, 8), (13, 12), (50, 29), (97, 40), (100, 1), (31, 17)]


def cases() -> list[tuple[tuple[int, ...], tuple[float, ...], int | None]]:
    out = []
    for sizes in SIZES:
        for weights, scale in itertools.product(WEIGHTS[len(sizes)], SCALES):
            total = None if scale is None else max(1, int(sum(sizes) * scale))
            out.append((sizes, weights, total))
    return out


def whole_epoch(plan: MixturePlan, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    return plan.locate(epoch, np.arange(len(plan)))


def extras(plan: MixturePlan, source: int, epoch: int) -> np.ndarray:
    """Source ``source``'s extras in ``epoch``, as its block lays them out."""
    first = plan.starts[source] + plan.quotas[source] // plan.sizes[source] * plan.sizes[source]
    return plan.locate(epoch, np.arange(first, plan.starts[source] + plan.quotas[source]))[1]


def crossing(n: int, r: int, cycle: int) -> int:
    """How many places at the end of ``cycle`` the epoch holding its last place takes, when that
    epoch runs on into the next cycle (0 otherwise)."""
    end = (cycle + 1) * n
    epoch = (end - 1) // r
    return end - epoch * r if cycle >= 0 and (epoch + 1) * r > end else 0


def reference_cycle(stream: VisitStream, cycle: int) -> np.ndarray:
    """Cycle ``cycle`` of the stream built whole, as the rules say."""
    n, r = stream.size, stream.per_epoch
    fixed = stream.fixed[:]
    before, after = fixed[: crossing(n, r, cycle - 1)], fixed[: crossing(n, r, cycle)]
    permutation = stream.permutation(cycle)[:]
    first = permutation[~np.isin(permutation, np.concatenate([before, after]))]
    return np.concatenate([first, before[~np.isin(before, after)], after])


def reference_stream(stream: VisitStream, cycles: int) -> np.ndarray:
    """The stream's first ``cycles`` cycles, whole cycles at a time."""
    return np.concatenate([reference_cycle(stream, c) for c in range(cycles)])


def reference_epochs(plan: MixturePlan, epochs: int) -> list[np.ndarray]:
    """The samples of the plan's first ``epochs`` epochs, built the plain way: per source its full
    passes, then its epoch's places of the stream built whole, sorted into store order."""
    out: list[list[np.ndarray]] = [[] for _ in range(epochs)]
    for n, q, stream in zip(plan.sizes, plan.quotas, plan.streams, strict=True):
        k, r = divmod(q, n) if n else (0, 0)
        whole = np.zeros(0, dtype=np.int64) if stream is None else reference_stream(stream, epochs * r // n + 1)
        for e in range(epochs):
            out[e] += [np.arange(k * n) % n, np.sort(whole[e * r : (e + 1) * r])]
    return [np.concatenate(parts) for parts in out]


def shard_loads(samples: np.ndarray, shard_size: int, kept: int) -> int:
    """How many shards a reader of ``samples``, in this order, loads with the latest ``kept`` in memory."""
    cache: dict[int, None] = {}
    loads = 0
    for shard in (samples // shard_size).tolist():
        if shard in cache:
            cache.pop(shard)
        else:
            loads += 1
            if len(cache) == kept:
                cache.pop(next(iter(cache)))
        cache[shard] = None
    return loads


# -- quotas -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("weights", "total", "quotas"), [
    ((1, 1, 1), 10, (4, 3, 3)), ((0.5, 0.3, 0.2), 1057, (529, 317, 211)), ((0.8, 0.2, 0), 10, (8, 2, 0)),
    ((1, 1), 3, (2, 1)), ((0, 1), 5, (0, 5)), ((1e-9, 1), 10, (0, 10)), ((0.1, 0.2, 0.7), 10, (1, 2, 7)),
    ((3, 1), 1, (1, 0)), ((1, 3), 1, (0, 1)),
    # exact: 3/10 and 1/10 of 2 are 1.5 and 0.5, a tie; the floats 0.3 and 0.1 are not
    ((Fraction(3, 10), Fraction(1, 10)), 2, (2, 0)), ((0.3, 0.1), 2, (1, 1)),
    ((np.float32(0.3), np.int64(1), Fraction(1, 3), np.float64(0.25)), 1000, (159, 531, 177, 133))])
def test_quotas_by_largest_remainder(weights: tuple[float, ...], total: int, quotas: tuple[int, ...]) -> None:
    assert largest_remainder(weights, total) == quotas
    plan = MixturePlan([100] * len(weights), weights, seed=0, epoch_samples=total)
    assert plan.quotas == quotas
    assert plan.weights == weights and [type(w) for w in plan.weights] == [type(w) for w in weights]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=6).filter(lambda w: any(x > 0 for x in w)),
       st.integers(1, 10**7))
def test_quotas_add_up_and_stay_within_one_of_the_share(weights: list[float], total: int) -> None:
    quotas = largest_remainder(weights, total)
    assert sum(quotas) == total
    whole = sum(Fraction(w) for w in weights)
    shares = [Fraction(w) * total / whole for w in weights]
    assert all(abs(q - s) < 1 for q, s in zip(quotas, shares, strict=True))
    assert all(q == 0 for q, w in zip(quotas, weights, strict=True) if w == 0)
    # rounded up: no rounded-down share had a larger fractional part (ties go to the lower index)
    up = [i for i, (q, s) in enumerate(zip(quotas, shares, strict=True)) if q > s]
    down = [i for i, (q, s) in enumerate(zip(quotas, shares, strict=True)) if q < s]
    assert all((shares[i] % 1, -i) > (shares[j] % 1, -j) for i in up for j in down)


# -- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize(("sizes", "weights", "total", "message"), [
    ((5, 5), (1.0,), None, "sizes and weights must have the same length, got 2 and 1"),
    ((5, -1), (1.0, 0.0), None, r"sizes must be >= 0, got \[5, -1\]"),
    ((5, 5), (1.0, -0.5), None, "weights must be finite and >= 0"),
    ((5, 5), (1.0, float("nan")), None, "weights must be finite and >= 0"),
    ((5, 5), (1.0, float("inf")), None, "weights must be finite and >= 0"),
    ((5, 5), (0.0, 0.0), None, "at least one weight must be > 0"),
    ((), (), None, "at least one weight must be > 0"),
    ((5, 0), (1.0, 0.5), None, "source 1 has no samples but weight 0.5 > 0"),
    ((5, 5), (1.0, 1.0), 0, "epoch_samples must be >= 1, got 0"),
    ((5, 5), (1.0, 1.0), -3, "epoch_samples must be >= 1, got -3"),
    ((5, 5), (True, 1.0), None, r"weights must be real numbers \(int, float, Fraction or a numpy scalar, "
                                r"not bool\), got \[True, 1.0\]"),
    ((5, 5), (np.True_, 1.0), None, "weights must be real numbers"),
    ((5, 5), ("0.5", 1.0), None, "weights must be real numbers"),
    ((5, 5), (1j, 1.0), None, "weights must be real numbers"),
    ((5, 5), (np.float32("nan"), 1.0), None, "weights must be finite and >= 0"),
    ((5, 5), (Fraction(-1, 3), 1.0), None, "weights must be finite and >= 0")])
def test_invalid_plans_are_refused(sizes: tuple[int, ...], weights: tuple[float, ...], total: int | None,
                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MixturePlan(sizes, weights, seed=0, epoch_samples=total)


def test_invalid_positions_and_epochs_are_refused() -> None:
    plan = MixturePlan([5, 0, 3], [1.0, 0.0, 1.0], seed=0)
    assert plan.quotas == (4, 0, 4)  # a store of no samples and weight 0 is allowed
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\), got 0 to 8"):
        plan.locate(0, np.arange(9))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\), got -1 to 2"):
        plan.locate(0, np.array([2, -1]))
    with pytest.raises(ValueError, match="epoch must be >= 0, got -1"):
        plan.locate(-1, np.arange(3))
    with pytest.raises(ValueError, match=r"per_epoch must lie in \[0, size\), got 5 and size 5"):
        VisitStream(5, 5, seed=0)


# -- the rules (a) to (d) ----------------------------------------------------------------------
@pytest.mark.parametrize(("sizes", "weights", "total"), cases())
def test_epochs_follow_the_rules(sizes: tuple[int, ...], weights: tuple[float, ...], total: int | None) -> None:
    plan = MixturePlan(sizes, weights, seed=3, epoch_samples=total)
    assert len(plan) == (sum(sizes) if total is None else total) == sum(plan.quotas)
    visits = [np.zeros(n, dtype=np.int64) for n in sizes]  # each sample's extras so far
    expected = reference_epochs(plan, 60)
    for epoch in range(60):
        source, sample = whole_epoch(plan, epoch)
        assert source.dtype == sample.dtype == np.int64
        # (d) the quotas, in blocks of positions
        np.testing.assert_array_equal(source, np.repeat(np.arange(len(sizes)), plan.quotas))
        for s, (n, q) in enumerate(zip(sizes, plan.quotas, strict=True)):
            if not q:
                continue
            k, r = divmod(q, n)
            counts = np.bincount(sample[source == s], minlength=n)
            assert len(counts) == n and set(np.unique(counts)) <= {k, k + 1}  # (a)
            assert (counts == k + 1).sum() == r
            more = extras(plan, s, epoch)
            assert (np.diff(more) > 0).all()  # the extras in store order
            visits[s] += np.bincount(more, minlength=n)
            # (b): over the epochs so far, every sample visited before any is visited again
            assert visits[s].max() - visits[s].min() <= 1
        np.testing.assert_array_equal(sample, expected[epoch])


@pytest.mark.parametrize(("size", "per_epoch"), STREAMS)
def test_stream_matches_the_rules_built_whole(size: int, per_epoch: int) -> None:
    cycles = 40
    stream = VisitStream(size, per_epoch, seed=11)
    assert [stream.crossing(c) for c in range(-1, cycles)] == [crossing(size, per_epoch, c)
                                                                for c in range(-1, cycles)]
    expected = reference_stream(stream, cycles)
    epochs = cycles * size // per_epoch
    got = np.concatenate([stream.window(e, np.arange(per_epoch)) for e in range(epochs)])
    np.testing.assert_array_equal(got, expected[: len(got)])
    for e in range(epochs):  # (a) within an epoch's places no sample twice, across cycles too
        assert len(np.unique(got[e * per_epoch : (e + 1) * per_epoch])) == per_epoch
    # a stream that starts late (a resume) or goes backwards finds the same samples
    for e in (epochs - 1, epochs // 2, 1, epochs - 2, 0):
        want = expected[e * per_epoch : (e + 1) * per_epoch]
        fresh = VisitStream(size, per_epoch, seed=11)
        np.testing.assert_array_equal(fresh.window(e, np.arange(per_epoch)), want)
        assert fresh.scans <= 1
        np.testing.assert_array_equal(stream.window(e, np.arange(per_epoch)), want)
    assert len(stream._scanned) <= REMEMBERED


def test_sub_sampled_source_visits_every_sample_before_any_again() -> None:
    plan = MixturePlan([1000, 30], [0.2, 0.8], seed=9, epoch_samples=200)  # 40 of 1000 per epoch
    assert plan.quotas == (40, 160)
    seen = np.concatenate([extras(plan, 0, e) for e in range(100)])
    for c in range(4):
        np.testing.assert_array_equal(np.sort(seen[c * 1000 : (c + 1) * 1000]), np.arange(1000))
    assert len(np.unique(seen[:1000])) == 1000  # the first repeat comes after every sample


def test_cycles_end_with_a_prefix_of_the_fixed_order() -> None:
    stream = VisitStream(10, 4, seed=2)  # epoch 2 takes 2 places from the end of cycle 0, 2 of cycle 1
    fixed = stream.fixed[:]
    assert [stream.crossing(c) for c in range(-1, 3)] == [0, 2, 0, 2]  # epoch 5 ends with cycle 1
    zero, one, two = (stream.at(c, np.arange(10)) for c in range(3))
    np.testing.assert_array_equal(stream.window(2, np.arange(2)), fixed[:2])
    assert not np.isin(stream.window(2, np.arange(2, 4)), fixed[:2]).any()
    # cycle 0 ends with B_0, cycle 1 with B_0 though no epoch crosses its end, cycle 2 with B_2
    for cycle, order in enumerate((zero, one, two)):
        np.testing.assert_array_equal(order[-2:], fixed[:2])
        permutation = stream.permutation(cycle)[:]
        np.testing.assert_array_equal(order[:-2], permutation[~np.isin(permutation, fixed[:2])])
    wider = VisitStream(10, 7, seed=2)  # t: 3, 6, 2 - B_(c-1) without B_c comes before B_c
    assert [wider.crossing(c) for c in range(3)] == [3, 6, 2]
    np.testing.assert_array_equal(wider.at(2, np.arange(10))[-6:], wider.fixed[:][[2, 3, 4, 5, 0, 1]])


def test_a_resume_far_on_scans_at_most_one_cycle() -> None:
    n, r = 40009, 20011  # coprime: almost every cycle boundary is crossed by an epoch
    crossed = 0
    for epoch in (1000, 1001, 1002, 1003):
        plan = MixturePlan([n], [1.0], seed=5, epoch_samples=r)  # nothing remembered yet
        stream = plan.streams[0]
        assert isinstance(stream, VisitStream) and plan.quotas == (r,)
        got = whole_epoch(plan, epoch)[1]
        assert stream.scans == 1 and len(stream._scanned) == 1
        cycle, offset = divmod(epoch * r, n)
        crossed += offset + r > n
        built = np.concatenate([reference_cycle(stream, cycle), reference_cycle(stream, cycle + 1)])
        np.testing.assert_array_equal(got, np.sort(built[offset : offset + r]))
        whole_epoch(plan, epoch)  # asked again: remembered
        assert stream.scans == stream.sorts == 1
    assert crossed == 2  # epochs 1001 and 1003 run from one cycle into the next


# -- a function of (seed, epoch) ---------------------------------------------------------------
def test_plans_are_fixed_by_their_arguments() -> None:
    def plan(seed: int) -> MixturePlan:
        return MixturePlan([50, 7, 1000], [0.5, 0.3, 0.2], seed=seed, epoch_samples=1057)

    assert plan(4) == plan(4) and hash(plan(4)) == hash(plan(4))
    for epoch in (0, 3):  # another seed takes other extras, not just a field that differs
        assert set(extras(plan(4), 2, epoch).tolist()) != set(extras(plan(5), 2, epoch).tolist())
    for epoch in (0, 1, 17):
        a, b = whole_epoch(plan(4), epoch), whole_epoch(plan(4), epoch)
        np.testing.assert_array_equal(a[1], b[1])
        other = whole_epoch(plan(5), epoch)
        np.testing.assert_array_equal(a[0], other[0])  # the quotas do not depend on the seed
        assert not np.array_equal(a[1], other[1])
    # epochs differ from one another, and a plan sent to another process answers the same
    assert not np.array_equal(whole_epoch(plan(4), 0)[1], whole_epoch(plan(4), 1)[1])
    copy = pickle.loads(pickle.dumps(plan(4)))
    np.testing.assert_array_equal(whole_epoch(copy, 9)[1], whole_epoch(plan(4), 9)[1])


def test_whole_passes_do_not_depend_on_the_seed() -> None:
    a, b = (MixturePlan([10, 20], [1.0, 3.0], seed=s, epoch_samples=80) for s in (1, 2))
    assert a.quotas == (20, 60) and a.streams == (None, None)
    np.testing.assert_array_equal(whole_epoch(a, 3)[1], whole_epoch(b, 3)[1])


# -- any positions ---------------------------------------------------------------------------
@pytest.mark.parametrize(("sizes", "weights", "total"), cases()[::3])
def test_any_positions_give_the_whole_epochs_answer(sizes: tuple[int, ...], weights: tuple[float, ...],
                                                    total: int | None) -> None:
    rng = np.random.default_rng(0)
    for epoch in (0, 5, 33):
        whole = whole_epoch(MixturePlan(sizes, weights, seed=1, epoch_samples=total), epoch)
        plan = MixturePlan(sizes, weights, seed=1, epoch_samples=total)  # nothing remembered yet
        at = rng.integers(0, len(plan), size=(4, 7))
        source, sample = plan.locate(epoch, at)
        assert source.shape == sample.shape == at.shape
        np.testing.assert_array_equal(source, whole[0][at])
        np.testing.assert_array_equal(sample, whole[1][at])
        empty = plan.locate(epoch, np.zeros(0, dtype=np.int64))
        assert empty[0].shape == empty[1].shape == (0,)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([0.0, 0.1, 0.25, 1.0, 3.0])), min_size=1,
                max_size=4).filter(lambda sw: any(w > 0 for _, w in sw)),
       st.one_of(st.none(), st.integers(1, 300)), st.integers(0, 2**40), st.integers(0, 500))
def test_any_mixture_follows_the_rules(sources: list[tuple[int, float]], total: int | None, seed: int,
                                       epoch: int) -> None:
    sizes, weights = [n for n, _ in sources], [w for _, w in sources]
    plan = MixturePlan(sizes, weights, seed=seed, epoch_samples=total)
    source, sample = whole_epoch(plan, epoch)
    np.testing.assert_array_equal(np.bincount(source, minlength=len(sizes)), plan.quotas)
    for s, (n, q) in enumerate(zip(sizes, plan.quotas, strict=True)):
        counts = np.bincount(sample[source == s], minlength=n)
        assert len(counts) == n and counts.max() - counts.min() <= 1
        assert counts.sum() == q
    at = np.arange(len(plan))[::3]
    fresh = MixturePlan(sizes, weights, seed=seed, epoch_samples=total)
    np.testing.assert_array_equal(fresh.locate(epoch, at)[1], sample[at])


def test_each_epoch_sorts_a_sources_extras_once() -> None:
    plan = MixturePlan([1000, 30], [0.2, 0.8], seed=9, epoch_samples=200)  # 40 extras of source 0
    stream = plan.streams[0]
    assert isinstance(stream, VisitStream)
    first = [plan.locate(e, np.arange(40))[1] for e in range(6)]  # epochs in turn
    assert stream.sorts == 6 and len(stream._sorted) <= 2 * NEIGHBOURS + 1
    assert sorted(stream._sorted) == [4, 5]
    for e in (6, 5, 6, 5):  # the neighbours of the latest one asked are kept
        plan.locate(e, np.arange(40, 0, -1) - 1)
    assert stream.sorts == 7 and sorted(stream._sorted) == [5, 6]
    np.testing.assert_array_equal(plan.locate(4, np.arange(40))[1], first[4])  # 4 was dropped
    assert stream.sorts == 8 and sorted(stream._sorted) == [4, 5]
    np.testing.assert_array_equal(plan.locate(0, np.arange(7, 40, 5))[1], first[0][7::5])
    assert stream.sorts == 9 and sorted(stream._sorted) == [0]


# -- under the epoch order ---------------------------------------------------------------------
def test_epoch_order_interleaves_the_blocks() -> None:
    plan = MixturePlan([50, 7, 1000], [0.5, 0.3, 0.2], seed=0, epoch_samples=1057)
    unshuffled = epoch_order(len(plan), shuffle="none", seed=0, epoch=2, shard_size=8)
    np.testing.assert_array_equal(plan.locate(2, unshuffled[:])[0], np.repeat([0, 1, 2], plan.quotas))
    shuffled = plan.locate(2, epoch_order(len(plan), shuffle="global", seed=0, epoch=2, shard_size=8)[:])[0]
    np.testing.assert_array_equal(np.bincount(shuffled), plan.quotas)
    assert (np.diff(shuffled) != 0).sum() > 100  # the sources are mixed, not in three runs


def read(plan: MixturePlan, epoch: int, shuffle: str, shard_size: int) -> np.ndarray:
    """The samples of ``epoch`` in the order a Loader of that shuffle reads the plan's positions."""
    order = epoch_order(len(plan), shuffle=shuffle, seed=0, epoch=epoch, shard_size=shard_size)
    return plan.locate(epoch, order[:])[1]


def test_a_sub_sampled_source_is_read_a_few_shards_at_a_time() -> None:
    plan = MixturePlan([10000], [1.0], seed=0, epoch_samples=8000)  # 8000 of 100 shards of 100
    for epoch in (0, 1):
        assert shard_loads(read(plan, epoch, "none", 100), 100, kept=1) == 100  # each shard in one run
        # "shard": runs of 100 positions, 4 at a time permuted together; each run is a stretch of
        # the sorted extras, so the runs touch the 100 shards and at most one more at each of
        # their 79 boundaries, and a cache of one group's shards loads none more often than that
        shards = read(plan, epoch, "shard", 100)
        groups = [len(np.unique(shards[i : i + 400] // 100)) for i in range(0, 8000, 400)]
        assert shard_loads(shards, 100, kept=max(groups)) <= sum(groups) <= 100 + 79
