"""Epochs as one stream, and batches handed over ready and never written again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tilefeed.pipeline import Loader
from tilefeed.pipeline.engine.feed import SupersededError

# train float32 through DALI (NCHW and channels_last), eval uint8 through DALI (pad-fit tiles
# are framed by windows), and the stored tiles with no DALI graph at all
SETTINGS = [
    dict(train=True, size=24),
    dict(train=True, size=24, layout="channels_last", dtype=torch.bfloat16),
    dict(train=False, dtype=torch.uint8, layout="NHWC", size=24),
    dict(train=False, dtype=torch.uint8, layout="NHWC"),
]


def _generation(loader: Loader) -> int:
    assert loader._graph is not None
    return loader._graph.feed.generation


def _epochs(loader: Loader, count: int) -> list[list[tuple[torch.Tensor, ...]]]:
    return [list(loader) for _ in range(count)]


@pytest.mark.parametrize("opts", SETTINGS, ids=["train", "train-cl-bf16", "eval-u8", "stored"])
def test_the_next_epoch_continues_the_stream_and_kept_batches_stay_intact(store: Path,
                                                                          opts: dict[str, Any]) -> None:
    with Loader(store, 8, seed=4, with_index=True, **opts) as loader:
        epochs = []
        generations = set()
        for _ in range(3):
            epochs.append(list(loader))
            generations.add(_generation(loader))
        assert len(generations) == 1, "epoch 1 and 2 came from the stream epoch 0 began"
    # every batch kept above, compared with a fresh Loader's: nothing was written again while
    # it was held (DALI's buffers and the reader's arrays are reused only once dropped)
    with Loader(store, 8, seed=4, with_index=True, **opts) as fresh:
        for kept in epochs:
            for (images, labels, idx), (again, labels2, idx2) in zip(kept, list(fresh), strict=True):
                assert torch.equal(idx, idx2) and torch.equal(labels, labels2)
                assert torch.equal(images, again)


@pytest.mark.parametrize("consumer_ms", [0, 30])
def test_a_long_epoch_asks_for_the_next_on_the_feeding_thread_and_keeps_the_stream(
        store: Path, consumer_ms: int) -> None:
    """Batches of 2: an epoch longer than the graph holds ahead, whose following epochs are
    worked out by the feeding thread after the first hand-over; a fast consumer and a slow one
    both stay in the one stream, with the very batches of a fresh Loader."""
    import time

    with Loader(store, 2, train=True, size=24, seed=6, with_index=True) as loader:
        generations, seen = set(), []
        for _ in range(3):
            for *_, idx in loader:
                seen.append(idx.tolist())
                time.sleep(consumer_ms / 1000)
            generations.add(_generation(loader))
        assert loader._graph is not None and loader._graph.feed._later is None
        assert len(generations) == 1
        expected = [loader.epoch_indices(e).tolist() for e in range(3)]
    assert [i for b in seen for i in b] == [i for e in expected for i in e]


def test_set_epoch_and_a_loaded_state_drop_what_was_prepared(store: Path) -> None:
    opts: dict[str, Any] = dict(train=True, size=24, seed=5, with_index=True)
    with Loader(store, 8, **opts) as loader:
        list(loader)  # epoch 0: epoch 1 is prepared behind it
        first = _generation(loader)
        loader.set_epoch(3)
        got = [idx.tolist() for *_, idx in loader]
        assert _generation(loader) != first
        assert [i for b in got for i in b] == loader.epoch_indices(3).tolist()
        state = loader.state_dict()  # epoch 4, nothing handed over yet
        it = iter(loader)
        next(it)
        loader.load_state_dict(state)
        again = [idx.tolist() for *_, idx in loader]
        assert [i for b in again for i in b] == loader.epoch_indices(4).tolist()


def test_a_small_evaluation_set_loops_without_restarting(store: Path) -> None:
    # 50 samples in batches of 32: two batches an epoch, fewer than the graph holds ahead
    with Loader(store, 32, shuffle=False, size=24, with_index=True) as val:
        runs = [[idx.tolist() for *_, idx in val] for _ in range(6)]
        assert _generation(val) == 1
    assert all(r == runs[0] for r in runs) and sorted(i for b in runs[0] for i in b) == list(range(50))


def test_an_iterator_left_for_a_new_epoch_says_so(store: Path) -> None:
    with Loader(store, 8, train=True, size=24) as loader:
        old = iter(loader)
        next(old)
        assert len(list(loader)) == len(loader)  # a new epoch, started while old was mid-way
        with pytest.raises(SupersededError, match="one iterator at a time"):
            next(old)


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [1, 2, 4])
@pytest.mark.parametrize("codec_store", ["store", "jpeg_store"])
def test_device_batches_kept_over_epochs_stay_intact_at_every_prefetch_depth(
        request: pytest.FixtureRequest, codec_store: str, prefetch: int) -> None:
    """The side-stream copies out of DALI, and the ring slots DALI reads in place, at several
    queue depths: batches held across three epochs equal a fresh Loader's, one at a time."""
    store: Path = request.getfixturevalue(codec_store)
    opts: dict[str, Any] = dict(train=True, size=24, seed=6, with_index=True, prefetch=prefetch)
    with Loader(store, 8, **opts) as loader:
        assert loader.device.type == "cuda"
        kept = _epochs(loader, 3)
        assert _generation(loader) == 1
    with Loader(store, 8, **opts) as fresh:
        for epoch in kept:
            for (images, labels, idx), (again, labels2, idx2) in zip(epoch, list(fresh), strict=True):
                assert images.device.type == "cuda"
                assert torch.equal(idx.cpu(), idx2.cpu()) and torch.equal(labels.cpu(), labels2.cpu())
                assert torch.equal(images.cpu(), again.cpu())


def test_the_feeding_thread_works_on_one_intra_op_thread_and_leaves_the_callers(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tilefeed.pipeline.engine import feed

    if not feed._threads_are_per_thread():
        pytest.skip("torch's parallel backend is not OpenMP: the count would be the process's")
    calls: list[tuple[bool, int]] = []
    real = torch.set_num_threads

    def recording(n: int) -> None:
        calls.append((threading.current_thread() is threading.main_thread(), n))
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", recording)
    before = torch.get_num_threads()
    with Loader(store, 8, seed=4, train=True, size=24) as loader:
        assert len(list(loader)) > 0
    assert calls == [(False, 1)], "set once, on the feeding thread"
    assert torch.get_num_threads() == before, "the caller's own count is untouched"
