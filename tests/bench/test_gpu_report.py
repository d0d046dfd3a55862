"""The GPU report's shape and its resilience, dry-run on the CPU (the numbers need a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tilefeed.bench.gpu_report import gpu_report, report_table, junit_summary, write_report
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tests.helpers import run_cli, write_folder


def test_report_records_every_section_and_keeps_going_past_failures(tmp_path: Path) -> None:
    images = write_folder(tmp_path / "images", classes=2, per_class=8, size=(64, 48))
    store = tmp_path / "store"
    preprocess(images, store, TileSettings(tile=32), StoreSettings(codec="jpeg"), workers=1)
    report = gpu_report(images, store, device=torch.device("cpu"), batch_size=4, batches=3,
                        warmup=1, workers=1, size=24, model_batch=4, model_steps=2, model_width=8)
    decode = report["decode"]
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
    assert set(report["stall"]) == {"tilefeed", "baseline"}
    for name, run in report["stall"].items():  # both run on the CPU: neither may fail
        assert 0 <= run.get("stall_fraction", -1) <= 1, (name, run)
    write_report(report, tmp_path / "out" / "report.json")
    assert json.loads((tmp_path / "out" / "report.json").read_text())["size"] == 24
    assert "tilefeed nvJPEG tiles, eval" in report_table(report)


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
