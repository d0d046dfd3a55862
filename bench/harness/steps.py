"""Training steps to time loaders against: an emulated accelerator step and a real model step."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn


class EmulatedStep:
    """A step of ``ms`` milliseconds that leaves the host CPU free: ``time.sleep`` on a CPU
    machine, ``torch.cuda._sleep`` (calibrated once) on a GPU, so the GPU is busy and the host
    is not blocked."""

    def __init__(self, ms: float, device: torch.device) -> None:
        if ms < 0:
            raise ValueError(f"--step-ms must be >= 0, got {ms}")
        self.ms = ms
        self.device = device
        self._cycles = self._calibrate() if device.type == "cuda" and ms > 0 else 0

    def _calibrate(self) -> int:
        probe = 10_000_000
        torch.cuda._sleep(probe)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        return int(probe * self.ms / start.elapsed_time(end))

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if self.ms <= 0:
            return
        if self._cycles:
            torch.cuda._sleep(self._cycles)
        else:
            time.sleep(self.ms / 1000.0)

    def describe(self) -> str:
        return f"emulated {self.ms:g} ms step ({'cuda sleep' if self._cycles else 'host sleep'})"


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def resnet(width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2), classes: int = 1000) -> nn.Module:
    """ResNet-18 at the defaults; ``width`` and ``blocks`` shrink it for CPU runs."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, count in enumerate(blocks):
        cout = width * 2**stage
        for b in range(count):
            layers.append(BasicBlock(cin, cout, 2 if b == 0 and stage > 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


LEVERS: Final = {
    "params": "a smaller model, or shard parameters (FSDP / ZeRO-3)",
    "grads": "shard gradients (ZeRO-2) or accumulate in lower precision",
    "optimizer": "shard optimizer state (ZeRO-1) or use an 8-bit optimizer",
    "activations": "a smaller micro-batch (more accumulation steps) or activation checkpointing",
}


@dataclass
class MemoryBreakdown:
    params_mb: float = 0.0
    grads_mb: float = 0.0
    optimizer_mb: float = 0.0
    activations_mb: float = 0.0  # peak bytes saved for backward, one micro-batch

    @property
    def dominant(self) -> str:
        terms = {"params": self.params_mb, "grads": self.grads_mb,
                 "optimizer": self.optimizer_mb, "activations": self.activations_mb}
        return max(terms, key=terms.__getitem__)

    def summary(self) -> str:
        d = self.dominant
        return (f"memory: params {self.params_mb:.0f} MB, grads {self.grads_mb:.0f} MB, optimizer "
                f"{self.optimizer_mb:.0f} MB, activations {self.activations_mb:.0f} MB (peak, per "
                f"micro-batch); dominant: {d} -> {LEVERS[d]}")

    def as_dict(self) -> dict[str, Any]:
        return {"params_mb": self.params_mb, "grads_mb": self.grads_mb,
                "optimizer_mb": self.optimizer_mb, "activations_mb": self.activations_mb,
                "dominant": self.dominant, "lever": LEVERS[self.dominant]}


def _mb(tensors: Any) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


class ModelStep:
    """Forward, backward and an optimizer step of a ResNet-style network.

    On a GPU: bf16 autocast with float32 master weights, channels_last. ``accumulate`` splits
    each batch into micro-batches whose losses are divided by their number; gradients are
    clipped once, after the last backward. Nothing here synchronises the device.
    """

    def __init__(self, device: torch.device, *, classes: int = 1000, width: int = 64,
                 blocks: tuple[int, ...] = (2, 2, 2, 2), accumulate: int = 1,
                 clip: float | None = 1.0, optimizer: str = "sgd", lr: float = 0.1) -> None:
        if accumulate < 1:
            raise ValueError(f"accumulate must be >= 1, got {accumulate}")
        self.device, self.accumulate, self.clip = device, accumulate, clip
        self.cuda = device.type == "cuda"
        self.model = resnet(width, blocks, classes).to(device)
        if self.cuda:
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        params = self.model.parameters()
        if optimizer == "sgd":
            self.opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
        elif optimizer == "adamw":
            self.opt = torch.optim.AdamW(params, lr=lr)
        else:
            raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}")
        self.loss_fn = nn.CrossEntropyLoss()
        self.memory = MemoryBreakdown()
        self._saved = 0
        self.optimizer_name = optimizer

    def describe(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        amp = "bf16 autocast, fp32 master weights" if self.cuda else "fp32"
        return (f"ResNet-style model step ({n / 1e6:.1f} M params, {self.optimizer_name}, {amp}, "
                f"accumulate {self.accumulate})")

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._saved += t.numel() * t.element_size()
        return t

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        x = images
        if x.dtype == torch.uint8:
            x = x.float()
        if x.shape[1] != 3 and x.shape[-1] == 3:  # NHWC -> NCHW view
            x = x.permute(0, 3, 1, 2)
        if self.cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        peak = 0
        for micro_x, micro_y in zip(x.chunk(self.accumulate), labels.chunk(self.accumulate), strict=True):
            self._saved = 0
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
                    loss = self.loss_fn(self.model(micro_x), micro_y) / self.accumulate
            peak = max(peak, self._saved)
            loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)  # keep grads allocated so they can be measured
        self.memory.activations_mb = max(self.memory.activations_mb, peak / 2**20)
        if self.memory.params_mb:
            return
        self.memory.params_mb = _mb(self.model.parameters())
        self.memory.grads_mb = _mb(p.grad for p in self.model.parameters() if p.grad is not None)
        self.memory.optimizer_mb = _mb(t for s in self.opt.state.values() for t in s.values()
                                       if isinstance(t, torch.Tensor))
