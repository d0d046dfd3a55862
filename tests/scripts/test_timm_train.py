"""timm's ``train.py`` with its two ``create_loader`` calls swapped for a Loader built by
``timm_options``: with a ViT/DeiT recipe's flags in force (RandAugment, random erasing, mixup and
cutmix, random interpolation) it trains, evaluates and resumes; a refused flag stops it before
training."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts.conftest import image_set, run, swapped

FILES = ("train.py",)
# timm's ViT/DeiT recipe flags (its --color-jitter default, 0.4, is off under the policy, as timm has it)
RECIPE = ["--aa", "rand-m9-mstd0.5-inc1", "--reprob", "0.25", "--mixup", "0.8", "--cutmix", "1.0",
          "--train-interpolation", "random"]
COMMON = ["--model", "resnet10t", "--input-size", "3", "32", "32", "--num-classes", "3", "-b", "8",
          "--device", "cpu", "--workers", "1", "--interpolation", "bilinear", "--warmup-epochs", "0",
          "--sched", "cosine", "--lr", "0.01", "--log-interval", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_set(tmp_path_factory.mktemp("timm-data"), "validation")


@pytest.mark.slow
def test_swapped_timm_trains_evaluates_and_resumes(data: Path, tmp_path: Path) -> None:
    script = swapped("timm", FILES, tmp_path / "timm")
    out = tmp_path / "out"
    first = run(["train.py", "--data-dir", str(data), *COMMON, *RECIPE, "--epochs", "2", "--output", str(out),
                 "--experiment", "run"], script)
    assert first.returncode == 0, first.stderr[-3000:]
    log = first.stdout + first.stderr
    assert "Train: 0" in log and "Train: 1" in log and log.count("Test:") >= 2, log[-3000:]
    checkpoint = out / "run" / "last.pth.tar"
    assert checkpoint.is_file()
    resumed = run(["train.py", "--data-dir", str(data), *COMMON, *RECIPE, "--epochs", "3", "--output",
                   str(out), "--experiment", "resumed", "--resume", str(checkpoint)], script)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert "Train: 2" in log and "Train: 0" not in log and "Test:" in log, log[-3000:]


def test_a_refused_timm_flag_stops_the_script_before_training(data: Path, tmp_path: Path) -> None:
    script = swapped("timm", FILES, tmp_path / "timm")
    done = run(["train.py", "--data-dir", str(data), *COMMON, "--epochs", "1",
                "--output", str(tmp_path / "out"), "--gaussian-blur-prob", "0.1"], script)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("tilefeed.store.errors.ConfigError")]
    assert len(lines) == 1 and "--gaussian-blur-prob" in lines[0], done.stderr[-3000:]
    assert "Train: 0" not in done.stdout + done.stderr
