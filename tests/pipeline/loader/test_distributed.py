"""Two real ranks under torch.distributed (gloo on the CPU), each with its own Loader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import free_port, join_gloo


def _rank_main(rank: int, world: int, port: int, store: str, drop_last: bool, out: str) -> None:
    join_gloo(rank, world, port)
    from tilefeed.pipeline import Loader

    with Loader(store, 4, drop_last=drop_last, with_index=True, train=False,
                dtype=torch.uint8, workers=1) as loader:
        assert (loader.rank, loader.world_size) == (rank, world)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            epochs.append([idx.tolist() for _, _, idx in loader])
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, epochs)
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_split_every_epoch_exactly_once(store: Path, tmp_path: Path) -> None:
    for drop_last in (False, True):
        out = tmp_path / f"gathered-{drop_last}.pt"
        mp.start_processes(_rank_main, args=(2, free_port(), str(store), drop_last, str(out)),
                           nprocs=2, join=True, start_method="spawn")
        per_rank = torch.load(out)  # [rank][epoch][batch] -> indices
        orders = []
        for epoch in range(2):
            batches = [per_rank[r][epoch] for r in range(2)]
            assert len(batches[0]) == len(batches[1]), "same number of batches on every rank"
            seen = Counter(i for rank_batches in batches for b in rank_batches for i in b)
            if drop_last:
                assert max(seen.values()) == 1 and 50 - len(seen) < 2 * 4
            else:
                assert len(seen) == 50 and sum(seen.values()) - 50 < 2
            orders.append([i for b in batches[0] for i in b])
        assert orders[0] != orders[1], "a different order every epoch"


def _early_main(rank: int, world: int, port: int, store: str, out: str) -> None:
    """A Loader built before the process group (rank 0 of 1 by default), then one with its
    rank and world size given: the first refuses once the group exists, the second runs."""
    from tilefeed.pipeline import Loader
    from tilefeed.store.errors import ConfigError

    early = Loader(store, 4, with_index=True, train=False, dtype=torch.uint8, workers=1)
    given = Loader(store, 4, with_index=True, train=False, dtype=torch.uint8, workers=1, rank=0, world_size=1)
    join_gloo(rank, world, port)
    try:
        next(iter(early))
        said = "ran"
    except ConfigError as e:
        said = str(e)
    ran = sum(len(idx) for _, _, idx in given)
    early.close()
    given.close()
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, (said, ran))
    if rank == 0:
        torch.save(gathered, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_loader_built_before_the_process_group_refuses_to_read_everything(store: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "early.pt"
    mp.start_processes(_early_main, args=(2, free_port(), str(store), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    for said, ran in torch.load(out):
        assert "took rank 0 of 1" in said and "the job runs 2 processes" in said and "\n" not in said, said
        assert "init_process_group()" in said and "rank= and world_size=" in said
        assert ran == 50  # explicit values are never second-guessed


def test_a_launchers_world_size_is_enough_to_refuse(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun and accelerate set WORLD_SIZE before any group exists: a defaulted Loader built
    then, or before, refuses as it is iterated; under WORLD_SIZE=1 it runs."""
    from tilefeed.pipeline import Loader
    from tilefeed.store.errors import ConfigError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with Loader(store, 4, train=False, dtype=torch.uint8, workers=1) as loader:
        monkeypatch.setenv("WORLD_SIZE", "1")
        assert len(list(loader)) == 13
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ConfigError, match="the job runs 2 processes"):
            next(iter(loader))
