from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tilefeed.pipeline.settings as loader_module
from tests.helpers import make_store


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50 tiles of 32x32, lz4, 8 tiles per shard (7 shards, the last partial)."""
    return make_store(tmp_path_factory.mktemp("lz4"), "lz4")


@pytest.fixture(scope="session")
def jpeg_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("jpeg"), "jpeg")


@pytest.fixture(autouse=True)
def cpu_unless_marked_gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tests check the CPU path even on a GPU machine; `gpu` tests keep the CUDA default."""
    if "gpu" not in request.keywords:
        monkeypatch.setattr(loader_module, "default_device", lambda: torch.device("cpu"))
