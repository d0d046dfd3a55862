"""The mixture row of the loader bench: two halves of a store, made from its source paths, read
as a 50/50 mixture against the store itself, and refused when they do not add up to it."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import write_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    images = write_folder(root / "images", classes=2, per_class=12, size=(64, 48))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=32, fit="crop"), StoreSettings(shard_size=8),
               workers=1)
    return images, store


def test_the_halves_hold_the_store_once_and_are_made_once(tmp_path: Path, data: tuple[Path, Path]) -> None:
    from collections import Counter

    import numpy as np

    from tilefeed.bench.fixtures.halves import split_store
    from tilefeed.pipeline import StoreReader
    from tilefeed.pipeline.sheet import source_paths

    _, store = data
    halves = split_store(store, tmp_path / "halves", workers=1, log=False)
    with StoreReader(store) as whole, StoreReader(halves[0]) as a, StoreReader(halves[1]) as b:
        assert len(a) == len(b) == len(whole) // 2
        assert a.classes == b.classes == whole.classes and a.tile == whole.tile
        assert Counter(source_paths(a, np.arange(len(a))) + source_paths(b, np.arange(len(b)))) \
            == Counter(source_paths(whole, np.arange(len(whole))))
    written = {h: os.stat(h / "zarr.json").st_mtime_ns for h in halves}
    assert split_store(store, tmp_path / "halves", workers=1, log=False) == halves
    assert {h: os.stat(h / "zarr.json").st_mtime_ns for h in halves} == written  # reused


def test_the_mixture_row_reads_the_store_samples_in_the_same_rounds(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    from tilefeed.bench.suites.loader import MIX_TILEFEED, bench_loaders
    from tilefeed.bench.fixtures.halves import split_store

    images, store = data
    halves = split_store(store, tmp_path / "halves", workers=1, log=False)
    result = bench_loaders(images, store, batch_size=8, workers=1, rounds=2, min_seconds=0.1,
                           log=False, halves=halves)
    assert len(result.rates) == 7 and result.rates[MIX_TILEFEED] > 0
    assert result.mixture_samples == result.samples == 24
    assert result.mixture_ratio is not None
    ratio, low, high = result.mixture_ratio
    assert len(result.mixture_ratios) == 2 and ratio == statistics.median(result.mixture_ratios)
    assert 0 < low <= ratio <= high and set(result.ranges) == set(result.rates)  # the rounds' median
    assert "50/50 mixture of two halves / the single store" in result.table()


def test_halves_of_other_samples_are_refused(tmp_path: Path, data: tuple[Path, Path]) -> None:
    from tilefeed.bench.suites.loader import bench_loaders
    from tilefeed.bench.fixtures.halves import split_store
    from tilefeed.store.errors import ConfigError

    images, store = data
    other = write_folder(tmp_path / "other", classes=2, per_class=12, size=(64, 48), seed=7)
    other_store = tmp_path / "other-store"
    preprocess(other, other_store, TileSettings(tile=32, fit="crop"), StoreSettings(shard_size=8),
               workers=1)
    ours = split_store(store, tmp_path / "halves", workers=1, log=False)
    theirs = split_store(other_store, tmp_path / "other-halves", workers=1, log=False)
    for halves, why in (((ours[0], theirs[1]), "source paths are not in them"),
                        ((ours[0], ours[0]), "source paths are not in them"),
                        ((ours[0], store), "together 36 samples, the store 24")):
        with pytest.raises(ConfigError, match=f"do not hold exactly .*{why}"):
            bench_loaders(images, store, batch_size=8, workers=1, rounds=1, min_seconds=0.1,
                          log=False, halves=halves)


def test_halves_made_otherwise_are_refused(tmp_path: Path, data: tuple[Path, Path]) -> None:
    from tilefeed.bench.fixtures.halves import HALVES, check_halves, split_store
    from tilefeed.pipeline import StoreReader
    from tilefeed.preprocess.sources.scanning import SourceOptions
    from tilefeed.store.errors import ConfigError

    _, store = data
    a, _b = split_store(store, tmp_path / "halves", workers=1, log=False)
    other = tmp_path / "halves" / "other-codec"
    preprocess(tmp_path / "halves" / f"{HALVES[1]}.jsonl", other, TileSettings(tile=32, fit="crop"),
               StoreSettings(codec="none", shard_size=8), workers=1,
               source_options=SourceOptions(labels="names", allow_outside=True))
    with StoreReader(store) as whole, pytest.raises(ConfigError, match=r"other settings \(codec\)"):
        check_halves(whole, (a, other))


def test_halves_with_two_labels_swapped_are_refused(tmp_path: Path, data: tuple[Path, Path]) -> None:
    """The same paths and the same label counts, but two paths under each other's class: not
    the store's samples."""
    import json

    from tilefeed.bench.fixtures.halves import HALVES, check_halves, split_store
    from tilefeed.pipeline import StoreReader
    from tilefeed.preprocess.sources.scanning import SourceOptions
    from tilefeed.store.errors import ConfigError

    _, store = data
    a, _b = split_store(store, tmp_path / "halves", workers=1, log=False)
    rows = [json.loads(line) for line in (tmp_path / "halves" / f"{HALVES[1]}.jsonl").read_text().splitlines()]
    other = next(k for k, row in enumerate(rows) if row["label"] != rows[0]["label"])
    rows[0]["label"], rows[other]["label"] = rows[other]["label"], rows[0]["label"]
    swapped = tmp_path / "swapped.jsonl"
    swapped.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "swapped"
    preprocess(swapped, out, TileSettings(tile=32, fit="crop"), StoreSettings(shard_size=8), workers=1,
               source_options=SourceOptions(labels="names", allow_outside=True))
    with StoreReader(store) as whole, pytest.raises(ConfigError, match="under the store's labels"):
        check_halves(whole, (a, out))


def test_paired_rates_take_the_epochs_in_turn_and_keep_each_side_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Epochs alternate, the lead changing every pair, until both sides ran long enough; each
    rate counts only its own side's samples over its own time (a fake clock: exact)."""
    import types

    from tilefeed.bench.suites import loader as loader_bench

    clock = [0.0]
    monkeypatch.setattr(loader_bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    calls: list[str] = []

    def epoch(name: str, samples: int, seconds: float) -> Any:
        def run() -> int:
            calls.append(name)
            clock[0] += seconds
            return samples
        return run

    first, second = loader_bench._paired_rates(epoch("a", 100, 0.25), epoch("b", 10, 0.5), 1.0)
    assert calls == ["a", "b", "b", "a"] * 2  # until a too has run its second
    assert first == 400 / 1.0 and second == 40 / 2.0


def test_the_sizes_bench_measures_every_size_with_one_graph_per_loader(tmp_path: Path) -> None:
    """``--sizes``: every loader at every size, three pipelines built over all the size changes,
    the decode at each DCT scale, and the share of tiles decoded below full size (none at the
    tile's own size; some where windows span twice the output)."""
    from tilefeed.bench.suites.loader import JPEG_FULL, JPEG_SCALED, LOSSLESS, bench_sizes
    from tests.helpers import make_store

    lossless, jpeg = make_store(tmp_path / "lz4", "lz4"), make_store(tmp_path / "jpeg", "jpeg")
    result = bench_sizes(lossless, jpeg, [8, 16, 32], batch_size=8, workers=1, rounds=1,
                         min_seconds=0.05, log=False)
    assert result.builds == 3 and result.sizes == [8, 16, 32] and result.tile == 32
    assert set(result.rates) == {LOSSLESS, JPEG_SCALED, JPEG_FULL}
    assert all(rate > 0 for by in result.rates.values() for rate in by.values())
    assert set(result.decode) == {1, 2, 4, 8} and all(rate > 0 for rate in result.decode.values())
    assert result.reduced[32] == 0 and result.reduced[8] > 0
    table = result.table()
    assert "| 8 |" in table and "| 1/8 |" in table and "DALI pipelines built, three Loaders" in table


def test_halves_that_cannot_be_made_or_checked_drop_the_row_not_the_bench(
        data: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tilefeed.bench.fixtures import halves as mixture_halves
    from tilefeed.cli import bench_forms
    from tilefeed.store.errors import ConfigError

    _, store = data

    def cannot_write(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(mixture_halves, "split_store", cannot_write)
    assert bench_forms._halves(store) is None
    assert "no mixture row: " in capsys.readouterr().out

    def other_samples(*args: object) -> None:
        raise ConfigError("halves do not hold exactly the store's samples")

    monkeypatch.setattr(mixture_halves, "split_store", lambda *a, **k: (store, store))
    monkeypatch.setattr(mixture_halves, "check_halves", other_samples)
    assert bench_forms._halves(store) is None
    assert "do not hold exactly" in capsys.readouterr().out
