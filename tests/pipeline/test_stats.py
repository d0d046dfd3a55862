"""``Loader.stats()``: the stage that binds is named from its measurements."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tilefeed.pipeline import Loader
from tilefeed.pipeline.loader import assembly
from tilefeed.pipeline.settings import LoaderSettings
from tilefeed.pipeline.stats import STAGES, Figures, name_bottleneck
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import write_folder


@pytest.fixture(scope="module")
def big_jpeg_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 JPEG tiles of 256 px: decoding them is most of a training batch's work (at 16 px out)."""
    root = tmp_path_factory.mktemp("jpeg256")
    src = write_folder(root / "src", classes=4, per_class=24, size=(320, 256))
    out = root / "store"
    preprocess(src, out, TileSettings(tile=256), StoreSettings(codec="jpeg", shard_size=32), workers=2)
    return out


def test_a_decode_bound_loader_names_the_decode_and_asks_for_workers(big_jpeg_store: Path) -> None:
    # one worker, nothing between batches: the consumer waits on the reader thread's decoding
    with Loader(big_jpeg_store, 16, train=True, size=16, num_workers=1) as loader:
        for _ in range(3):
            for _batch in loader:
                pass
        stats = loader.stats()
    assert stats.last.wait > 0.5
    assert stats.bottleneck == "decode", str(stats)
    assert stats.last.busy["decode"] == max(stats.last.busy.values())
    assert "num_workers=" in stats.advice or "a GPU" in stats.advice
    assert stats.last.bytes_read > 0 and stats.epoch.batches == 6 and stats.last.batches == 18


def test_a_step_bound_loop_is_not_input_bound(store: Path) -> None:
    with Loader(store, 10, train=True, size=24, num_workers=2) as loader:
        for _ in range(3):
            for _batch in loader:
                time.sleep(0.15)  # a long step: every batch is ready before it is asked for
        stats = loader.stats(last=10)
    assert stats.bottleneck == "step" and "not input-bound" in stats.advice, str(stats)
    assert stats.last.batches == 10 and "bottleneck: step" in str(stats)


def test_stats_off_keeps_every_clock_out(store: Path) -> None:
    with Loader(store, 10, train=True, size=24, stats=False) as loader:
        batches = list(loader)
        with pytest.raises(ValueError, match="stats=True"):
            loader.stats()
        assert loader._graph is not None and not loader._graph.source.timed
    assert len(batches) == 5


def test_bytes_read_are_the_stored_chunks_on_the_one_pass_path(store: Path) -> None:
    import numpy as np
    import torch

    # stored tiles on the CPU: read, checked and decompressed in one pass per tile
    with Loader(store, 10, dtype=torch.uint8, layout="NHWC", shuffle=False) as loader:
        list(loader)
        stats = loader.stats()
        assert stats.epoch.bytes_read == loader.reader.stored_nbytes(np.arange(50)) > 0


def test_the_bottleneck_is_the_busiest_stage_measured_never_a_fixed_rule() -> None:
    def figures(wait: float, **busy: float) -> Figures:
        shares = {s: busy.get(s, 0.0) for s in STAGES}
        return Figures(batches=10, seconds=1.0, wait=wait, busy=shares, stage_seconds=shares,
                       bytes_read=0, ready_ahead=0)

    for stage in STAGES:
        assert name_bottleneck(figures(0.4, **{stage: 0.9, "resize": 0.5} if stage != "resize"
                                       else {stage: 0.9, "read": 0.5})) == stage
    assert name_bottleneck(figures(0.01, decode=0.99)) == "step"


def test_advice_weighs_the_shuffle_and_the_layout_as_before(store: Path) -> None:
    def figures(stage: str) -> Figures:
        shares = {s: 0.9 if s == stage else 0.0 for s in STAGES}
        return Figures(batches=10, seconds=1.0, wait=0.5, busy=shares, stage_seconds=shares, bytes_read=0,
                       ready_ahead=0)

    def advice(bottleneck: str, **options: object) -> str:
        with Loader(store, 10, device="cpu", num_workers=1, **options) as loader:  # type: ignore[arg-type]
            settings: LoaderSettings = loader.settings
            return assembly.advice(settings, loader.reader)(bottleneck, figures(bottleneck))

    shard = 'shuffle="shard" (whole shards, read in order)'
    assert advice("download", shuffle=True) == advice("download", shuffle="global") == shard
    assert advice("download", shuffle="shard") != shard and advice("download", shuffle=False) != shard
    channels_last = 'layout="channels_last" (no transpose in the graph)'
    assert advice("graph", layout="NCHW") == channels_last
    for layout in ("NHWC", "channels_last"):
        assert advice("graph", layout=layout) != channels_last
