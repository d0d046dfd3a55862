from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from tilefeed.pipeline.engine import graph_pool as pool
from tilefeed.pipeline.engine.graph import Graph
from tilefeed.pipeline.engine.batch_source import BatchSource
from tilefeed.pipeline.engine.feed import Feed
from tilefeed.pipeline.options import IMAGENET_MEAN, IMAGENET_STD
from tilefeed.pipeline import ConfigError, CorruptChunkError, Loader, StoreFormatError, StoreReader
from tilefeed.store import format as fmt
from tests.helpers import psnr
from tests.helpers import make_store


def indices_of(loader: Loader) -> list[int]:
    return [i for *_, idx in loader for i in idx.tolist()]


@pytest.mark.parametrize("shuffle", ["global", "shard", "none"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_exactly_once_across_ranks(store: Path, shuffle: str, world: int, drop_last: bool) -> None:
    batch = 4
    seen: Counter[int] = Counter()
    lengths = set()
    for rank in range(world):
        with Loader(store, batch, shuffle=shuffle, rank=rank, world_size=world, drop_last=drop_last,
                    with_index=True, train=False, dtype=torch.uint8, workers=1) as loader:
            got = [idx.tolist() for _, _, idx in loader]
            assert len(got) == len(loader)
            lengths.add(len(got))
            assert all(len(b) == batch for b in got[:-1])
            seen.update(i for b in got for i in b)
    assert len(lengths) == 1, "every rank gets the same number of batches"
    if drop_last:
        assert max(seen.values()) == 1 and 50 - len(seen) < world * batch
    else:
        assert len(seen) == 50 and sum(seen.values()) - 50 < world


def test_len_batches_and_partial_last_batch(store: Path) -> None:
    with Loader(store, 16, train=False, dtype=torch.uint8) as loader:
        assert len(loader) == 4 and loader.batch_size == 16
        sizes = [len(x) for x, _ in loader]
        assert sizes == [16, 16, 16, 2]
    with Loader(store, 16, drop_last=True, train=False, dtype=torch.uint8) as loader:
        assert len(loader) == 3 and [len(x) for x, _ in loader] == [16, 16, 16]


def test_eval_uint8_at_tile_size_gives_the_stored_tiles(store: Path) -> None:
    reader = StoreReader(store)
    with Loader(store, 8, shuffle="global", train=False, size=32, dtype=torch.uint8,
                layout="NHWC", with_index=True) as loader:
        kept = list(loader)  # batches stay valid after the loop moves on (no reused buffers)
    assert len({images.data_ptr() for images, _, _ in kept}) == len(kept)  # none shares memory
    for images, labels, idx in kept:
        assert images.dtype == torch.uint8 and images.shape[1:] == (32, 32, 3)
        for image, label, i in zip(images, labels, idx.tolist(), strict=True):
            np.testing.assert_array_equal(image.numpy(), reader.read(i))
            assert int(label) == int(reader.labels[i])


@pytest.mark.parametrize("codec,layout", [("lz4", "NCHW"), ("lz4", "channels_last"), ("jpeg", "NCHW")])
def test_train_output_is_each_window_resized_flipped_and_normalised(
        request: pytest.FixtureRequest, codec: str, layout: str) -> None:
    """Against torch's own antialiased bilinear resize of the window (torchvision's tensor path)."""
    store = request.getfixturevalue("store" if codec == "lz4" else "jpeg_store")
    reader = StoreReader(store)
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    with Loader(store, 16, train=True, size=24, with_index=True, layout=layout, seed=3) as loader:
        images, _, idx = next(iter(loader))
        start, end, flip = loader.windows(0, idx.numpy())
    assert flip.any() and not flip.all()
    for k, i in enumerate(idx.tolist()):
        (y0, x0), (y1, x1) = start[k].round().astype(int), end[k].round().astype(int)
        window = torch.from_numpy(reader.read(i)[y0:y1, x0:x1]).permute(2, 0, 1)[None].float()
        want = torch.nn.functional.interpolate(window, size=(24, 24), mode="bilinear", antialias=True,
                                               align_corners=False)[0].round().clamp(0, 255)
        want = ((want.flip(-1) if flip[k] else want) - mean) / std
        assert (images[k] - want).abs().mean() < 1.5 / 57, (k, flip[k])


@pytest.mark.parametrize("train", [False, True])
def test_the_next_epoch_read_ahead_is_kept_only_for_the_epoch_that_comes(store: Path, train: bool) -> None:
    """Its first batches are read while this epoch ends; set_epoch to another one drops them."""
    def loader() -> Loader:
        return Loader(store, 8, shuffle=True, train=train, size=32, with_index=True,
                      dtype=torch.float32 if train else torch.uint8, layout="NHWC")

    def epoch(loader: Loader) -> tuple[list[int], torch.Tensor]:
        batches = [(x.clone(), idx) for x, _, idx in loader]
        return [i for _, idx in batches for i in idx.tolist()], torch.cat([x for x, _ in batches])

    with loader() as a:
        for number in (0, 1, 5):
            if number == 5:
                a.set_epoch(5)  # epoch 2 was read ahead: dropped
            with loader() as fresh:  # that epoch from a cold start, nothing read ahead
                fresh.set_epoch(number)
                want_indices, want_images = epoch(fresh)
            got_indices, got_images = epoch(a)
            assert got_indices == want_indices == a.epoch_indices(number).tolist()
            assert torch.equal(got_images, want_images)  # the same crops and flips: that epoch's


def test_jpeg_tiles_decode_close_to_what_was_stored(jpeg_store: Path) -> None:
    reader = StoreReader(jpeg_store)
    with Loader(jpeg_store, 8, shuffle="none", train=False, size=32, dtype=torch.uint8,
                layout="NHWC", with_index=True) as loader:
        images, _, idx = next(iter(loader))
    for image, i in zip(images, idx.tolist(), strict=True):
        assert psnr(image.numpy(), reader.read(i)) > 35


@pytest.mark.parametrize("train", [False, True])
def test_fast_idct_decodes_jpeg_tiles_a_few_levels_off(jpeg_store: Path, train: bool) -> None:
    def first_batch(fast_idct: bool) -> np.ndarray:
        with Loader(jpeg_store, 8, shuffle="none", train=train, size=32, dtype=torch.uint8,
                    layout="NHWC", fast_idct=fast_idct) as loader:
            return next(iter(loader))[0].numpy().astype(np.int16)

    off = np.abs(first_batch(True) - first_batch(False))
    assert 0 < off.max() <= 8 and off.mean() < 2  # another IDCT, the same crops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("train", [True, False])
def test_dtypes_layouts_and_sizes(store: Path, dtype: torch.dtype, layout: str, train: bool) -> None:
    with Loader(store, 8, dtype=dtype, layout=layout, train=train, size=24) as loader:
        images, labels = next(iter(loader))
    assert images.dtype == dtype and images.device.type == "cpu"
    assert images.shape == ((8, 3, 24, 24) if layout == "NCHW" else (8, 24, 24, 3))
    assert labels.dtype == torch.int64 and labels.shape == (8,)
    if dtype != torch.uint8:
        values = images.float()
        assert values.min() < -0.5 and values.max() > 0.5  # normalised, not 0..255


def test_normalisation_matches_mean_and_std(store: Path) -> None:
    reader = StoreReader(store)
    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
    with Loader(store, 4, shuffle="none", train=False, size=32, layout="NHWC", mean=mean, std=std,
                with_index=True) as loader:
        images, _, idx = next(iter(loader))
    expected = (reader.read(int(idx[0])).astype(np.float32) - np.float32(mean)) / np.float32(std)
    np.testing.assert_allclose(images[0].numpy(), expected, rtol=1e-5, atol=1e-4)


def test_order_is_deterministic_and_changes_per_epoch(store: Path) -> None:
    def epochs(n: int) -> list[list[int]]:
        with Loader(store, 8, seed=5, with_index=True) as loader:
            return [indices_of(loader) for _ in range(n)]

    first, second = epochs(2), epochs(2)
    assert first == second
    assert first[0] != first[1] and sorted(first[0]) == sorted(first[1]) == list(range(50))
    with Loader(store, 8, seed=5, with_index=True) as loader:
        loader.set_epoch(1)
        assert indices_of(loader) == first[1]
        assert loader.epoch_indices(1).tolist() == first[1]


def test_augmentation_is_reproducible_for_a_seed(store: Path) -> None:
    def first_batch(seed: int) -> torch.Tensor:
        with Loader(store, 8, seed=seed, shuffle="none", train=True) as loader:
            return next(iter(loader))[0].clone()

    a, b, c = first_batch(1), first_batch(1), first_batch(2)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("stop_after", [0, 3, 6])
def test_resume_yields_exactly_the_samples_left(store: Path, stop_after: int) -> None:
    full_epoch = Loader(store, 4, seed=9, with_index=True).epoch_indices(2).tolist()
    with Loader(store, 4, seed=9, with_index=True) as loader:
        loader.set_epoch(2)
        first = []
        for n, (_, _, idx) in enumerate(loader):
            first += idx.tolist()
            if n == stop_after:
                state = loader.state_dict()  # taken inside the loop, as a training script would
                break
    assert state["epoch"] == 2 and state["batch"] == stop_after + 1
    with Loader(store, 4, seed=9, with_index=True) as resumed:
        resumed.load_state_dict(state)
        rest = indices_of(resumed)
        assert resumed.state_dict()["epoch"] == 3 and resumed.state_dict()["batch"] == 0
    assert first + rest == full_epoch
    with Loader(store, 8, seed=10) as other, pytest.raises(ValueError, match="seed=9"):
        other.load_state_dict(state)


def dali_threads() -> set[int]:
    """This process's DALI threads (DALI names its threads ``[DALI]...``), by native id; none
    where ``/proc`` does not show a process's threads."""
    found = set()
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if (task / "comm").read_text().startswith("[DALI]"):
                found.add(int(task.name))
    return found


DALI_VISIBLE = Path("/proc/self/task").is_dir()


def idle_in_pool(graph: Graph) -> bool:
    return any(g is graph for idle in pool._idle.values() for g in idle)


BLIND = "the check cannot see the threads it counts"


def check_break_and_close_leave_no_thread_or_process(store: Path) -> None:
    """Epochs left early, one ended by an exception, then ``close()``: the Loader's own threads
    (the feeding thread, the reader threads) end, its graph is given back to the pool (where
    DALI's threads stay parked), and those go with the pool."""
    me = psutil.Process()
    pool.clear()
    before_children = set(me.children(recursive=True))  # e.g. multiprocessing's resource tracker
    before_threads = {t.ident for t in threading.enumerate()}
    before_dali = dali_threads()
    threads_before = me.num_threads()
    loader = Loader(store, 4, workers=2, with_index=True)
    for _ in range(3):
        for n, _batch in enumerate(loader):
            if n == 2:
                break  # what was prepared for the rest is dropped; the next epoch reuses the graph
    # what the checks below look for is there while the Loader runs, so they can see it leak
    started = {t.name.rstrip("_0123456789") for t in threading.enumerate() if t.ident not in before_threads}
    assert {"tilefeed-feed", "tilefeed-read"} <= started, f"{BLIND}: {started}"
    assert dali_threads() - before_dali or not DALI_VISIBLE, f"{BLIND}: no DALI thread seen"
    graph = weakref.ref(loader._graph)  # weakly: a graph held here would keep DALI's threads
    assert len(indices_of(loader)) == 50  # a whole epoch after three abandoned ones
    assert set(me.children(recursive=True)) <= before_children
    with pytest.raises(RuntimeError, match="boom"):
        for _batch in loader:
            raise RuntimeError("boom")
    loader.close()
    given = graph()
    assert loader._graph is None and given is not None and idle_in_pool(given), "the graph was not given back"
    assert given.feed._thread is None and given.source._pool is None  # parked: its threads ended
    del given
    assert {t.ident for t in threading.enumerate()} <= before_threads  # reader threads ended
    assert set(me.children(recursive=True)) <= before_children
    assert len(indices_of(Loader(store, 4, with_index=True))) == 50  # still usable afterwards
    pool.clear()
    assert me.num_threads() <= threads_before  # DALI's parked threads go with the pool
    assert not dali_threads() - before_dali


def test_break_and_close_leave_no_thread_or_process(store: Path) -> None:
    check_break_and_close_leave_no_thread_or_process(store)


# Loaders that leak, for the check above to fail on. Each keeps what it leaked, and ends it after
# the test, so that no later test finds its threads.

@pytest.fixture
def close_drops_the_graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``close()`` lets go of the graph without stopping it: its feeding thread, reader threads
    and DALI's run on."""
    dropped: list[Graph] = []

    def release(self: Loader, keep: bool = True) -> None:
        if self._graph is not None:
            dropped.append(self._graph)
        self._graph = None

    monkeypatch.setattr(Loader, "_release", release)
    yield
    for graph in dropped:
        graph.close()
    pool.clear()


@pytest.fixture
def reader_threads_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A graph given back with its reader threads running: the batch source's ``close()`` ends
    the stream but not its threads."""
    real = BatchSource.close
    kept: list[BatchSource] = []

    def close(self: BatchSource) -> None:
        kept.append(self)
        self.stop()

    monkeypatch.setattr(BatchSource, "close", close)
    yield
    pool.clear()
    for source in kept:
        real(source)


@pytest.fixture
def feed_thread_left_running(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Parking a feed forgets its thread without ending it: the graph looks parked (no thread,
    no reader threads) while its feeding thread waits on for work."""
    left: list[tuple[Feed, threading.Thread]] = []

    def park(self: Feed) -> bool:
        self.source.stop()
        if self._thread is not None:
            left.append((self, self._thread))
        self._thread, self._position, self._epochs, self._later = None, None, {}, None
        self._clear()
        return not self.broken

    monkeypatch.setattr(Feed, "park", park)
    yield
    for feed, thread in left:
        with feed.source.lock:
            feed._closing = True
            feed.source.lock.notify_all()
        thread.join(timeout=60)
    pool.clear()


@pytest.fixture
def pool_keeps_closed_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Closed graphs held on to: DALI's threads live as long as its pipeline does."""
    real = Graph.close
    kept: list[Graph] = []

    def close(self: Graph) -> None:
        kept.append(self)
        real(self)

    monkeypatch.setattr(Graph, "close", close)
    yield
    kept.clear()  # the pipelines go, and DALI joins their threads


@pytest.fixture
def graph_closed_not_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close()`` closes the graph instead of giving it back: nothing leaks, but the next Loader
    builds a graph again (and DALI leaves memory behind for each: see ``graph_pool``)."""
    real = Loader._release
    monkeypatch.setattr(Loader, "_release", lambda self, keep=True: real(self, keep=False))


LEAKS = ["close_drops_the_graph", "reader_threads_kept", "feed_thread_left_running", "pool_keeps_closed_graphs",
         "graph_closed_not_given_back"]


@pytest.mark.parametrize("breakage", LEAKS)
def test_the_no_thread_check_fails_on_a_loader_that_leaks(
        store: Path, breakage: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(breakage)
    with pytest.raises(AssertionError) as failed:
        check_break_and_close_leave_no_thread_or_process(store)
    assert BLIND not in str(failed.value)  # the leak was caught, not the check's own sight lost


def test_corrupt_chunk_is_named_not_yielded(tmp_path: Path) -> None:
    out = make_store(tmp_path, "none")
    shard = fmt.shard_path(out, 2)
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0x40  # inside the first chunk of shard 2: sample 16
    shard.write_bytes(bytes(raw))
    with Loader(out, 4, shuffle="none", train=False, dtype=torch.uint8) as loader:
        with pytest.raises(CorruptChunkError) as err:
            for _ in loader:
                pass
    assert str(shard) in str(err.value) and "sample 16" in str(err.value)


def test_options_are_validated_up_front(store: Path) -> None:
    bad = [
        dict(batch_size=0), dict(shuffle="random"), dict(dtype=torch.int32), dict(layout="CHW"),
        dict(size=3), dict(workers=0), dict(prefetch=0), dict(rank=2, world_size=2),
        dict(rank=0), dict(scale=(0.5, 0.1)), dict(device="tpu"), dict(device="gpu:0"),
        *([dict(device="cuda:0")] if not torch.cuda.is_available() else []),
    ]
    for kwargs in bad:
        batch_size = kwargs.pop("batch_size", 4)
        with pytest.raises(ValueError):
            Loader(store, batch_size, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(StoreFormatError, match="not a tilefeed store") as caught:
        Loader(store.parent, 4)
    assert "`tilefeed preprocess IMAGES " in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(StoreFormatError, match="does not exist") as caught:
        Loader(store.parent / "not-a-store", 4)
    assert f"`tilefeed preprocess IMAGES {store.parent / 'not-a-store'}`" in str(caught.value)


@pytest.mark.parametrize("device", ["tpu", "gpu:0", "meta", "xla"])
def test_a_device_of_another_kind_is_refused_before_torch_reads_it(store: Path, device: str) -> None:
    """torch knows kinds the Loader cannot feed, and its own error is a RuntimeError, not a ValueError."""
    with pytest.raises(ConfigError, match=r"device must be 'cpu' or 'cuda\[:N\]', got '" + device) as err:
        Loader(store, 4, device=device)
    assert err.value.__cause__ is None  # refused by the settings, not translated from torch


def test_settings_hold_the_options_resolved(store: Path) -> None:
    with Loader(store, 4, workers=2, prefetch=3, shuffle=False, rank=1, world_size=2,
                indices=[7, 3, 5]) as loader:
        settings = loader.settings
        assert (settings.workers, settings.prefetch, settings.shuffle) == (2, 3, "none")
        assert (loader.workers, loader.prefetch, loader.shuffle, loader.rank) == (2, 3, "none", 1)
        assert loader.subset is not None and loader.subset.tolist() == [3, 5, 7]
        with pytest.raises(AttributeError):
            settings.workers = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"indices must lie in 0\.\.49"):
        Loader(store, 4, indices=[3, 50])


@pytest.mark.parametrize("train", [True, False])
def test_jpeg_store_through_the_cpu_decoder(jpeg_store: Path, train: bool) -> None:
    with Loader(jpeg_store, 8, train=train, size=24, with_index=True) as loader:
        seen = []
        for images, labels, idx in loader:
            assert images.shape[1:] == (3, 24, 24) and images.dtype == torch.float32
            assert labels.shape == idx.shape
            seen += idx.tolist()
    assert sorted(seen) == list(range(50))


def test_a_loader_dropped_mid_epoch_inside_a_reference_cycle_spoils_no_later_loader(store: Path) -> None:
    import gc

    for _ in range(5):
        loader = Loader(store, 4, train=True, size=24)
        loader.me = loader  # type: ignore[attr-defined]  # a cycle, as a user's objects may make
        it = iter(loader)
        next(it)
        del loader, it
        gc.collect()  # finalises the cycle: DALI may shut the pipeline down under the Loader
        with Loader(store, 4, train=True, size=24, with_index=True) as fresh:
            assert len(indices_of(fresh)) == 50


# What a finaliser must not call: each waits for a thread or stops one. The collector may finalise
# a Loader inside ``threading`` holding its locks (seen: a thread starting, in
# ``_maintain_shutdown_locks``): joining a thread there deadlocked.
WAITS = [(threading.Thread, "join"), (ThreadPoolExecutor, "shutdown"), (Graph, "park"),
         (Graph, "close"), (Feed, "park"), (BatchSource, "close"), (BatchSource, "stop")]


def check_finaliser_waits_for_nothing(loader: Loader) -> None:
    """``loader.__del__()`` on an armed Loader calls nothing of ``WAITS`` (recorded, on this
    thread, not refused: a finaliser swallows every exception) and leaves its graph running, noted
    for the pool to take back later."""
    graph = loader._graph
    assert graph is not None and graph.feed._thread is not None and graph.source._pool is not None
    me = threading.get_ident()
    called: list[str] = []

    def recording(real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me:  # the finaliser's calls, not those of the graph's threads
                called.append(name)
            return real(self, *args, **kwargs)
        return recorded

    with pytest.MonkeyPatch.context() as m:
        for owner, name in WAITS:
            m.setattr(owner, name, recording(getattr(owner, name), f"{owner.__name__}.{name}"))
        loader.__del__()
    assert not called, f"the finaliser called {called}"
    assert loader._graph is None and any(g is graph for _, g in pool._orphans)
    assert graph.feed._thread.is_alive() and graph.source._pool is not None  # nothing stopped yet


def test_a_finalised_loader_waits_for_nothing_and_its_graph_is_given_back_later(store: Path) -> None:
    """The collector may finalise a Loader inside ``threading`` holding its locks: the finaliser
    only notes the graph, and the next Loader's take gives it back (which ends its threads)."""
    pool.clear()
    loader = Loader(store, 4, workers=2)
    it = iter(loader)
    next(it)
    graph = loader._graph
    check_finaliser_waits_for_nothing(loader)
    assert loader._graph is None and pool._orphans
    with Loader(store, 4, with_index=True) as fresh:  # the orphan is given back first
        assert not pool._orphans
        assert len(indices_of(fresh)) == 50
    assert graph is not None and graph.source._pool is None  # its reader threads ended
    del it
    pool.clear()


# Finalisers that wait, for the check above to fail on.

@pytest.fixture
def finaliser_gives_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph given back to the pool from the finaliser itself: parking it joins its threads."""
    def __del__(self: Loader) -> None:
        graph, self._graph = getattr(self, "_graph", None), None
        with contextlib.suppress(Exception):
            if graph is not None:
                pool.give(self._graph_key, graph)

    monkeypatch.setattr(Loader, "__del__", __del__)


@pytest.fixture
def finaliser_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finaliser that closes the Loader, as ``__exit__`` does."""
    def __del__(self: Loader) -> None:
        with contextlib.suppress(Exception):
            self.close()

    monkeypatch.setattr(Loader, "__del__", __del__)


@pytest.mark.parametrize("breakage", ["finaliser_gives_back", "finaliser_closes"])
def test_the_finaliser_check_fails_on_a_finaliser_that_waits(
        store: Path, breakage: str, request: pytest.FixtureRequest) -> None:
    pool.clear()
    loader = Loader(store, 4, workers=2)
    it = iter(loader)
    next(it)
    request.getfixturevalue(breakage)
    with pytest.raises(AssertionError, match="the finaliser called"):
        check_finaliser_waits_for_nothing(loader)
    del it
    pool.clear()


@pytest.mark.parametrize("train", [False, True])
def test_channels_last_is_nchw_shaped_in_channels_last_memory(store: Path, train: bool) -> None:
    opts = dict(shuffle=False, train=train, size=24, seed=3)
    with Loader(store, 8, layout="channels_last", **opts) as a, Loader(store, 8, layout="NCHW", **opts) as b:
        last, _ = next(iter(a))
        first, _ = next(iter(b))
    assert last.shape == first.shape == (8, 3, 24, 24)
    assert last.is_contiguous(memory_format=torch.channels_last) and not last.is_contiguous()
    torch.testing.assert_close(last, first)


def test_the_settings_never_print_the_storage_options() -> None:
    from dataclasses import fields

    from tilefeed.pipeline.settings import LoaderSettings

    (options,) = (f for f in fields(LoaderSettings) if f.name == "storage_options")
    assert not options.repr  # credentials travel there (secret keys, session tokens)
