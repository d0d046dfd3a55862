"""Preprocessing under faults: kills at random moments, a disk that fills up, mutated inputs."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilefeed.preprocess.tasks as tasks
import tilefeed.preprocess.worker_pool as worker_pool
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store import format as fmt
from tilefeed.store.documents import read_attrs
from tilefeed.preprocess.images import Rejected, load_tiles
from tilefeed.store.errors import StoreWriteError
from tests.helpers import FAULT_ARGS, tree_bytes
from tests.preprocess import corpus


def killed_and_resumed(src: Path, reference: Path, runs: Path, rng: random.Random, trials: int, kills: int,
                       parts: int) -> int:
    """``trials`` runs of ``tilefeed preprocess SRC`` into folders under ``runs``, each killed
    (SIGKILL to its process group) up to ``kills`` times at a random moment (after some of its
    ``parts`` parts, plus a few ms), then run to the end: each must hold the bytes of
    ``reference``. Returns how many kills landed mid-run."""
    command = [sys.executable, "-m", "tilefeed", "preprocess", str(src)]
    interrupted = 0
    for trial in range(trials):
        out = runs / f"run{trial}"
        for _kill in range(kills):
            proc = subprocess.Popen([*command, str(out), *FAULT_ARGS], start_new_session=True)
            after = rng.randrange(parts)
            while proc.poll() is None and len(list(out.glob(f"{fmt.WORK_DIR}/part-*.json"))) < after:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if read_attrs(out) is None:
                interrupted += 1
        done = subprocess.run([*command, str(out), *FAULT_ARGS], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert tree_bytes(out) == tree_bytes(reference), f"trial {trial} differs"
    return interrupted


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes_to_the_same_store(
        tmp_path: Path, source: tuple[Path, Path]) -> None:
    src, reference = source
    interrupted = killed_and_resumed(src, reference, tmp_path, random.Random(1234), trials=4, kills=3, parts=8)
    assert interrupted >= 4, f"only {interrupted} kills landed mid-run: the test proved little"


_REAL = {"write_part": tasks.write_part, "write_shard": tasks.write_shard}


@dataclass(frozen=True)
class _FullDiskOnThirdCall:
    """Stands in for a worker task; picklable, and counts calls in a file, across processes."""

    target: str
    counter: Path

    def __call__(self, *args: Any) -> Any:
        n = int(self.counter.read_text() or 0) + 1 if self.counter.exists() else 1
        self.counter.write_text(str(n))
        if n == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _REAL[self.target](*args)


@pytest.mark.parametrize("target", ["write_part", "write_shard"])
def test_disk_full_is_a_clear_error_and_the_store_resumes(
        tmp_path: Path, source: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        target: str) -> None:
    src, reference = source
    monkeypatch.setattr(tasks, target, _FullDiskOnThirdCall(target, tmp_path / "calls"))
    # the fault lives in this process's module, so the workers must be forked from it: after an
    # earlier test ran a bucket client here, the pool would use forkserver, whose workers import
    # the real tasks (this run touches no bucket, so forking is safe)
    monkeypatch.setattr(worker_pool, "client_started", lambda: False)
    out = tmp_path / "store"
    tiles, store = TileSettings(tile=32), StoreSettings(shard_size=50)
    with pytest.raises(StoreWriteError, match="No space left on device.*rerun the same command"):
        preprocess(src, out, tiles, store, workers=1)
    monkeypatch.setattr(tasks, target, _REAL[target])
    summary = preprocess(src, out, tiles, store, workers=1)
    assert summary.resumed_parts > 0
    assert tree_bytes(out) == tree_bytes(reference)


SEEDS = [sample.data for sample in corpus.build()]  # every format Pillow writes


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip":
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        else:
            data[pos : pos + draw(st.integers(1, 256))] = b"\0" * 16
        if not data:
            break
    return bytes(data)


@settings(max_examples=300, deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated())
def test_mutated_images_are_accepted_or_rejected_never_crash_or_hang(
        tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.img"
    path.write_bytes(data)
    for mode in ("resize", "grid"):
        try:
            tiles = load_tiles(str(path), TileSettings(tile=16, mode=mode, max_pixels=4_000_000))
        except Rejected as e:
            assert str(e) and "\n" not in str(e)
        else:
            assert tiles.pixels.dtype == np.uint8 and tiles.pixels.shape[1:] == (16, 16, 3)


@pytest.mark.parametrize("started", [False, True], ids=["fork", "forkserver"])
def test_workers_read_the_environment_the_pool_starts_in(monkeypatch: pytest.MonkeyPatch,
                                                         started: bool) -> None:
    """A bucket's endpoint or credentials set after an earlier run reach the next run's workers,
    whether they are forked from the driver or from a forkserver an earlier run started (which
    holds the environment of its own start)."""
    monkeypatch.setattr(worker_pool, "client_started", lambda: started)
    for value in ("first", "second"):  # the forkserver, if any, starts with the first
        monkeypatch.setenv("TILEFEED_TEST_SETTING", value)
        with worker_pool.Pool(1, None) as pool:
            assert pool.submit(os.getenv, "TILEFEED_TEST_SETTING").result(timeout=60) == value


def write_tar_shards(root: Path, shards: int, per_shard: int) -> Path:
    """img2dataset-shaped shards of 160x120 pictures: KEY.jpg, KEY.txt and KEY.json a sample."""
    import io
    import json
    import tarfile

    from tests.helpers import photo

    root.mkdir(parents=True)
    for s in range(shards):
        with tarfile.open(root / f"{s:05d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"{s:05d}{i:04d}"
                picture = io.BytesIO()
                photo(s * 1000 + i, 160, 120).save(picture, format="JPEG", quality=90)
                members = ((f"{key}.jpg", picture.getvalue()), (f"{key}.txt", f"picture {key}".encode()),
                           (f"{key}.json", json.dumps({"key": key, "width": 160}).encode()))
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root


@pytest.mark.slow
def test_sigkill_of_a_run_over_tar_shards_resumes_to_the_same_store(tmp_path: Path) -> None:
    """A run over WebDataset shards killed at random moments resumes to the bytes of a run never
    killed: members are read where the scan found them, and the captions' table is the same."""
    shards = write_tar_shards(tmp_path / "shards", shards=6, per_shard=80)
    reference = tmp_path / "reference"
    subprocess.run([sys.executable, "-m", "tilefeed", "preprocess", str(shards), str(reference), *FAULT_ARGS],
                   check=True, timeout=300)
    interrupted = killed_and_resumed(shards, reference, tmp_path, random.Random(99), trials=3, kills=2, parts=6)
    assert interrupted >= 2, f"only {interrupted} kills landed mid-run: the test proved little"
