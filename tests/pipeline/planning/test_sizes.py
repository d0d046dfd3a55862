"""Progressive resizing: the output size changes between epochs, one graph serves every size,
low sizes decode JPEG tiles at reduced DCT scale, and a resumed run keeps the sizes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tilefeed.bench.fixtures.generated import make_image_folder
from tilefeed.pipeline import ConfigError, Loader
from tilefeed.pipeline.engine import graph_pool as pool
from tilefeed.pipeline.engine import graph_ops as graph_module
from tilefeed.pipeline.planning.sizes import ramp
from tilefeed.pipeline.engine.batch_source import decode_scale
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import psnr

SIZES = (16, 24, 32, 20)


@pytest.fixture(scope="module")
def big_jpeg_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 q90 JPEG tiles of 128x128 from photo-like pictures (shapes and sensor noise)."""
    root = tmp_path_factory.mktemp("big-jpeg")
    src = make_image_folder(root / "src", classes=2, per_class=16, sizes=((200, 160), (160, 200)))
    preprocess(src, root / "store", TileSettings(tile=128, fit="crop"),
               StoreSettings(codec="jpeg", quality=90, shard_size=16), workers=1)
    return root / "store"


def cycle(epoch: int) -> int:
    return SIZES[epoch % len(SIZES)]


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of DALI pipelines built from now on, with no idle graph left to reuse."""
    pool.clear()
    built = [0]
    real = graph_module.build_pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        built[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(graph_module, "build_pipeline", counted)
    return built


def ring_bytes(loader: Loader) -> int:
    assert loader._graph is not None
    return sum(a.nbytes for a in loader._graph.source._ring)


def batches(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), idx.clone()) for images, _, idx in loader]


@pytest.mark.parametrize("codec,train,dtype", [("lz4", True, torch.float32), ("jpeg", True, torch.uint8),
                                               ("lz4", False, torch.uint8), ("lz4", False, torch.float32),
                                               ("jpeg", False, torch.float32)])
def test_one_graph_serves_fifty_epochs_cycling_four_sizes(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, codec: str, train: bool,
        dtype: torch.dtype) -> None:
    store = request.getfixturevalue("store" if codec == "lz4" else "jpeg_store")
    built = count_builds(monkeypatch)
    with Loader(store, 16, train=train, size=cycle, dtype=dtype, layout="NHWC", with_index=True,
                num_workers=1) as loader:
        for epoch in range(50):
            side = cycle(epoch)
            shapes = {tuple(images.shape[1:]) for images, _, _ in loader}
            assert shapes == {(side, side, 3)}, epoch
            if epoch == len(SIZES) - 1:  # every size seen once: the ring is as large as it gets
                held = ring_bytes(loader)
        assert ring_bytes(loader) == held  # no size change after that allocated anything
    assert built == [1]


def test_each_epoch_comes_at_its_own_size_read_ahead_or_not(store: Path) -> None:
    """The next epoch is read ahead while one drains: at its size, as a cold start gives it."""
    opts: dict[str, Any] = dict(shuffle=True, seed=5, train=True, with_index=True, num_workers=2)
    with Loader(store, 8, size=cycle, **opts) as scheduled:
        generations = set()
        for epoch in range(5):
            got = batches(scheduled)
            assert scheduled._graph is not None
            generations.add(scheduled._graph.feed.generation)  # one stream: nothing read was dropped
            with Loader(store, 8, size=cycle(epoch), **opts) as fresh:
                fresh.set_epoch(epoch)
                want = batches(fresh)
            assert all(images.shape[-1] == cycle(epoch) for images, _ in got)
            assert all(torch.equal(a, b) and torch.equal(i, j)
                       for (a, i), (b, j) in zip(got, want, strict=True)), epoch
        assert len(generations) == 1


def test_set_size_takes_effect_at_the_next_epoch(store: Path) -> None:
    with Loader(store, 8, shuffle=True, train=True, size=16, with_index=True) as loader:
        epoch = iter(loader)
        first = next(epoch)[0]
        loader.set_size(24)  # the epoch in progress keeps its size; the one read ahead is dropped
        assert loader.size == 16 and loader.size_of(1) == 24
        assert {first.shape[-1], *(images.shape[-1] for images, _, _ in epoch)} == {16}
        assert loader.size == 24
        got = batches(loader)
    with Loader(store, 8, shuffle=True, train=True, size=24, with_index=True) as fresh:
        fresh.set_epoch(1)
        want = batches(fresh)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want, strict=True))


def test_stored_tiles_handed_out_move_to_a_graph_when_the_size_changes(store: Path) -> None:
    with Loader(store, 16, dtype=torch.uint8, layout="NHWC") as loader:
        assert loader._graph is not None and loader._graph.pipe is None  # the tiles, no DALI
        assert {images.shape[1] for images, _ in loader} == {32}
        loader.set_size(24)
        assert {images.shape[1] for images, _ in loader} == {24}
        assert loader._graph is not None and loader._graph.pipe is not None


def test_sizes_and_schedules_are_checked(store: Path) -> None:
    with Loader(store, 8, size=lambda e: 16 if e < 2 else 4) as loader:
        with pytest.raises(ConfigError, match=r"size\(2\) must be an int in 8..8192"):
            loader.size_of(2)
        for bad in (4, 9000, 16.0, True):
            with pytest.raises(ConfigError, match="size must be"):
                loader.set_size(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"size\(0\)"):
        Loader(store, 8, size=lambda e: "big")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="min_res must not exceed max_res"):
        ramp(0, 10, 224, 160)


def _ffcv_resolution(epoch: int, min_res: int, max_res: int, end_ramp: int, start_ramp: int) -> int:
    """FFCV's ImageNet example's get_resolution, as written there."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


@pytest.mark.parametrize("start,end,lo,hi", [(11, 13, 160, 192), (2, 30, 128, 256), (0, 88, 160, 192)])
def test_ramp_is_ffcvs_schedule(start: int, end: int, lo: int, hi: int) -> None:
    schedule = ramp(start_ramp=start, end_ramp=end, min_res=lo, max_res=hi)
    assert [schedule(e) for e in range(100)] == [_ffcv_resolution(e, lo, hi, end, start) for e in range(100)]
    assert schedule.largest == hi


@pytest.mark.parametrize("size", [16, 32, 48])
def test_reduced_scale_decode_stays_above_35_db_of_a_full_decode_resized(
        big_jpeg_store: Path, size: int) -> None:
    def first_batch(scaled: bool) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        with Loader(big_jpeg_store, 32, shuffle=False, train=True, size=size, dtype=torch.uint8,
                    layout="NHWC", scaled_decode=scaled, seed=2) as loader:
            return next(iter(loader))[0].numpy(), loader.windows(0, np.arange(32))

    scaled, (start, end, _) = first_batch(True)
    full, _ = first_batch(False)
    spans = (end - start).tolist()
    factors = [decode_scale(h, w, size, 128, 128) for h, w in spans]
    assert max(factors) > 1  # some tiles were decoded at reduced scale
    quality = [psnr(a, b) for a, b in zip(scaled, full, strict=True)]
    assert min(quality) >= 35, sorted(quality)[:3]
    assert min(quality) < float("inf")  # and they did not decode as a full decode would


def _run(store: Path, batch: int, opts: dict[str, Any], epochs: range, *,
         stop: tuple[int, int] | None = None, set_size: tuple[int, int, int] | None = None,
         state: dict[str, Any] | None = None) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]],
                                                       dict[str, Any] | None]:
    """(epoch, images, indices) of every batch, and the state saved at ``stop`` (epoch, batch);
    ``set_size`` (epoch, batch, size): a set_size call after that batch."""
    out: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    saved = None
    with Loader(store, batch, **opts) as loader:
        if state is not None:
            loader.load_state_dict(state)
        for epoch in epochs:
            loader.set_epoch(epoch)
            for n, (images, _, idx) in enumerate(loader):
                out.append((epoch, images.clone(), idx.clone()))
                if set_size is not None and (epoch, n) == set_size[:2]:
                    loader.set_size(set_size[2])
                if stop is not None and (epoch, n) == stop:
                    saved = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint keeps it
                    return out, saved
    return out, saved


@pytest.mark.parametrize("resumed_schedule", [cycle, lambda epoch: 32])
def test_a_resumed_run_gives_the_batches_crops_and_sizes_of_an_uninterrupted_one(
        store: Path, resumed_schedule: Callable[[int], int]) -> None:
    """Stopped mid-epoch after a set_size(): the rest of that epoch at its size, then the epoch
    after it at set_size's, bit for bit; whatever schedule the new Loader was given."""
    opts: dict[str, Any] = dict(shuffle=True, seed=7, train=True, with_index=True, num_workers=2)
    change = (1, 1, 20)  # after batch 1 of epoch 1: epoch 2 at 20 px
    whole, _ = _run(store, 8, dict(opts, size=cycle), range(3), set_size=change)
    head, state = _run(store, 8, dict(opts, size=cycle), range(3), set_size=change, stop=(1, 3))
    assert state is not None and (state["epoch"], state["size"], state["set_size"]) == (1, 24, 20)
    tail, _ = _run(store, 8, dict(opts, size=resumed_schedule), range(1, 3), state=state)
    assert [e for e, _, _ in whole] == [e for e, _, _ in head + tail]
    for (_, a, i), (_, b, j) in zip(whole, head + tail, strict=True):
        assert torch.equal(i, j) and torch.equal(a, b)
    assert [a.shape[-1] for e, a, _ in whole if e == 2] == [20] * 7

    # elastic: another batch size resumes the same samples, each with its crop and size
    elastic, _ = _run(store, 4, dict(opts, size=resumed_schedule), range(1, 2), state=state)
    want = {int(i): image for e, a, idx in whole[len(head):] if e == 1 for i, image in zip(idx, a, strict=True)}
    got = {int(i): image for _, a, idx in elastic for i, image in zip(idx, a, strict=True)}
    assert want.keys() == got.keys() and all(torch.equal(want[i], got[i]) for i in want)


@pytest.mark.parametrize("codec", ["lz4", "jpeg"])
def test_the_graphs_own_resize_takes_the_size_per_sample_as_on_a_gpu(
        request: pytest.FixtureRequest, codec: str) -> None:
    """The GPU's graph (windows and sizes as inputs, DALI cutting and resizing), built on the
    CPU: one graph for the epochs at two sizes, close to the reader threads' own cut and resize."""
    from tilefeed.pipeline.device import device_graph_set

    store = request.getfixturevalue("store" if codec == "lz4" else "jpeg_store")
    got, want = {}, {}
    for on, out in ((True, got), (False, want)):
        with device_graph_set(on), Loader(store, 8, shuffle=False, train=True, dtype=torch.uint8, layout="NHWC",
                                      with_index=True) as loader:
            graph = loader._graph
            for epoch, size in enumerate((16, 24)):
                loader.set_epoch(epoch)
                loader.set_size(size)
                out[size] = next(iter(loader))[0].numpy()  # the same samples and windows
            assert loader._graph is graph  # one graph served both sizes
    for size in (16, 24):
        assert got[size].shape == want[size].shape == (8, size, size, 3)
        assert psnr(got[size], want[size]) > 30
