"""What the tests share: image makers, comparisons, the CLI as users run it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop defaults
FAULT_ARGS = ["--tile", "32", "--shard-size", "50", "--processes", "2", "--quiet"]


@contextmanager
def s3_environment(cache: Path, buckets: tuple[str, ...] = ("tilefeed",)) -> Iterator[dict[str, str]]:
    """A local S3 server with ``buckets``, and this process's environment pointing at it (its
    endpoint, credentials and ``cache`` as the default shard cache) until the block ends."""
    from tilefeed.bench.fixtures.netem import CREDENTIALS, local_s3

    saved = dict(os.environ)
    with local_s3(buckets) as endpoint:
        env = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "TILEFEED_CACHE": str(cache)}
        os.environ.update(env)
        try:
            yield env
        finally:
            os.environ.clear()
            os.environ.update(saved)


def assert_plain(value: Any, where: str = "value") -> None:
    """``value`` is made of plain JSON types only, every string exactly a ``str``: no enum member
    (a StrEnum member prints as its string, but torch.save and pickle store its class)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r} is a {type(key).__name__}"
            assert_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (str, int, float, bool), \
            f"{where}: {value!r} is a {type(value).__name__}"


def run_cli(*args: str, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tilefeed ARGS`` in a new process, as a user runs it (``env`` added to the environment)."""
    return subprocess.run([sys.executable, "-m", "tilefeed", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def photo(seed: int, width: int, height: int) -> Image.Image:
    """A smooth random picture: JPEG-friendly, and different per seed."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    return Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BICUBIC)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def write_folder(root: Path, classes: int = 3, per_class: int = 5, size: tuple[int, int] = (96, 72),
                 seed: int = 0) -> Path:
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            photo(seed * 1000 + c * 100 + i, *size).save(d / f"{i:03d}.jpg", quality=92)
    return root


def caption_of(key: str, name: str = "caption") -> str:
    """What ``write_caption_table`` wrote as caption ``name`` of the picture ``key``: every
    ``synthetic`` of an odd picture is empty (a caption a sample lacks)."""
    if name == "synthetic" and int(key.split(".")[0]) % 2:
        return ""
    return f"{name} of picture {key} é"


def write_caption_table(root: Path, count: int = 24, size: tuple[int, int] = (40, 32), seed: int = 0) -> Path:
    """``count`` pictures and a caption table (TSV, open_clip's ``filepath`` column) beside them:
    captions ``caption`` and ``synthetic`` (``caption_of``), fields ``uid`` (text), ``score``
    (a number) and ``width`` (whole numbers). Returns the table."""
    root.mkdir(parents=True, exist_ok=True)
    lines = ["filepath\tcaption\tsynthetic\tuid\tscore\twidth"]
    for i in range(count):
        key = f"{i:03d}.jpg"
        photo(seed * 1000 + i, *size).save(root / key, quality=92)
        lines.append(f"{key}\t{caption_of(key)}\t{caption_of(key, 'synthetic')}\tu{i:04d}\t{i / 4}\t{40 + i}")
    table = root / "captions.tsv"
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return table


def make_pairs_store(root: Path, count: int = 24, shard_size: int = 8, codec: str = "lz4") -> Path:
    """An image-text store of ``write_caption_table``'s pictures: 32x32 tiles, captions
    ``caption`` and ``synthetic``, fields ``uid``, ``score`` and ``width``, no class labels."""
    from tilefeed.preprocess.sources.scanning import PairOptions

    table = write_caption_table(root / "src", count)
    out = root / f"pairs-{codec}"
    preprocess(table, out, TileSettings(tile=32, fit="crop"), StoreSettings(codec=codec, shard_size=shard_size),
               workers=1, pairs=PairOptions(source="table", caption_key=("caption", "synthetic"),
                                            fields=("uid", "score", "width")))
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def make_store(root: Path, codec: str, samples_per_class: int = 10, shard_size: int = 8) -> Path:
    """50 whole tiles (centre-square fit) of 32x32 from 48x40 pictures, 5 classes."""
    src = write_folder(root / "src", classes=5, per_class=samples_per_class, size=(48, 40))
    out = root / f"store-{codec}"
    preprocess(src, out, TileSettings(tile=32, fit="crop"),
               StoreSettings(codec=codec, shard_size=shard_size), workers=1)
    return out


# The device side of a test that holds the device's graph to the host path: the GPU's graph on
# DALI's CPU backend in every run ("device-shape"), and on CUDA itself where there is one.
DEVICE_SIDES = ["device-shape", "cuda"]


def device_sides() -> list[Any]:
    """``DEVICE_SIDES`` as pytest parameters, the CUDA one marked ``gpu``."""
    import pytest

    cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    return [pytest.param("device-shape"), pytest.param("cuda", marks=cuda)]


@contextmanager
def on_side(side: str) -> Iterator[str]:
    """The ``device=`` for Loaders built inside the block on ``side``: ``"host"`` (a CPU Loader
    in the host shape), ``"device-shape"`` (a CPU Loader in the device shape) or ``"cuda"``."""
    if side == "cuda":
        yield "cuda"
        return
    from tilefeed.pipeline.device import device_graph_set

    with device_graph_set(side == "device-shape"):
        yield "cpu"


class DelayedLoader:
    """Yields a batch every ``delay_ms``; ``leak_mb`` keeps that much new memory per batch."""

    def __init__(self, delay_ms: float, batches: int = 1000, leak_mb: int = 0, batch: int = 4):
        self.delay_ms, self.batches, self.leak_mb, self.batch = delay_ms, batches, leak_mb, batch
        self.kept: list[np.ndarray] = []

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.batches):
            time.sleep(self.delay_ms / 1000)
            if self.leak_mb:
                self.kept.append(np.ones(self.leak_mb * 2**20, dtype=np.uint8))  # touched pages
            yield torch.zeros(self.batch, 3, 8, 8), torch.zeros(self.batch, dtype=torch.int64)


def join_gloo(rank: int, world: int, port: int) -> None:
    """Join a CPU (gloo) process group on 127.0.0.1, as a torchrun rank would."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on, for a torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_until_killed(loader: Any, state_file: str) -> None:
    """A training process: 3 batches, a checkpoint, 2 more batches, then SIGKILL."""
    with loader:
        for n, _batch in enumerate(loader):
            if n == 2:
                Path(state_file).write_text(json.dumps(loader.state_dict()))
            if n == 4:
                os.kill(os.getpid(), signal.SIGKILL)


def killed_and_resumed(loader_of: Callable[[int, int, int], Any], child: str, ledger: Path,
                       state_file: Path) -> Any:
    """A job of two ranks at batch 4 (``loader_of(batch, rank, world)``, with ``ledger``): rank 1
    checkpoints after 3 batches here; rank 0 runs in a process of its own (``child``: code that
    calls ``train_until_killed`` with ``state_file``), checkpoints in lock-step and is killed two
    batches later. Three ranks at batch 5 then resume from the checkpoint and finish the epoch.
    Returns the ledger's audit of that epoch."""
    from tilefeed.pipeline.audit.ledger import audit

    with loader_of(4, 1, 2) as loader:
        for n, _ in enumerate(loader):
            if n == 2:
                loader.state_dict()
                break
    done = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).parents[1], timeout=120)
    assert done.returncode == -signal.SIGKILL
    state = json.loads(state_file.read_text())
    for rank in range(3):  # the restart: three ranks, another batch size
        with loader_of(5, rank, 3) as loader:
            loader.load_state_dict(state)
            list(loader)
    [epoch] = audit(ledger)
    return epoch
