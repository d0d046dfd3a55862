"""Shared fixtures: every test makes its own images (the makers are in ``tests.helpers``)."""

from __future__ import annotations

import contextlib
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
def fresh_forkserver_per_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A forkserver keeps the environment it started with, and its children inherit that one:
    a module that points the environment at its own S3 server must not leave the next module's
    workers with it (or without the next one's). Stopped after each module, started on demand."""
    yield
    _stop_forkserver(request.module.__name__)


def _stop_forkserver(module: str, wait: float = 10.0) -> None:
    """``ForkServer._stop`` with a bound: the server exits once the last copy of its alive pipe
    closes, and a child forked from this process (a DataLoader worker a test left running)
    holds a copy, so ``_stop`` would wait on it for ever and every later module would fail on
    the half-stopped server. Past ``wait`` seconds the server is killed, and the module that
    leaked the child is named."""
    import signal
    import time
    import warnings
    from multiprocessing import forkserver, util

    server = forkserver._forkserver
    with server._lock:  # type: ignore[attr-defined]
        pid = server._forkserver_pid  # type: ignore[attr-defined]
        if pid is None:
            return
        os.close(server._forkserver_alive_fd)  # type: ignore[attr-defined]
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]
        deadline = time.monotonic() + wait
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                warnings.warn(f"{module}: a forked child outlived the module's tests and held the forkserver "
                              "open: the server was killed", stacklevel=1)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        server._forkserver_pid = None  # type: ignore[attr-defined]
        address = server._forkserver_address  # type: ignore[attr-defined]
        if address is not None and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)
        server._forkserver_address = None  # type: ignore[attr-defined]


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
