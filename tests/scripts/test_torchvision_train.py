"""torchvision's classification reference (``references/classification/train.py``) with its two
DataLoaders swapped for Loaders built by ``torchvision_options``: with its ResNet-50 recipe's flags
in force (TrivialAugmentWide, random erasing, mixup and cutmix, label smoothing) it trains,
evaluates and resumes; a refused flag stops it before training; every flag the table names is one
the script parses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.scripts.conftest import image_set, run, swapped
from tilefeed.pipeline.recipe.adapters import TORCHVISION_FLAGS, torchvision_options

FILES = ("train.py", "presets.py", "transforms.py", "sampler.py", "utils.py")
# 32 px crops of the 32 px tiles (resize 32: crop_pct 1, the tiles' own framing), few images
COMMON = ["--model", "resnet18", "-b", "8", "--device", "cpu", "-j", "1", "--lr", "0.01",
          "--train-crop-size", "32", "--val-crop-size", "32", "--val-resize-size", "32", "--print-freq", "1"]
# torchvision's current ResNet-50 recipe, as far as it shapes the input (and its label smoothing)
RECIPE = ["--auto-augment", "ta_wide", "--random-erase", "0.1", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0",
          "--label-smoothing", "0.1"]

# The script saves its argparse Namespace in every checkpoint and resumes with
# torch.load(..., weights_only=True), which torch >= 2.6 refuses for that class, with or without
# tilefeed; the resumed run allows the one class first, as a user of the unpatched script must.
RESUMING = ("import argparse, runpy, sys, torch; torch.serialization.add_safe_globals([argparse.Namespace]); "
            "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__')")

PARSER = ("import json, train; p = train.get_args_parser(); "
          "print(json.dumps({'flags': sorted(p._option_string_actions), 'defaults': vars(p.parse_args([]))}))")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # five classes: the script reports top-5 accuracy
    return image_set(tmp_path_factory.mktemp("torchvision-data"), "val", classes=5)


def test_swapped_torchvision_trains_evaluates_and_resumes(data: Path, tmp_path: Path) -> None:
    script = swapped("torchvision", FILES, tmp_path / "torchvision")
    out = tmp_path / "out"
    first = run(["train.py", "--data-path", str(data), *COMMON, *RECIPE, "--epochs", "2", "--output-dir",
                 str(out)], script)
    assert first.returncode == 0, first.stderr[-3000:]
    log = first.stdout + first.stderr
    assert "Epoch: [0]" in log and "Epoch: [1]" in log and log.count("Acc@1") >= 2, log[-3000:]
    checkpoint = out / "checkpoint.pth"
    assert checkpoint.is_file() and (out / "model_1.pth").is_file()
    resumed = run(["-c", RESUMING, "--data-path", str(data), *COMMON, *RECIPE, "--epochs", "3",
                   "--output-dir", str(out), "--resume", str(checkpoint)], script)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert "Epoch: [2]" in log and "Epoch: [0]" not in log and "Acc@1" in log, log[-3000:]
    assert (out / "model_2.pth").is_file()


def test_a_refused_torchvision_flag_stops_the_script_before_training(data: Path, tmp_path: Path) -> None:
    script = swapped("torchvision", FILES, tmp_path / "torchvision")
    done = run(["train.py", "--data-path", str(data), *COMMON, "--epochs", "1",
                "--output-dir", str(tmp_path / "out"), "--auto-augment", "augmix"], script)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("tilefeed.store.errors.ConfigError")]
    assert len(lines) == 1 and "--auto-augment" in lines[0], done.stderr[-3000:]
    assert "Epoch: [0]" not in done.stdout + done.stderr


def test_the_table_names_the_scripts_own_flags_and_its_defaults_pass(tmp_path: Path) -> None:
    """Read from the script itself: each flag a row names is one its parser has, and its
    defaults (bilinear, no augmentation policy, no erasing or mixing) are not refused."""
    script = swapped("torchvision", FILES, tmp_path / "torchvision")
    done = run(["-c", PARSER], script, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    named = {flag for row in TORCHVISION_FLAGS.values() for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*",
                                                                                row.flag)}
    assert named and named <= set(parsed["flags"]), sorted(named - set(parsed["flags"]))
    assert "--not-a-flag" not in parsed["flags"]  # the negative control: the parser's set is not everything
    import argparse

    defaults = argparse.Namespace(**parsed["defaults"], distributed=False)
    train, val = torchvision_options(defaults, train=True), torchvision_options(defaults, train=False)
    assert (train["size"], val["size"], val["crop_pct"]) == (224, 224, 224 / 256)
    assert train["batch_size"] == val["batch_size"] == 32 and train["num_workers"] == 16
