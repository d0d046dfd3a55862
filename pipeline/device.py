"""The default training device, one rule for the Loader and the bench alike."""

from __future__ import annotations

import os

import torch


def default_device() -> torch.device:
    """``cuda:LOCAL_RANK`` (or the current CUDA device) when there is a GPU, else ``cpu``."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    return torch.device("cuda", int(local) if local is not None else torch.cuda.current_device())


def dali_device_id(device: torch.device) -> int | None:
    """DALI's ``device_id`` for ``device``: None for the CPU (DALI's CPU-only graph), the CUDA
    index otherwise, the current device for a bare ``"cuda"`` (as torch reads it)."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_device() if device.index is None else device.index
