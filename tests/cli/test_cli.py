from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store.errors import ConfigError
from tests.helpers import run_cli, write_folder

RUN_KEYS = {"loader", "batch_size", "samples", "steps", "wait_s", "step_s", "wall_s",
            "stall_fraction", "samples_per_s", "peak_rss_mb"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    images = write_folder(root / "images", classes=2, per_class=12, size=(64, 48))
    store = root / "store"
    preprocess(images, store, TileSettings(tile=32), StoreSettings(shard_size=8), workers=1)
    return images, store


def tilefeed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI, on the CPU even where there is a GPU (the gpu-check bench covers that path)."""
    return run_cli(*args, timeout=300, env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})


def test_bench_cli_json_contract_and_plots(tmp_path: Path, data: tuple[Path, Path]) -> None:
    images, store = data
    out = tmp_path / "out.json"
    r = tilefeed("bench", "--images", str(images), "--store", str(store), "--loaders",
                 "baseline,tilefeed,tiles-dataloader,dali-files", "--batch-size", "8", "--steps",
                 "4", "--warmup", "1", "--step-ms", "5", "--workers", "1", "--size", "32",
                 "--out", str(out), "--plots", str(tmp_path / "plots"))
    assert r.returncode == 0, r.stderr
    assert "fair: every loader delivered 32 samples in 4 steps of batch 8" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["fair"] is True and doc["settings"]["batch_size"] == 8
    assert [run["loader"] for run in doc["runs"]] == ["baseline", "tilefeed", "tiles-dataloader",
                                                       "dali-files"]
    for run in doc["runs"]:
        assert RUN_KEYS <= run.keys()
        assert run["output"] == {"shape": [3, 32, 32], "dtype": "float32", "device": "cpu"}
    stages = doc["runs"][1]["extra"]["stages"]  # tilefeed's own figures, per stage
    assert stages["bottleneck"] in ("step", "read", "decode", "resize", "download", "graph", "copy")
    assert set(stages["ms_per_batch"]) >= {"read", "decode", "resize", "graph"}
    for name in ("stall.png", "timeline.png", "stages.png"):
        with Image.open(tmp_path / "plots" / name) as im:
            assert im.size[0] > 300


def test_bench_model_step_names_the_dominant_memory_term(data: tuple[Path, Path]) -> None:
    images, store = data
    r = tilefeed("bench", "--images", str(images), "--store", str(store), "--loaders", "tilefeed",
                 "--batch-size", "8", "--steps", "2", "--warmup", "1", "--step", "model",
                 "--model-width", "8", "--size", "32", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "model memory dominated by" in r.stdout and "ResNet-style" in r.stdout


def test_sweep_and_diagnose(tmp_path: Path, data: tuple[Path, Path]) -> None:
    images, store = data
    common = ["--images", str(images), "--store", str(store), "--batch-size", "8", "--steps", "3",
              "--warmup", "1", "--size", "32", "--workers", "1"]
    r = tilefeed("bench", "sweep", *common, "--loaders", "tilefeed", "--values", "0,20",
                 "--plots", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sweep.png").stat().st_size > 0
    r = tilefeed("bench", "diagnose", *common, "--loaders", "baseline", "--step-ms", "200")
    assert r.returncode == 0, r.stderr
    assert "verdict: not input-bound" in r.stdout
    r = tilefeed("bench", "diagnose", *common, "--loaders", "baseline", "--step-ms", "0.1")
    assert "verdict: input-bound" in r.stdout and "preprocess to tiles" in r.stdout


def test_every_bench_form_has_a_summary_and_every_option_help() -> None:
    import argparse

    from tilefeed.cli.arguments import RENAMED
    from tilefeed.cli.bench import FORMS, main_parser

    assert {"preprocess", "loader", "sweep", "diagnose", "soak", "aspect", "schedule", "recipe", "detection",
            "device-graph", "gpu-report", "cloud", "clients", "parts", "stats", "scale", "clip"} == set(FORMS)
    parsers = {"": main_parser()}
    for name, form in FORMS.items():
        assert form.name == name and form.summary.strip() and "\n" not in form.summary, name
        parsers[name] = form.parser()
    for name, parser in parsers.items():
        old = set(RENAMED.get(f"bench {name}".strip(), {}))  # the old spellings are hidden, by design
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction) and not old & set(action.option_strings):
                assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    listing = main_parser().format_help()
    wide = max(map(len, FORMS))
    assert all(f"  {name:<{wide}}  {form.summary}" in listing for name, form in FORMS.items()), listing


def test_bench_names_an_unknown_form_and_lists_the_forms() -> None:
    r = tilefeed("bench", "nonsense", "--count", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("tilefeed: error: unknown bench form 'nonsense'; the forms: preprocess, "
                                "loader, sweep, diagnose, soak, aspect, schedule, recipe, detection, "
                                "device-graph, gpu-report, cloud, clients, parts, stats, scale, clip")


def test_bench_rejects_unknown_loader(data: tuple[Path, Path]) -> None:
    images, store = data
    r = tilefeed("bench", "--images", str(images), "--store", str(store), "--loaders", "magic")
    assert r.returncode == 1 and "unknown loader 'magic'" in r.stderr


def test_other_outputs_are_tilefeed_alone_and_report_epoch_starts(tmp_path: Path,
                                                                  data: tuple[Path, Path]) -> None:
    images, store = data
    common = ["bench", "--images", str(images), "--store", str(store), "--batch-size", "8",
              "--steps", "6", "--warmup", "1", "--step-ms", "1", "--size", "24"]
    refused = tilefeed(*common, "--loaders", "baseline,tilefeed", "--output", "uint8")
    assert refused.returncode != 0 and "tilefeed's alone" in refused.stderr
    assert "Traceback" not in refused.stderr
    out = tmp_path / "u8.json"
    r = tilefeed(*common, "--loaders", "tilefeed", "--output", "uint8", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = json.loads(out.read_text())["runs"][0]
    assert run["output"]["dtype"] == "uint8" and run["output"]["shape"] == [24, 24, 3]
    # 24 samples in batches of 8: epochs begin at batches 0, 3 and 6; batch 0 is warm-up
    assert len(run["epoch_start_wait_ms"]) == 2 and run["handover_median_ms"] >= 0
    assert "epoch start ms" in r.stdout


def test_bench_stats_measures_its_cost_and_applies_its_advice(tmp_path: Path,
                                                             data: tuple[Path, Path]) -> None:
    images, store = data
    out = tmp_path / "stats.json"
    r = tilefeed("bench", "stats", "--images", str(images), "--store", str(store), "--batch-size",
                 "8", "--rounds", "2", "--step-ms", "1", "--steps", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert len(doc["overhead"]["on"]) == len(doc["overhead"]["off"]) == 2
    before = doc["advice"]["before"]
    assert before["workers"] == 1 and before["bottleneck"] in ("step", "read", "decode", "resize",
                                                               "download", "graph", "copy")
    assert "stats overhead" in r.stdout and "bottleneck:" in r.stdout


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    r = tilefeed("demo", "--count", "32", "--steps", "3", "--step-ms", "5", "--out-dir",
                 str(tmp_path / "demo"), env={"TILEFEED_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert "fair: every loader delivered" in r.stdout
    assert (tmp_path / "demo" / "bench.json").exists()
    assert (tmp_path / "demo" / "stall.png").exists()


def test_loader_bench_measures_every_loader_against_an_all_core_limit(data: tuple[Path, Path]) -> None:
    from tilefeed.bench.suites.loader import MEMCPY, UINT8_TILEFEED, bench_loaders

    images, store = data
    result = bench_loaders(images, store, batch_size=8, workers=1, rounds=1, min_seconds=0.2,
                           log=False)
    assert len(result.rates) == 6 and all(rate > 0 for rate in result.rates.values())
    assert result.rates[MEMCPY] > result.rates[UINT8_TILEFEED]  # nothing beats copying decoded tiles
    assert "the limit" in result.table() and "channels_last" in result.table()


FAKE_PEER = """
import json, sys
figures = ["raw, uint8", "raw, train float32 NCHW", "raw, train float32 channels_last",
           "jpeg, uint8", "jpeg, train float32 NCHW", "jpeg, train float32 channels_last"]
print(json.dumps({"ready": figures}), flush=True)
for n, line in enumerate(sys.stdin):
    if line.strip() != "round":
        break
    print(json.dumps({f: 100.0 + n for f in figures}), flush=True)
"""


def test_loader_bench_interleaves_a_peer_running_in_its_own_python(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    """The protocol with FFCV's side (bench/peers/ffcv.py), played by a stand-in Python."""
    import sys

    from tilefeed.bench.suites.loader import bench_loaders

    images, store = data
    jpeg_store = tmp_path / "jpeg"
    preprocess(images, jpeg_store, TileSettings(tile=32), StoreSettings(codec="jpeg", shard_size=8),
               workers=1)
    (tmp_path / "peer.py").write_text(FAKE_PEER)
    fake = tmp_path / "peer-python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'peer.py'}\n")
    fake.chmod(0o755)
    result = bench_loaders(images, store, batch_size=8, workers=1, rounds=3, min_seconds=0.1,
                           log=False, peer_python=str(fake), jpeg_store=jpeg_store)
    assert len(result.peer) == 6
    for theirs, ours, their_range, _ in result.peer.values():
        assert theirs == 101.0 and their_range == (100.0, 102.0) and ours > 0
    assert "tilefeed / FFCV" in result.table()


def test_the_peer_comparison_refuses_a_jpeg_store_of_other_pictures(
        tmp_path: Path, data: tuple[Path, Path]) -> None:
    from tilefeed.bench.suites.loader import bench_loaders

    images, store = data
    other = write_folder(tmp_path / "other", classes=2, per_class=12, size=(64, 48), seed=7)
    jpeg_store = tmp_path / "jpeg"
    preprocess(other, jpeg_store, TileSettings(tile=32), StoreSettings(codec="jpeg", shard_size=8),
               workers=1)
    with pytest.raises(ValueError, match="is not the picture of sample 0"):
        bench_loaders(images, store, batch_size=8, workers=1, rounds=1, min_seconds=0.1,
                      log=False, peer_python="python-never-started", jpeg_store=jpeg_store)


def test_bench_parts_measures_each_pair_on_the_store(tmp_path: Path, data: tuple[Path, Path]) -> None:
    _, store = data
    done = tilefeed("bench", "parts", "--store", str(store), "--batch-size", "8", "--workers", "1",
                    "--rounds", "1", "--out", str(tmp_path / "parts.json"))
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "parts.json").read_text())
    figures = {part: result[part] for part in ("batch_memory", "window_resize", "jpeg_decode",
                                               "epoch_starts")}
    assert all(len(f) >= 2 and all(v > 0 for v in f.values()) for f in figures.values()), figures
    assert "simplejpeg_fast_idct_img_per_s" in figures["jpeg_decode"]
    assert "window_resize: pillow_simd_us_per_tile_1_thread" in done.stdout


def test_a_tile_side_out_of_range_names_the_field_and_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^tile must be in 8\.\.8192 pixels \(--tile\), got 4$"):
        TileSettings(tile=4)
    r = tilefeed("preprocess", str(tmp_path / "images"), str(tmp_path / "out"), "--tile", "9000")
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == "tilefeed: error: tile must be in 8..8192 pixels (--tile), got 9000"


def test_doctor_runs_as_the_readme_and_the_makefile_give_it() -> None:
    """``python -m tilefeed.cli.doctor --pil`` (what ``make setup`` runs) and ``tilefeed doctor``."""
    pil = subprocess.run([sys.executable, "-m", "tilefeed.cli.doctor", "--pil", "--offline", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert pil.returncode == 0, pil.stdout + pil.stderr  # --offline: a PIL gap is a warning
    names = {c["name"] for c in json.loads(pil.stdout)["checks"]}
    assert {"PIL", "codec jpeg", "codec png"} <= names and "torch" not in names
    full = tilefeed("doctor", "--offline", "--json")
    assert full.returncode in (0, 1) and "Traceback" not in full.stderr, full.stderr  # 1: a gap here
    report = json.loads(full.stdout)
    assert {"PIL", "torch", "DALI", "zarr", "cores"} <= {c["name"] for c in report["checks"]}
    assert (full.returncode == 1) == (report["problems"] > 0)
