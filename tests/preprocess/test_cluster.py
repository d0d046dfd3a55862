"""Preprocessing on a Dask cluster: the same store as a local run, even when a worker dies."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import dask
import pytest
from distributed import Client, LocalCluster

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store import format as fmt
from tests.helpers import tree_bytes

TILES, STORE = TileSettings(tile=32), StoreSettings(shard_size=50)

pytestmark = pytest.mark.slow


def cluster() -> LocalCluster:
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)


def test_cluster_run_matches_a_local_run(tmp_path: Path, source: tuple[Path, Path]) -> None:
    src, reference = source
    with cluster() as c:
        summary = preprocess(src, tmp_path / "store", TILES, STORE, scheduler=c.scheduler_address)
    assert summary.tiles == 480 and summary.rejected == 1
    assert tree_bytes(tmp_path / "store") == tree_bytes(reference)


# Dask runs a killed worker's tasks again itself, up to its allowed failures (3, its default);
# past them (at once, with none allowed) their futures fail with KilledWorker and the writer
# sends them again.
@pytest.mark.parametrize("allowed_failures", [3, 0])
def test_a_worker_killed_mid_run_is_retried_without_partial_shards(
        tmp_path: Path, source: tuple[Path, Path], allowed_failures: int) -> None:
    src, reference = source
    out = tmp_path / "store"
    errors: list[BaseException] = []

    def run(address: str) -> None:
        try:
            preprocess(src, out, TILES, STORE, scheduler=address)
        except BaseException as e:  # handed to the test thread
            errors.append(e)

    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures}):
        c = cluster()  # the scheduler reads its allowed failures as it starts
    with c, Client(c) as client:
        thread = threading.Thread(target=run, args=(c.scheduler_address,))
        thread.start()
        deadline = time.monotonic() + 60
        while True:  # a part already done, and a worker in the middle of a task
            busy = [w for w, keys in client.processing().items() if keys]
            if busy and list((out / fmt.WORK_DIR).glob("part-*.json")):
                break
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.005)
        victim = busy[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        held = client.processing()[victim]
        os.kill(pid, signal.SIGKILL)  # the nanny starts a new worker; its tasks run again
        assert held, "the killed worker held no task: nothing was tested"
        assert thread.is_alive(), "the run ended before the kill: nothing was tested"
        thread.join(timeout=240)
    assert not errors, errors
    assert tree_bytes(out) == tree_bytes(reference)


def test_a_cluster_run_over_tar_shards_matches_a_local_run(tmp_path: Path) -> None:
    """Image-text shards on Dask: each worker reads its part's members where the scan found them."""
    from tilefeed.preprocess.sources.scanning import PairOptions
    from tests.preprocess.test_faults import write_tar_shards

    shards = write_tar_shards(tmp_path / "shards", shards=3, per_shard=20)
    local = preprocess(shards, tmp_path / "local", TILES, STORE, workers=2, pairs=PairOptions())
    with cluster() as c:
        spread = preprocess(shards, tmp_path / "store", TILES, STORE, scheduler=c.scheduler_address,
                            pairs=PairOptions())
    assert spread.tiles == local.tiles == 60
    assert tree_bytes(tmp_path / "store") == tree_bytes(tmp_path / "local")
