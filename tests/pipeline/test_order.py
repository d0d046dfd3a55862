from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tilefeed.pipeline.order import SHUFFLES, batches_per_rank, epoch_order, rank_indices


@pytest.mark.parametrize("shuffle", SHUFFLES)
def test_order_is_a_permutation_fixed_by_seed_and_epoch(shuffle: str) -> None:
    a = epoch_order(103, shuffle=shuffle, seed=1, epoch=0, shard_size=10)
    assert sorted(a.tolist()) == list(range(103))
    np.testing.assert_array_equal(a, epoch_order(103, shuffle=shuffle, seed=1, epoch=0, shard_size=10))
    if shuffle != "none":
        assert not np.array_equal(a, epoch_order(103, shuffle=shuffle, seed=1, epoch=1, shard_size=10))
        assert not np.array_equal(a, epoch_order(103, shuffle=shuffle, seed=2, epoch=0, shard_size=10))


def test_shard_shuffle_keeps_reads_within_a_window_of_shards() -> None:
    order = epoch_order(1000, shuffle="shard", seed=3, epoch=0, shard_size=50, window=4)
    for start in range(0, 1000, 200):  # each window covers 4 shards x 50 samples
        assert len({i // 50 for i in order[start : start + 200]}) == 4


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("samples,batch", [(50, 4), (7, 3), (2, 4), (60, 5)])
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
