"""Shared fixtures: every test makes its own images (the makers are in ``tests.helpers``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import photo, write_folder

# fixtures shared across rooms (``pad_store``, ``train_sheet``: the contact sheet's library and command)
pytest_plugins = ["tests.sheet_stores"]


def pytest_configure(config: pytest.Config) -> None:
    """The cache every store open uses (its check records, bucket copies) is the session's own,
    never the developer's: set before any test, so worker processes inherit it too."""
    import tempfile

    os.environ["TILEFEED_CACHE"] = tempfile.mkdtemp(prefix="tilefeed-tests-cache-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def fresh_forkserver_per_module() -> Iterator[None]:
    """A forkserver keeps the environment it started with, and its children inherit that one:
    a module that points the environment at its own S3 server must not leave the next module's
    workers with it (or without the next one's). Stopped after each module, started on demand."""
    yield
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


@pytest.fixture(params=["host", "device"])
def shape(request: pytest.FixtureRequest) -> Iterator[str]:
    """The graph shape of the CPU Loaders a test builds, each test run in both: ``"host"`` (the
    reader threads cut, resize and apply the recipe with PIL) and ``"device"`` (the GPU's graph
    on DALI's CPU backend, ``TILEFEED_DEVICE_GRAPH=1``)."""
    from tilefeed.pipeline.device import device_graph_set

    with device_graph_set(request.param == "device"):
        yield str(request.param)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_folder(tmp_path / "src")


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    """A class tree with one good image and one of every kind of bad input."""
    root = write_folder(tmp_path / "src", classes=2, per_class=2)
    bad = root / "c1"
    (bad / "zero.jpg").write_bytes(b"")
    good = (root / "c0" / "000.jpg").read_bytes()
    (bad / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (bad / "text.jpg").write_text("not an image at all")
    photo(3, 64, 64).save(bad / "garbled.png")
    png = bytearray((bad / "garbled.png").read_bytes())
    png[len(png) // 2 : len(png) // 2 + 16] = os.urandom(16)  # breaks the IDAT crc / zlib stream
    (bad / "garbled.png").write_bytes(bytes(png))
    photo(7, 400, 300).save(bad / "huge.png")  # over the --max-pixels the tests set
    return root
