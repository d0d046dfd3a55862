"""The GPU report's shape and its resilience, dry-run on the CPU (the numbers need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tilefeed.bench.suites.decoder_probe import SPEED_RULE, DecodeRun, EngineUse, JpegEngineSampler, verdict
from tilefeed.bench.suites.gpu_report import gpu_report, report_table, junit_summary, write_report
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import run_cli, write_folder


def test_report_records_every_section_and_keeps_going_past_failures(tmp_path: Path) -> None:
    images = write_folder(tmp_path / "images", classes=2, per_class=8, size=(64, 48))
    stores = {}
    for tile in (32, 40):
        stores[tile] = tmp_path / f"store-{tile}"
        preprocess(images, stores[tile], TileSettings(tile=tile), StoreSettings(codec="jpeg"), workers=1)
    report = gpu_report(images, stores, device=torch.device("cpu"), batch_size=4, batches=3,
                        warmup=1, workers=1, size=24, model_batch=4, model_steps=2, model_width=8)
    assert report.tiles == [32, 40] and set(report.decode) == set(report.decoder) == {"32", "40"}
    for tile in ("32", "40"):
        decode = report.decode[tile]
        assert set(decode) == {"tilefeed nvJPEG tiles, train", "tilefeed nvJPEG tiles, eval",
                               "dali-files (source JPEGs, DALI on the GPU)",
                               "torchvision decode_jpeg on the GPU"}
        for name in ("tilefeed nvJPEG tiles, train", "tilefeed nvJPEG tiles, eval"):
            assert decode[name]["images_per_s"] > 0 and decode[name]["memory_bounded"], decode[name]
        hand = decode["torchvision decode_jpeg on the GPU"]
        try:
            import torchvision.io  # noqa: F401
        except Exception:  # noqa: BLE001 - the machine has no usable torchvision: a note, not a failure
            assert hand["skipped"].startswith("torchvision does not load"), hand
        else:  # it loads: measured, or its failure recorded (no CUDA decode on the CPU)
            assert "images_per_s" in hand or "error" in hand, hand
        probe = report.decoder[tile]  # on the host: one run whole, one as a window, both measured
        assert probe["tile"] == int(tile) and probe["backend"] == "host", probe
        assert [(r["region"], r["hw_decoder_load"]) for r in probe["runs"]] == [(False, None), (True, None)]
        assert all(r["images_per_s"] > 0 and not r["error"] for r in probe["runs"]), probe
    assert list(report.stall) == ["synthetic", "tilefeed", "baseline"]
    for name, run in report.stall.items():  # all run on the CPU: none may fail
        assert 0 <= run.get("stall_fraction", -1) <= 1, (name, run)
        assert run["first_batch_ms"] > 0 and run["handover_median_ms"] >= 0 and run["build_s"] >= 0, run
    share = report.against_synthetic
    rates = {name: run["images_per_s"] for name, run in report.stall.items()}
    assert share["share"] == rates["tilefeed"] / rates["synthetic"]
    assert share["goal"] == 0.98 and share["met"] == (share["share"] >= 0.98)
    assert report.model.startswith(("torchvision resnet50", "ResNet-style"))
    write_report(report, tmp_path / "out" / "report.json")
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["size"] == 24 and saved["tiles"] == [32, 40]
    table = report_table(saved)  # the committed JSON renders the same table as the live report
    assert table == report.table()
    for line in ("32 px JPEG tiles:", "40 px JPEG tiles:", "tilefeed nvJPEG tiles, eval",
                 "which decoder ran, 32 px tiles: whole tiles: libjpeg-turbo on the host",
                 "| synthetic |", "of synthetic data's img/s"):
        assert line in table, line


def _run(region: bool, load: float, rate: float, engine: EngineUse | None = None) -> DecodeRun:
    return DecodeRun(region=region, hw_decoder_load=load, images_per_s=rate,
                     engine=engine or EngineUse(available=False, note="no pynvml"))


def test_the_decoder_verdict_reads_nvml_first_then_the_speed() -> None:
    busy, idle = EngineUse(available=True, peak_percent=87.0), EngineUse(available=True)
    seen = verdict([_run(False, 0.0, 100), _run(False, 1.0, 100, busy)], gpu=True, region=False)
    assert seen[0] == "hardware" and "87% busy" in seen[1]
    # NVML saw the engine idle: CUDA, even when load 1 happened to be faster
    assert verdict([_run(False, 0.0, 100), _run(False, 1.0, 300, idle)], gpu=True, region=False)[0] == "cuda"
    # no NVML: the speed decides, at the stated rule
    fast = verdict([_run(False, 0.0, 100), _run(False, 1.0, 100 * SPEED_RULE)], gpu=True, region=False)
    slow = verdict([_run(False, 0.0, 100), _run(False, 1.0, 100 * SPEED_RULE - 1)], gpu=True, region=False)
    assert fast[0] == "hardware" and "inferred" in fast[1] and "no pynvml" in fast[1]
    assert slow[0] == "cuda" and "inferred" in slow[1]
    # the windows are judged apart from the whole tiles
    runs = [_run(False, 0.0, 100), _run(False, 1.0, 300), _run(True, 0.0, 100), _run(True, 1.0, 100)]
    assert verdict(runs, gpu=True, region=False)[0] == "hardware"
    assert verdict(runs, gpu=True, region=True)[0] == "cuda"
    failed = _run(False, 1.0, 0)
    failed.error = "RuntimeError: boom"
    assert verdict([_run(False, 0.0, 100), failed], gpu=True, region=False)[0] == "unknown"
    assert verdict([], gpu=False, region=False)[0] == "host"


def test_the_engine_sampler_is_a_note_without_a_device_or_nvml() -> None:
    with JpegEngineSampler(None) as s:
        pass
    assert s.use == EngineUse(available=False, note="no CUDA device")
    with JpegEngineSampler(0) as s:  # no GPU here: NVML is missing or finds no device; never raises
        pass
    assert not s.use.available and s.use.note


def test_the_tile_sides_option_refuses_nonsense_in_one_line() -> None:
    r = run_cli("bench", "gpu-report", "--tiles", "224,big")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "--tiles" in r.stderr, r.stderr


def test_junit_summary_of_the_gpu_tests(tmp_path: Path) -> None:
    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="boom&#10;more"/></testcase>'
                   '<testcase classname="a" name="s"><skipped/></testcase></testsuite></testsuites>')
    assert junit_summary(xml) == {"passed": 1, "skipped": 1,
                                 "failed": [{"test": "a::bad", "message": "boom"}]}


def test_the_command_refuses_without_cuda_in_one_line() -> None:
    r = run_cli("bench", "gpu-report", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "needs a CUDA device" in r.stderr
