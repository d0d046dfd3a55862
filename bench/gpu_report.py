"""``tilefeed bench gpu-report``: the comparison a GPU user would make, as one JSON report.

* ``decode``: images/s of the same pictures decoded and augmented on the device, batch B:
  tilefeed over JPEG tiles (nvJPEG through DALI's ``mixed`` decoder; train and eval), DALI's
  own file reader decoding the source JPEGs on the GPU (``dali-files``), and a DataLoader that
  reads the files and decodes them with ``torchvision.io.decode_jpeg(device="cuda")`` (what a
  GPU user writes by hand; skipped with a note where torchvision does not load). Each with its
  peak device memory (torch's allocator, and the whole device as ``cudaMemGetInfo`` sees it, so
  DALI's own pools count) and whether device memory grows over the run after warm-up.
* ``stall``: a bf16 ResNet-50 training step (torchvision's, or the bench's ResNet-style network
  with ResNet-50's stage depths where torchvision is absent) at batch 256, fed by tilefeed and by
  the PIL DataLoader: the stall each leaves.

Any loader or step that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

GROWTH_LIMIT_MB = 64.0  # device memory that may still grow after warm-up: allocator noise


def _device_used_mb(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**20


def _throughput(loader: Iterable[Any], batches: int, warmup: int, device: torch.device) -> dict[str, Any]:
    """img/s over ``batches`` batches after ``warmup``, peak memory, and growth after warm-up."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    used: list[float] = []
    seen, start = 0, 0.0
    it = iter(_forever(loader))
    for k in range(warmup + batches):
        if k == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        images = next(it)[0]
        if k >= warmup:
            seen += len(images)
            used.append(_device_used_mb(device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    growth = float(np.polyfit(np.arange(len(used)), used, 1)[0] * len(used)) if len(used) > 2 else 0.0
    return {
        "images_per_s": seen / elapsed,
        "torch_peak_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "device_used_peak_mb": max(used) if used else None,
        "device_growth_mb": growth,
        "memory_bounded": growth < GROWTH_LIMIT_MB,
    }


def _forever(loader: Iterable[Any]) -> Iterable[Any]:
    while True:
        yield from loader


def _guarded(entries: dict[str, Any], name: str, run: Callable[[], dict[str, Any]]) -> None:
    try:
        entries[name] = run()
    except Exception as e:  # noqa: BLE001 - one failing loader must not stop the report
        entries[name] = {"error": f"{type(e).__name__}: {e}"}


class TorchvisionGpuDecode:
    """A DataLoader reads the JPEG bytes; the main process decodes the batch on the GPU with
    ``torchvision.io.decode_jpeg`` and resizes it there: the hand-written GPU pipeline."""

    def __init__(self, images: Path, batch_size: int, size: int, workers: int, device: torch.device) -> None:
        import torchvision.io as tvio  # raises where torchvision does not load: reported as skipped

        from torch.utils.data import DataLoader

        self.decode, self.size, self.device = tvio.decode_jpeg, size, device
        files = sorted(p for p in images.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        self.loader: DataLoader[Path] = DataLoader(
            files, batch_size=batch_size, shuffle=True, num_workers=workers,  # type: ignore[arg-type]
            collate_fn=lambda paths: [tvio.read_file(str(p)) for p in paths])

    def __iter__(self) -> Any:
        for raw in self.loader:
            decoded = self.decode(raw, device=self.device)
            batch = torch.stack([
                torch.nn.functional.interpolate(im[None].float(), size=(self.size, self.size),
                                                mode="bilinear", antialias=True)[0]
                for im in decoded])
            yield batch, torch.zeros(len(batch), dtype=torch.int64, device=self.device)


# Long on purpose: the report's sections, each run in turn on one device, read top to bottom.
def gpu_report(images: Path, jpeg_store: Path, *, device: torch.device, batch_size: int = 256,
               batches: int = 30, warmup: int = 5, workers: int = 4, size: int = 224,
               model_batch: int = 256, model_steps: int = 20, model_width: int = 64) -> dict[str, Any]:
    from tilefeed.bench.harness import measure
    from tilefeed.bench.loaders import RowSettings, build_loader
    from tilefeed.bench.steps import ModelStep
    from tilefeed.pipeline import Loader

    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "batch_size": batch_size, "batches": batches, "size": size, "model_batch": model_batch,
        "decode": {}, "stall": {},
    }
    settings = RowSettings(images=images, store=jpeg_store, batch_size=batch_size,
                              workers=workers, size=size, train=True, device=device)
    decode = report["decode"]
    for train in (True, False):
        def tiles(train: bool = train) -> dict[str, Any]:
            loader = Loader(jpeg_store, batch_size, train=train, size=size, num_workers=workers,
                            device=device)
            return _throughput(loader, batches, warmup, device)

        _guarded(decode, f"tilefeed nvJPEG tiles, {'train' if train else 'eval'}", tiles)
    _guarded(decode, "dali-files (source JPEGs, DALI on the GPU)",
             lambda: _throughput(build_loader("dali-files", settings), batches, warmup, device))
    try:
        hand = TorchvisionGpuDecode(images, batch_size, size, workers, device)
    except Exception as e:  # noqa: BLE001 - no matching torchvision: a note, not a failure
        decode["torchvision decode_jpeg on the GPU"] = {"skipped": f"torchvision does not load: {e}"}
    else:
        _guarded(decode, "torchvision decode_jpeg on the GPU",
                 lambda: _throughput(hand, batches, warmup, device))

    step_settings = RowSettings(images=images, store=jpeg_store, batch_size=model_batch,
                                   workers=workers, size=size, train=True, device=device)

    def step() -> Any:
        try:
            import torchvision

            model = torchvision.models.resnet50()
            report["model"] = "torchvision resnet50, bf16 autocast"
        except Exception:  # noqa: BLE001 - the bench's own network, ResNet-50's stage depths
            model = None
            report["model"] = f"ResNet-style (width {model_width}, blocks 3-4-6-3), bf16 autocast"
        s = ModelStep(device, width=model_width, blocks=(3, 4, 6, 3))
        if model is not None:
            s.model = model.to(device).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            s.opt = torch.optim.SGD(s.model.parameters(), lr=0.1, momentum=0.9)
        return s

    for name in ("tilefeed", "baseline"):
        def run(name: str = name) -> dict[str, Any]:
            result = measure(build_loader(name, step_settings), step(), steps=model_steps,
                             warmup=3, name=name, device=device)
            return {"stall_fraction": result.stall_fraction, "images_per_s": result.samples_per_s,
                    "step_median_ms": result.step_median_ms, "wait_median_ms": result.wait_median_ms,
                    "gpu_max_allocated_mb": result.gpu_max_allocated_mb}
        _guarded(report["stall"], name, run)
    return report


def junit_summary(junit_xml: Path) -> dict[str, Any]:
    """passed / failed / skipped counts and each failure's name and first line, from pytest's XML."""
    import xml.etree.ElementTree as ET

    try:
        cases = ET.parse(junit_xml).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        return {"error": f"cannot read {junit_xml}: {e}"}
    out: dict[str, Any] = {"passed": 0, "failed": [], "skipped": 0}
    for case in cases:
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            message = (bad.get("message") or "").strip().splitlines()
            out["failed"].append({"test": f"{case.get('classname')}::{case.get('name')}",
                                  "message": message[0][:300] if message else ""})
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


def report_table(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
             f"batch {report['batch_size']}, {report['size']} px",
             "| decode + augment on the device | img/s | torch peak MB | device peak MB | memory bounded |",
             "| --- | ---: | ---: | ---: | --- |"]
    for name, r in report["decode"].items():
        if "images_per_s" in r:
            lines.append(f"| {name} | {r['images_per_s']:.0f} | {r['torch_peak_mb'] or 0:.0f} | "
                         f"{r['device_used_peak_mb'] or 0:.0f} | {'yes' if r['memory_bounded'] else 'NO'} |")
        else:
            lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | |")
    lines += ["", f"stall at a {report.get('model', 'model')} step, batch {report['model_batch']}:",
              "| loader | stall | img/s | step ms | wait ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in report["stall"].items():
        if "stall_fraction" in r:
            lines.append(f"| {name} | {r['stall_fraction']:.1%} | {r['images_per_s']:.0f} | "
                         f"{r['step_median_ms']:.1f} | {r['wait_median_ms']:.1f} |")
        else:
            lines.append(f"| {name} | {r['error']} | | | |")
    return "\n".join(lines)
