"""open_clip's trainer (``open_clip_train`` 3.3.0, as the open_clip_torch wheel installs it) with
``--dataset-type tilefeed``: a Loader built by ``open_clip_options`` feeds it image-text batches. A
small CLIP (two-layer towers at 32 px, declared in a ``local-dir:`` model folder) trains two epochs
on the CPU and evaluates after each; a run stopped mid-epoch resumes with the same samples, tokens
and losses as the uninterrupted run; two processes (gloo) split each epoch between them, and one
process resumes their stopped epoch with the rest of its samples; a refused flag stops it before
training."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_pairs_store
from tests.scripts.conftest import HERE, SRC, run

# what open_clip_train's data.py and main.py import beside open_clip itself
NEEDED = ("open_clip", "open_clip_train", "webdataset", "braceexpand", "pandas", "ftfy")
MODEL = {"model_cfg": {"embed_dim": 32,
                       "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8},
                       "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2,
                                    "layers": 2}},
         "preprocess_cfg": {"interpolation": "bicubic", "resize_mode": "shortest"}}
BATCH = re.compile(r"batch (\d+:\d+) ids (\[.*?\]) tokens (\[.*?\])")
LOSS = re.compile(r"Train Epoch: (\d+) \[\s*(\d+)/\d+.*Contrastive_loss: ([0-9.]+)")


def swapped_open_clip(into: Path, *patches: str) -> Path:
    """A copy of the installed ``open_clip_train`` package under ``into`` with ``swap.patch`` (and
    ``patches``) applied; run from ``into``, ``python -m open_clip_train.main`` imports the copy.
    Skips, naming them, where open_clip_torch or what its trainer imports is not installed."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install open_clip_torch==3.3.0 "
                    "webdataset==0.2.86 pandas (the dev extra)")
    spec = importlib.util.find_spec("open_clip_train")
    assert spec is not None and spec.origin is not None
    package = into / "open_clip_train"
    shutil.copytree(Path(spec.origin).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("swap.patch", *patches):
        subprocess.run(["patch", "-p1", "--quiet", "-i", str(HERE / "open_clip" / name)], cwd=package,
                       check=True)
    return into


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two image-text stores (24 and 8 pairs, captions ``caption`` and ``synthetic``) and a tiny
    model folder."""
    root = tmp_path_factory.mktemp("open-clip-data")
    make_pairs_store(root / "a", 24)
    make_pairs_store(root / "b", 8)
    (root / "model").mkdir()
    (root / "model" / "open_clip_config.json").write_text(json.dumps(MODEL))
    return root


def command(data: Path, logs: Path, name: str, *extra: str, epochs: int = 2) -> list[str]:
    return ["-m", "open_clip_train.main", "--model", f"local-dir:{data / 'model'}",
            "--dataset-type", "tilefeed", "--val-data", str(data / "a" / "pairs-lz4"), "--batch-size", "4",
            "--epochs", str(epochs),
            "--workers", "1", "--device", "cpu", "--precision", "fp32", "--report-to", "none", "--seed", "3",
            "--warmup", "2", "--log-every-n-steps", "1", "--logs", str(logs), "--name", name, *extra]


def mixed(data: Path) -> list[str]:
    """open_clip's mixing flags: two stores, the second upsampled, drawn with replacement."""
    return ["--train-data", f"{data / 'a' / 'pairs-lz4'}::{data / 'b' / 'pairs-lz4'}",
            "--train-data-upsampling-factors", "1::2", "--dataset-resampled", "--train-num-samples", "24"]


def batches(log: str) -> dict[str, tuple[str, str]]:
    """Each logged training batch (``epoch:batch``): its sample ids and its rows' token checksums."""
    return {key: (ids, tokens) for key, ids, tokens in BATCH.findall(log)}


def losses(log: str) -> dict[tuple[str, str], str]:
    """Each logged step's own contrastive loss (not the running mean), by (epoch, samples seen)."""
    return {(epoch, seen): loss for epoch, seen, loss in LOSS.findall(log)}


def evaluations(log: str) -> list[str]:
    return [line.split("| INFO | ", 1)[1] for line in log.splitlines()
            if "Eval Epoch:" in line and "R@1" in line]


@pytest.mark.slow
def test_swapped_open_clip_trains_evaluates_and_resumes_mid_epoch(data: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = swapped_open_clip(tmp_path / "open_clip")
    logs = tmp_path / "logs"
    monkeypatch.setenv("TILEFEED_LOG_BATCHES", "1")
    whole = run(command(data, logs, "whole", *mixed(data)), script)
    assert whole.returncode == 0, whole.stderr[-3000:]
    log = whole.stdout + whole.stderr
    assert "Start epoch 0" in log and "Start epoch 1" in log, log[-3000:]
    assert len(evaluations(log)) == 2 and "num_samples: 24.0000" in evaluations(log)[-1], log[-3000:]
    seen = batches(log)
    assert len(seen) == 12, sorted(seen)  # 24 samples an epoch, batches of 4, two epochs
    ids = epoch_ids(log, 0)
    assert len(ids) == 24 and max(ids) >= 24  # the Mix's ids: store b's samples come after a's 24
    import torch

    checkpoint = torch.load(logs / "whole" / "checkpoints" / "epoch_2.pt", map_location="cpu",
                            weights_only=True)
    assert checkpoint["epoch"] == 2 and "loader" in checkpoint

    monkeypatch.setenv("TILEFEED_STOP_AT", "0:2")  # stopped after the third batch of epoch 0
    stopped = run(command(data, logs, "stopped", *mixed(data)), script)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    monkeypatch.delenv("TILEFEED_STOP_AT")
    latest = logs / "stopped" / "checkpoints" / "epoch_latest.pt"
    resumed = run(command(data, logs, "resumed", *mixed(data), "--resume", str(latest)), script)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = stopped.stdout + stopped.stderr, resumed.stdout + resumed.stderr
    assert sorted(batches(first)) == ["0:0", "0:1", "0:2"] and "0:0" not in batches(second), second[-3000:]
    assert {**batches(first), **batches(second)} == seen  # the same samples, captions and tokens
    assert {**losses(first), **losses(second)} == losses(log)  # the same model steps
    assert evaluations(second) == evaluations(log)

    again = run(command(data, logs, "epoch2", *mixed(data), "--resume", str(logs / "whole" / "checkpoints" /
                                                                               "epoch_2.pt"), epochs=3), script)
    assert again.returncode == 0, again.stderr[-3000:]
    log = again.stdout + again.stderr
    assert "Start epoch 2" in log and "Start epoch 0" not in log and "Start epoch 1" not in log, log[-3000:]
    assert sorted(batches(log)) == [f"2:{i}" for i in range(6)]


def test_a_refused_open_clip_flag_stops_the_script_before_training(data: Path, tmp_path: Path) -> None:
    script = swapped_open_clip(tmp_path / "open_clip")
    done = run(command(data, tmp_path / "logs", "refused", "--train-data", str(data / "a" / "pairs-lz4"),
                       "--aug-cfg", "use_timm=True"), script)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("tilefeed.store.errors.ConfigError")]
    assert len(lines) == 1 and "use_timm" in lines[0], done.stderr[-3000:]
    assert "Train Epoch" not in done.stdout + done.stderr


def launch(script: Path, args: list[str], **env: str) -> list[str]:
    """``args`` run by two processes through open_clip's own distributed start (env://, gloo on the
    CPU); their logs once both ended well."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
                   "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TILEFEED_LOG_BATCHES": "1",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                   "RANK": str(rank), "LOCAL_RANK": str(rank), **env}
        procs.append(subprocess.Popen([sys.executable, *args], cwd=script, env=environ, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log[-3000:]
    return logs


def epoch_ids(log: str, epoch: int) -> list[int]:
    """The sample ids of ``epoch``'s logged batches, in order."""
    return [int(i) for key, (ids, _) in batches(log).items() if key.startswith(f"{epoch}:")
            for i in json.loads(ids)]


@pytest.mark.slow
def test_two_gloo_processes_split_each_epoch_and_one_resumes_them(data: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes each train half of every epoch; stopped after their first batch of epoch 0,
    the run resumes in one process with exactly the samples neither had trained on. open_clip's
    DDP wrap passes ``device_ids``, which torch refuses for a CPU model: cpu_ddp.patch leaves them
    out."""
    script = swapped_open_clip(tmp_path / "open_clip", "cpu_ddp.patch")
    logs = tmp_path / "logs"
    train = ["--train-data", str(data / "a" / "pairs-lz4")]
    ranks = launch(script, command(data, logs, "ddp", *train))
    for epoch in (0, 1):
        shares = [epoch_ids(log, epoch) for log in ranks]
        assert [len(share) for share in shares] == [12, 12], shares  # three batches of 4 each
        assert sorted(shares[0] + shares[1]) == list(range(24))  # every sample once over both ranks
    assert len(evaluations(ranks[0])) == 2 and "num_samples: 24.0000" in evaluations(ranks[0])[-1]
    assert not evaluations(ranks[1])  # open_clip evaluates on its master alone, the whole store

    stopped = launch(script, command(data, logs, "ddp-stopped", *train), TILEFEED_STOP_AT="0:0")
    handed = [epoch_ids(log, 0) for log in stopped]
    assert [len(share) for share in handed] == [4, 4], handed
    monkeypatch.setenv("TILEFEED_LOG_BATCHES", "1")
    latest = logs / "ddp-stopped" / "checkpoints" / "epoch_latest.pt"
    alone = run(command(data, logs, "ddp-alone", *train, "--resume", str(latest)), script)
    assert alone.returncode == 0, alone.stderr[-3000:]
    rest = alone.stdout + alone.stderr
    assert sorted(key for key in batches(rest) if key.startswith("0:")) == ["0:2", "0:3", "0:4", "0:5"]
    assert sorted(handed[0] + handed[1] + epoch_ids(rest, 0)) == list(range(24))  # once over both launches
    assert sorted(epoch_ids(rest, 1)) == list(range(24))


def test_every_flag_the_table_names_is_one_open_clip_has() -> None:
    """Each ``--flag`` of OPEN_CLIP_FLAGS is in open_clip_train 3.3.0's params.py, but the choice the
    swap adds and the flags of later open_clip versions, which the table marks so."""
    from tilefeed.pipeline.recipe.open_clip_adapter import OPEN_CLIP_FLAGS

    spec = importlib.util.find_spec("open_clip_train")
    if spec is None or spec.origin is None:
        pytest.skip("open_clip_train not installed: pip install open_clip_torch==3.3.0 (the dev extra)")
    params = (Path(spec.origin).parent / "params.py").read_text()
    later = {"--json-text-key", "--json-text-key-probs", "--image-key", "--text-key", "--max-image-pixels"}
    for row in OPEN_CLIP_FLAGS.values():
        for flag in re.findall(r"--[a-z][a-z0-9-]*", row.flag):
            if flag in later:
                assert "absent in 3.3.0" in row.meaning, row.flag
            else:
                assert f'"{flag}"' in params or f"'{flag}'" in params, flag
