"""The default training device, one rule for the Loader and the bench alike; the switch that
builds the GPU's graph on a CPU machine; and the DALI extra a torch build takes. torch loads
inside the functions that need it, so ``tilefeed doctor`` reads the rules without it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tilefeed.store.errors import ConfigError

if TYPE_CHECKING:
    import torch

# Set to 1, a CPU Loader builds the graph a GPU Loader builds (decode, cut, resize, recipe and
# paste in DALI, on its CPU backend) rather than cutting and resizing in its reader threads:
# the way to run and test the device's graph without a GPU (docs/development.md).
DEVICE_GRAPH_ENV = "TILEFEED_DEVICE_GRAPH"


def device_graph() -> bool:
    """Whether ``TILEFEED_DEVICE_GRAPH`` asks CPU Loaders for the device's graph shape (read
    when a Loader is built)."""
    value = os.environ.get(DEVICE_GRAPH_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{DEVICE_GRAPH_ENV}={value!r}: expected 1 (the device's graph on the CPU) or 0")


@contextmanager
def device_graph_set(on: bool = True) -> Iterator[None]:
    """CPU Loaders built inside the block take the GPU's graph shape (``on``) or the host shape,
    whatever ``TILEFEED_DEVICE_GRAPH`` said before it (restored after)."""
    saved = os.environ.get(DEVICE_GRAPH_ENV)
    os.environ[DEVICE_GRAPH_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(DEVICE_GRAPH_ENV, None)
        else:
            os.environ[DEVICE_GRAPH_ENV] = saved


def dali_extra(cuda: str | None) -> str:
    """tilefeed's DALI extra for a torch built for CUDA ``cuda`` (``torch.version.cuda``): its
    major version's (``cuda12``, ``cuda13``); ``cuda13`` for a CPU build, as both DALI builds run
    without a GPU. The one rule the README, the install page, doctor and the Loader's error state."""
    return f"cuda{cuda.split('.')[0]}" if cuda else "cuda13"


def default_device() -> torch.device:
    """``cuda:LOCAL_RANK`` (or the current CUDA device) when there is a GPU, else ``cpu``.

    A launcher that gives each process one GPU of its own (``CUDA_VISIBLE_DEVICES`` set per
    process, so every process sees a single device) leaves ``LOCAL_RANK`` past the visible
    count: the process's one GPU, ``cuda:0``, is then its device, as torchrun users expect.
    A ``LOCAL_RANK`` past several visible GPUs is refused.
    """
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return torch.device("cuda", torch.cuda.current_device())
    index, count = int(local), torch.cuda.device_count()
    if index < count:
        return torch.device("cuda", index)
    if count == 1:
        return torch.device("cuda", 0)
    raise ConfigError(f"LOCAL_RANK={index} but this process sees {count} GPUs (cuda:0..{count - 1}): "
                      "give each process one GPU (CUDA_VISIBLE_DEVICES) or all of them, or pass device=")


def dali_device_id(device: torch.device) -> int | None:
    """DALI's ``device_id`` for ``device``: None for the CPU (DALI's CPU-only graph), the CUDA
    index otherwise, the current device for a bare ``"cuda"`` (as torch reads it)."""
    import torch

    if device.type != "cuda":
        return None
    return torch.cuda.current_device() if device.index is None else device.index
