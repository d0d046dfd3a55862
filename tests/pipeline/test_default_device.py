"""The default device: ``cuda:LOCAL_RANK`` as torchrun users expect, one visible GPU a process
included, and a one-line refusal where the rank names no visible GPU."""

from __future__ import annotations

import pytest
import torch

from tilefeed.pipeline import device as device_module
from tilefeed.store.errors import ConfigError


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int, local_rank: str | None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)


@pytest.mark.parametrize("count,local_rank,want", [
    (0, "3", "cpu"),  # no GPU: the CPU, whatever the rank
    (4, None, "cuda:0"),  # no launcher: the current device
    (4, "3", "cuda:3"),  # torchrun on a node of four
    (1, "3", "cuda:0"),  # one GPU a process (CUDA_VISIBLE_DEVICES per rank): its own
])
def test_the_rank_picks_its_gpu(monkeypatch: pytest.MonkeyPatch, count: int, local_rank: str | None,
                                want: str) -> None:
    _gpus(monkeypatch, count, local_rank)
    assert device_module.default_device() == torch.device(want)


def test_a_rank_past_the_visible_gpus_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 2, "3")
    with pytest.raises(ConfigError, match="LOCAL_RANK=3 but this process sees 2 GPUs") as caught:
        device_module.default_device()
    assert "\n" not in str(caught.value)
