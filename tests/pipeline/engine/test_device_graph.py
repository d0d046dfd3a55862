"""The GPU's graph on DALI's CPU backend (``TILEFEED_DEVICE_GRAPH=1``): what the switch builds,
and the device graph's own faults, found and held without a GPU."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader
from tilefeed.pipeline.device import DEVICE_GRAPH_ENV, device_graph, device_graph_set
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store.errors import ConfigError
from tests.helpers import photo

# pictures whose padded tiles frame them with fractional windows at every output size
PICTURES = [(48, 36), (36, 48), (50, 31), (45, 45), (64, 27), (29, 41)]
UINT8 = dict(dtype=torch.uint8, layout="NHWC", with_index=True, num_workers=1, shuffle=False)


@pytest.fixture(scope="module")
def pad_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same pictures padded into 32 px tiles, as JPEG (quality 95) and as lz4."""
    root = tmp_path_factory.mktemp("device-graph")
    for k, (w, h) in enumerate(PICTURES):
        (root / "src" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        photo(k, w, h).save(root / "src" / f"c{k % 2}" / f"{k}.png")
    stores = {}
    for codec in ("jpeg", "lz4"):
        stores[codec] = root / codec
        preprocess(root / "src", stores[codec], TileSettings(tile=32, fit="pad", background=(0, 0, 0)),
                   StoreSettings(codec=codec, quality=95) if codec == "jpeg" else StoreSettings(codec=codec),
                   workers=1)
    return stores


def _samples(store: Path, on: bool, **options: object) -> dict[int, np.ndarray]:
    with device_graph_set(on), Loader(store, 3, **{**UINT8, **options}) as loader:  # type: ignore[arg-type]
        return {int(i): image for images, _, idx in loader
                for image, i in zip(images.numpy(), idx.tolist(), strict=True)}


def _gap(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> np.ndarray:
    assert a.keys() == b.keys()
    return np.array([np.abs(a[i].astype(np.int16) - b[i].astype(np.int16)).mean() for i in sorted(a)])


@pytest.mark.parametrize("codec", ["jpeg", "lz4"])
@pytest.mark.parametrize("train", [False, True])
def test_jpeg_windows_keep_their_fractions_as_lossless_ones_do(pad_stores: dict[str, Path], codec: str,
                                                               train: bool) -> None:
    """Evaluation framing of padded pictures and training crops: the device graph decodes the
    whole pixels holding each window and resizes the window itself from within them, so it
    agrees with the host shape on JPEG as on lz4 (its decoder alone rounds a fractional window
    to whole pixels: 5.5 levels on average at this size)."""
    options = dict(size=24, train=train, seed=5)
    gap = _gap(_samples(pad_stores[codec], False, **options), _samples(pad_stores[codec], True, **options))
    assert gap.mean() < 0.5, gap


@pytest.mark.parametrize("codec", ["lz4", "jpeg"])
def test_the_switch_builds_the_graph_even_for_stored_tiles(request: pytest.FixtureRequest, codec: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """uint8 NHWC at the tile's size skips DALI in the host shape; the device shape builds the
    graph (decode in DALI), pooled apart from the host shape's, and gives the same tiles (JPEG:
    DALI's decoder and libjpeg-turbo's agree within a level)."""
    store = request.getfixturevalue("store" if codec == "lz4" else "jpeg_store")
    monkeypatch.setenv(DEVICE_GRAPH_ENV, "0")
    with Loader(store, 3, **UINT8) as host:  # type: ignore[arg-type]
        assert host._graph is not None and host._graph.pipe is None
        want = torch.cat([b[0] for b in host])
        host_key = host._graph_key
    monkeypatch.setenv(DEVICE_GRAPH_ENV, "1")
    with Loader(store, 3, **UINT8) as device:  # type: ignore[arg-type]
        assert device._graph is not None and device._graph.pipe is not None
        assert device._graph_key != host_key
        got = torch.cat([b[0] for b in device])
    gap = (got.int() - want.int()).abs()
    assert gap.max() == 0 if codec == "lz4" else gap.float().mean() < 1.0, gap.float().mean()


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("0", False), ("", False)])
def test_the_switch_reads_its_values_and_refuses_others(monkeypatch: pytest.MonkeyPatch, value: str,
                                                        on: bool) -> None:
    monkeypatch.setenv(DEVICE_GRAPH_ENV, value)
    assert device_graph() is on
    monkeypatch.setenv(DEVICE_GRAPH_ENV, "gpu")
    with pytest.raises(ConfigError, match=DEVICE_GRAPH_ENV):
        device_graph()


@pytest.mark.parametrize("on", [False, True])
def test_handed_over_batches_keep_their_values_while_the_graph_runs_on(pad_stores: dict[str, Path],
                                                                       on: bool) -> None:
    """The hand-over gives DALI's own output buffers, with no copy: a batch kept (not cloned)
    keeps its values while the graph runs many batches more, in both shapes."""
    with device_graph_set(on), Loader(pad_stores["jpeg"], 2, size=24, train=True, seed=1, num_workers=1,
                            prefetch_factor=4) as loader:
        assert loader._graph is not None and loader._graph.pipe.exec_dynamic  # what the lifetime rests on
        kept, copies = [], []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for images, _ in loader:
                kept.append(images)
                copies.append(images.clone())
    assert len(kept) == 9
    assert all(torch.equal(a, b) for a, b in zip(kept, copies, strict=True))
    assert len({a.data_ptr() for a in kept}) == len(kept)  # each batch its own buffer


def test_a_padded_crop_feeds_the_graph_only_what_it_reads(pad_stores: dict[str, Path]) -> None:
    """Large-scale jitter pastes its window's part inside the picture: the whole window is not
    fed to DALI (which warns of inputs it never reads)."""
    from tilefeed.pipeline.recipe.recipe import Recipe

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with device_graph_set(), Loader(pad_stores["jpeg"], 3, train=True, size=24, recipe=Recipe(crop="lsj"),
                              num_workers=1) as loader:
            assert len(list(loader)) == 2
    assert not [w for w in caught if "not used" in str(w.message)], [str(w.message) for w in caught]


AT_EXIT = """
import sys
from tilefeed.pipeline import Loader
from tilefeed.pipeline.engine.graph import Graph

close = Graph.close


def said(graph):
    print("closed", flush=True)
    close(graph)


Graph.close = said
with Loader(sys.argv[1], 8, train=True, num_workers=1) as loader:
    assert len(list(loader)) == 7
print("exiting", flush=True)
"""


def test_pooled_graphs_are_closed_before_the_interpreter_exits(store: Path) -> None:
    """A Loader's graph goes back to the pool when the Loader closes and waits there, idle, for
    the next Loader; at exit the pool closes it, before the interpreter's own teardown (where a
    GPU pipeline left to DALI can abort)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", AT_EXIT, str(store)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["exiting", "closed"], done.stdout
