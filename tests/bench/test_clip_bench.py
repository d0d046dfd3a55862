"""The CLIP bench: open_clip's training input from the same img2dataset-style shards through the
Loader (JPEG and lz4 stores), open_clip's WebDataset pipeline and LitData. At a tiny size it runs
end to end from the command line, writes every row's figures as JSON, and every row hands over
the same batches: as many samples, images of one shape, ``(B, 77)`` tokens."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tilefeed.bench.peers.clip_peers import tar_pairs
from tilefeed.bench.suites.clip import (JPEG_TILES, LITDATA, LZ4_TILES, WEBDATASET, ClipResult, count_pairs,
                                        fairness, make_clip_shards)
from tilefeed.bench.suites.compare import UnfairComparison
from tilefeed.cli.bench import bench_main

BATCH, SIZE, STEPS = 8, 32, 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_clip_shards(tmp_path_factory.mktemp("clip") / "shards", count=64, shard_samples=16,
                            sizes=((96, 72), (72, 96)))


@pytest.fixture(scope="module")
def written(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("clip-out") / "clip.json"
    start = multiprocessing.get_start_method()
    assert bench_main(["clip", "--shards", str(shards), "--size", str(SIZE), "--batch-size", str(BATCH),
                       "--workers", "2", "--rounds", "1", "--steps", str(STEPS), "--step-ms", "5",
                       "--out", str(out)]) == 0
    # litdata.optimize's spawn left behind would break the DataLoaders of the rounds after it
    assert multiprocessing.get_start_method() == start
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_the_shards_are_img2dataset_s_layout_made_once(shards: Path) -> None:
    tars = sorted(shards.glob("*.tar"))
    assert [t.name for t in tars] == ["00000.tar", "00001.tar", "00002.tar", "00003.tar"]
    with tarfile.open(tars[0]) as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile("000000000.json").read())  # type: ignore[union-attr]
        text = tar.extractfile("000000000.txt").read().decode()  # type: ignore[union-attr]
    assert names[:3] == ["000000000.jpg", "000000000.txt", "000000000.json"] and len(names) == 48
    assert meta["key"] == "000000000" and meta["caption"] == text and meta["status"] == "success"
    assert count_pairs(tars) == 64 and len(list(tar_pairs(tars[0]))) == 16
    before = [t.stat().st_mtime_ns for t in tars]
    make_clip_shards(shards, count=64, shard_samples=16)
    assert [t.stat().st_mtime_ns for t in tars] == before


def test_every_row_runs_and_hands_over_the_same_batches(written: dict[str, Any]) -> None:
    rows = [JPEG_TILES, LZ4_TILES, WEBDATASET]
    if importlib.util.find_spec("litdata") is not None:
        rows.append(LITDATA)
    else:
        assert "not installed" in written["absent"][LITDATA]
    for figure in ("rate", "stall", "disk_bytes", "conversion_s"):
        assert sorted(written[figure]) == sorted(rows), figure
        assert all(len(f["rounds"]) == 1 for f in written[figure].values())
    assert all(f["rounds"][0] > 0 for f in written["rate"].values())
    assert all(0 <= f["rounds"][0] <= 1 for f in written["stall"].values())
    assert all(f["rounds"][0] > 0 for f in written["disk_bytes"].values())
    assert written["conversion_s"][WEBDATASET]["rounds"] == [0.0]
    # the JPEG store at the highest quality no larger than the tars, or the lowest tried
    assert (written["disk_bytes"][JPEG_TILES]["rounds"][0] <= written["settings"]["tar_bytes"]
            or written["settings"]["jpeg_quality"] == 75)
    for row in rows:  # apples to apples: the same count, images and tokens in every batch
        held = written["batches"][row]
        assert held["images"] == [BATCH, 3, SIZE, SIZE] and held["images_dtype"] == "float32", row
        assert held["tokens"] == [BATCH, 77] and held["tokens_dtype"] == "int64", row
        assert held["samples"] == [BATCH * STEPS] * 2, row
    assert written["fair"].startswith("fair: every row delivered 32 samples")
    measured = {(r["loader"], r["step_ms"]) for r in written["runs"]}
    assert measured == {(row, ms) for row in rows for ms in (0, 5)}


def test_the_table_comes_back_from_the_json(written: dict[str, Any]) -> None:
    result = ClipResult.from_dict(written)
    table = result.table()
    assert json.loads(json.dumps(result.as_dict())) == written
    assert f"| {JPEG_TILES} (q{written['settings']['jpeg_quality']}) |" in table
    assert all(f"| {row} " in table for row in written["rate"]) and table.endswith(written["fair"])


def test_rows_whose_batches_differ_are_refused() -> None:
    held = {"images": [8, 3, 32, 32], "images_dtype": "float32", "tokens": [8, 77], "tokens_dtype": "int64",
            "samples": [32, 32]}
    assert "(8, 77) int64" in fairness({"a": held, "b": dict(held)})
    with pytest.raises(UnfairComparison, match="batches differ"):
        fairness({"a": held, "b": {**held, "samples": [24, 32]}})
    with pytest.raises(UnfairComparison, match="batches differ"):
        fairness({"a": held, "b": {"kinds": [["(8, 3, 32, 32)"], ["(4, 3, 32, 32)"]], "samples": [32, 32]}})
    with pytest.raises(UnfairComparison, match="not \\(B, 77\\)"):
        fairness({"a": {**held, "tokens": [8, 64]}})
