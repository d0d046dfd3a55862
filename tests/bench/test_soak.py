"""Memory stays flat over hundreds of loaders, and the soak command says so."""

from __future__ import annotations

import gc
from pathlib import Path

import psutil
import pytest

from bench.soak import soak
from pipeline import Loader
from preprocess import StoreSettings, TileSettings, preprocess
from tests.conftest import write_folder

# Measured here: a new Loader per epoch grew RSS by 30-70 KB per Loader while every DALI
# pipeline was built and dropped; with graphs reused, -2 to +3 KB over 1,000. The bound leaves
# room for allocator noise over a few hundred loaders and still catches the old growth.
BOUND_KB_PER_LOADER = 20.0


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("soak")
    src = write_folder(root / "src", classes=4, per_class=12, size=(80, 64))
    preprocess(src, root / "store", TileSettings(size=48), StoreSettings(shard_size=16), workers=1)
    return root / "store"


def test_creating_and_closing_hundreds_of_loaders_keeps_rss_flat(small_store: Path) -> None:
    me = psutil.Process()

    def epoch_with_a_new_loader(n: int) -> None:
        for _ in range(n):
            with Loader(small_store, 16, train=True, num_workers=2) as loader:
                for _batch in loader:
                    pass

    epoch_with_a_new_loader(100)  # warm-up: allocator arenas, DALI's first graphs
    gc.collect()
    before = me.memory_info().rss
    epoch_with_a_new_loader(400)
    gc.collect()
    per_loader_kb = (me.memory_info().rss - before) / 1024 / 400
    assert per_loader_kb < BOUND_KB_PER_LOADER, f"{per_loader_kb:.1f} KB per Loader"


def test_soak_reports_every_pattern(small_store: Path) -> None:
    results = soak(small_store, seconds=5, batch_size=16, workers=1)
    assert [r.pattern for r in results] == ["one loader, many epochs", "new loader per epoch",
                                             "break out early", "exception in the loop",
                                             "train + val alive at once"]
    for r in results:
        assert r.units >= 20 and r.threads[0] > 0 and r.ok, r
