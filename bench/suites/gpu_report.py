"""``tilefeed bench gpu-report``: the comparison a GPU user would make, as one JSON report.

* ``decode``, per tile side (224 and 256 px by default): images/s of the same pictures decoded and
  augmented on the device, batch B: tilefeed over JPEG tiles (nvJPEG through DALI's ``mixed``
  decoder; train and eval), DALI's own file reader decoding the source JPEGs on the GPU
  (``dali-files``), and a DataLoader that reads the files and decodes them with
  ``torchvision.io.decode_jpeg(device="cuda")`` (what a GPU user writes by hand; skipped with a
  note where torchvision does not load). Each with its peak device memory (torch's allocator, and
  the whole device as ``cudaMemGetInfo`` sees it, so DALI's own pools count) and whether device
  memory grows over the run after warm-up.
* ``decoder``, per tile side: which JPEG decoder actually ran (``decoder_probe``): the hardware
  engine or CUDA decode, at each ``hw_decoder_load``, whole tiles and windows.
* ``stall``: a bf16 ResNet-50 training step (torchvision's, or the bench's ResNet-style network
  with ResNet-50's stage depths where torchvision is absent) at batch 256, fed by synthetic data
  (one batch already on the device, handed over again and again: the step's own ceiling), by
  tilefeed and by the PIL DataLoader: the stall each leaves, images/s against the synthetic
  figure (goal: tilefeed at least 98% of it), device memory, the wait for the first batch and
  the hand-over wait of a batch that was ready.

Any loader or step that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
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
        "device_used_peak_mb": max(used) if used and device.type == "cuda" else None,
        "device_growth_mb": growth,
        "memory_bounded": growth < GROWTH_LIMIT_MB,
    }


def _forever(loader: Iterable[Any]) -> Iterable[Any]:
    while True:
        yield from loader


def _guarded(entries: dict[str, Any], name: str, run: Callable[[], dict[str, Any]]) -> None:
    from tilefeed.pipeline.engine import graph_pool

    try:
        entries[name] = run()
    except Exception as e:  # noqa: BLE001 - one failing loader must not stop the report
        entries[name] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        # idle pooled graphs keep their device memory: the next row must not be charged for it
        graph_pool.clear()


class TorchvisionGpuDecode:
    """A DataLoader reads the JPEG bytes; the main process decodes the batch on the GPU with
    ``torchvision.io.decode_jpeg`` and resizes it there: the hand-written GPU pipeline."""

    def __init__(self, images: Path, batch_size: int, size: int, workers: int, device: torch.device) -> None:
        import torchvision.io as tvio  # raises where torchvision does not load: reported as skipped

        from torch.utils.data import DataLoader

        self.decode, self.size, self.device = tvio.decode_jpeg, size, device
        self.rgb = tvio.ImageReadMode.RGB
        files = sorted(p for p in images.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        self.loader: DataLoader[Path] = DataLoader(
            files, batch_size=batch_size, shuffle=True, num_workers=workers,  # type: ignore[arg-type]
            collate_fn=lambda paths: [p.read_bytes() for p in paths])  # bytes: no tensor's fd crosses

    def __iter__(self) -> Any:
        for files in self.loader:
            raw = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files]
            decoded = self.decode(raw, mode=self.rgb, device=self.device)  # grayscale and CMYK JPEGs too
            batch = torch.stack([
                torch.nn.functional.interpolate(im[None].float(), size=(self.size, self.size),
                                                mode="bilinear", antialias=True)[0]
                for im in decoded])
            yield batch, torch.zeros(len(batch), dtype=torch.int64, device=self.device)


SYNTHETIC_GOAL = 0.98  # tilefeed's images/s at the step, as a share of synthetic data's


@dataclass
class GpuReport:
    """Every section of the report; ``as_dict()`` is its JSON, ``table()`` its text."""

    device: str
    torch: str
    cuda: str | None
    dali: str | None
    batch_size: int
    batches: int
    tiles: list[int]
    size: int  # the output side of every batch
    model_batch: int
    model: str = ""
    decode: dict[str, dict[str, Any]] = field(default_factory=dict)  # tile side -> loader -> figures
    decoder: dict[str, dict[str, Any]] = field(default_factory=dict)  # tile side -> DecoderProbe
    stall: dict[str, dict[str, Any]] = field(default_factory=dict)  # loader -> figures at the step
    against_synthetic: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, Any] = field(default_factory=dict)  # the gpu tests' results, when given

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        return report_table(self.as_dict())


class SyntheticBatches:
    """One batch of the step's shape made once on the device and handed over ``length`` times an
    epoch: what the step does when no loader holds it back."""

    def __init__(self, batch_size: int, size: int, device: torch.device, length: int = 50) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(batch_size, 3, size, size, generator=g).to(device)
        self.labels = torch.randint(0, 1000, (batch_size,), generator=g).to(device)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.length):
            yield self.images, self.labels


def _dali_version() -> str | None:
    try:
        import nvidia.dali as dali

        return str(dali.__version__)
    except Exception:  # noqa: BLE001 - no DALI: the report says so, its sections record the errors
        return None


def gpu_report(images: Path, jpeg_stores: dict[int, Path], *, device: torch.device, batch_size: int = 256,
               batches: int = 30, warmup: int = 5, workers: int = 4, size: int = 224,
               model_batch: int = 256, model_steps: int = 20, model_width: int = 64) -> GpuReport:
    """The report's sections, each run in turn on one device; ``jpeg_stores`` maps each tile
    side to a JPEG store made from ``images`` at that side."""
    report = GpuReport(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__, cuda=torch.version.cuda, dali=_dali_version(), batch_size=batch_size,
        batches=batches, tiles=sorted(jpeg_stores), size=size, model_batch=model_batch)
    for tile, store in sorted(jpeg_stores.items()):
        report.decode[str(tile)] = _decode_section(images, store, device=device, batch_size=batch_size,
                                                   batches=batches, warmup=warmup, workers=workers,
                                                   size=size)
        report.decoder[str(tile)] = _probe_section(store, device=device, batch_size=batch_size,
                                                   batches=batches, warmup=warmup, workers=workers)
    largest = jpeg_stores[max(jpeg_stores)]
    _stall_section(report, images, largest, device=device, workers=workers, size=size,
                   model_steps=model_steps, model_width=model_width)
    return report


def _decode_section(images: Path, store: Path, *, device: torch.device, batch_size: int, batches: int,
                    warmup: int, workers: int, size: int) -> dict[str, Any]:
    from tilefeed.bench.peers.loaders import RowSettings, build_loader
    from tilefeed.pipeline import Loader

    decode: dict[str, Any] = {}
    for train in (True, False):
        def tiles(train: bool = train) -> dict[str, Any]:
            with Loader(store, batch_size, train=train, size=size, num_workers=workers,
                        device=device) as loader:
                return _throughput(loader, batches, warmup, device)

        _guarded(decode, f"tilefeed nvJPEG tiles, {'train' if train else 'eval'}", tiles)
    settings = RowSettings(images=images, store=store, batch_size=batch_size, workers=workers, size=size,
                           train=True, device=device)
    _guarded(decode, "dali-files (source JPEGs, DALI on the GPU)",
             lambda: _throughput(build_loader("dali-files", settings), batches, warmup, device))
    try:
        hand = TorchvisionGpuDecode(images, batch_size, size, workers, device)
    except Exception as e:  # noqa: BLE001 - no matching torchvision: a note, not a failure
        decode["torchvision decode_jpeg on the GPU"] = {"skipped": f"torchvision does not load: {e}"}
    else:
        _guarded(decode, "torchvision decode_jpeg on the GPU",
                 lambda: _throughput(hand, batches, warmup, device))
    return decode


def _probe_section(store: Path, *, device: torch.device, batch_size: int, batches: int, warmup: int,
                   workers: int) -> dict[str, Any]:
    from tilefeed.bench.suites.decoder_probe import probe_decoder
    from tilefeed.pipeline.device import dali_device_id

    try:
        return probe_decoder(store, device_id=dali_device_id(device), batch_size=batch_size, batches=batches,
                             warmup=warmup, threads=workers).as_dict()
    except Exception as e:  # noqa: BLE001 - the probe failing must not stop the report
        return {"error": f"{type(e).__name__}: {e}"}


def _stall_section(report: GpuReport, images: Path, store: Path, *, device: torch.device, workers: int,
                   size: int, model_steps: int, model_width: int) -> None:
    from tilefeed.bench.harness.watch import measure
    from tilefeed.bench.peers.loaders import RowSettings, build_loader
    from tilefeed.bench.harness.steps import ModelStep

    settings = RowSettings(images=images, store=store, batch_size=report.model_batch, workers=workers,
                           size=size, train=True, device=device)

    precision = "bf16 autocast" if device.type == "cuda" else "fp32 on the host"

    def step() -> ModelStep:
        s = ModelStep(device, width=model_width, blocks=(3, 4, 6, 3))
        try:
            import torchvision

            model = torchvision.models.resnet50()
        except Exception:  # noqa: BLE001 - the bench's own network, ResNet-50's stage depths
            report.model = f"ResNet-style (width {model_width}, blocks 3-4-6-3), {precision}"
            return s
        report.model = f"torchvision resnet50, {precision}"
        s.model = model.to(device).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        s.opt = torch.optim.SGD(s.model.parameters(), lr=0.1, momentum=0.9)
        return s

    def make(name: str) -> Iterable[Any]:
        if name == "synthetic":
            return SyntheticBatches(report.model_batch, size, device)
        return build_loader(name, settings)

    for name in ("synthetic", "tilefeed", "baseline"):
        def run(name: str = name) -> dict[str, Any]:
            begun = time.perf_counter()
            loader = make(name)
            built = time.perf_counter() - begun
            result = measure(loader, step(), steps=model_steps, warmup=3, name=name, device=device)
            close = getattr(loader, "close", None)
            if close is not None:
                close()
            first = result.timeline["warmup_wait_ms"][:1]
            return {"stall_fraction": result.stall_fraction, "images_per_s": result.samples_per_s,
                    "step_median_ms": result.step_median_ms, "wait_median_ms": result.wait_median_ms,
                    "wait_p95_ms": result.wait_p95_ms, "handover_median_ms": result.handover_median_ms,
                    "epoch_start_wait_ms": result.epoch_start_wait_ms, "build_s": built,
                    "first_batch_ms": first[0] if first else None,
                    "gpu_max_allocated_mb": result.gpu_max_allocated_mb,
                    "gpu_max_reserved_mb": result.gpu_max_reserved_mb,
                    "device_used_mb": _device_used_mb(device) if device.type == "cuda" else None}
        _guarded(report.stall, name, run)
    ceiling = report.stall["synthetic"].get("images_per_s")
    ours = report.stall["tilefeed"].get("images_per_s")
    if ceiling and ours:
        share = ours / ceiling
        report.against_synthetic = {"share": share, "goal": SYNTHETIC_GOAL, "met": share >= SYNTHETIC_GOAL}
    else:
        report.against_synthetic = {"share": None, "goal": SYNTHETIC_GOAL, "met": False,
                                    "note": "the synthetic or the tilefeed run failed: see its error"}


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


def write_report(report: GpuReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2))


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report_table(report: dict[str, Any]) -> str:
    """The report as Markdown tables, from its JSON form (so a committed report renders again)."""
    lines = [f"device: {report['device']}, torch {report['torch']} (CUDA {report['cuda']}), "
             f"DALI {report['dali']}, batch {report['batch_size']}, output {report['size']} px"]
    for tile, loaders in report["decode"].items():
        lines += ["", f"{tile} px JPEG tiles:",
                  "| decode + augment on the device | img/s | torch peak MB | device peak MB "
                  "| memory bounded |", "| --- | ---: | ---: | ---: | --- |"]
        for name, r in loaders.items():
            if "images_per_s" in r:
                lines.append(f"| {name} | {r['images_per_s']:.0f} | {_mb(r['torch_peak_mb'])} | "
                             f"{_mb(r['device_used_peak_mb'])} | {'yes' if r['memory_bounded'] else 'NO'} |")
            else:
                lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | |")
    for tile, probe in report["decoder"].items():
        lines += ["", f"which decoder ran, {tile} px tiles: "
                  f"{probe.get('verdict') or probe.get('error')}"]
        if "runs" not in probe:
            continue
        lines.append(f"(NVIDIA_DRIVER_CAPABILITIES={probe['driver_capabilities']})")
        lines += ["| decode | hw_decoder_load | img/s | JPEG engine peak / mean % |",
                  "| --- | ---: | ---: | --- |"]
        for run in probe["runs"]:
            engine = run["engine"]
            busy = (f"{engine['peak_percent']:.0f} / {engine['mean_percent']:.0f}" if engine["available"]
                    else "not read")
            what = "window" if run["region"] else "whole tile"
            figure = run["error"] or f"{run['images_per_s']:.0f}"
            lines.append(f"| {what} | {run['hw_decoder_load'] if run['hw_decoder_load'] is not None else '-'} "
                         f"| {figure} | {busy} |")
    lines += ["", f"stall at a {report['model'] or 'model'} step, batch {report['model_batch']}:",
              "| feed | stall | img/s | step ms | wait ms | mid-epoch wait ms | first batch ms | build s "
              "| device used MB |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in report["stall"].items():
        if "stall_fraction" in r:
            lines.append(f"| {name} | {r['stall_fraction']:.1%} | {r['images_per_s']:.0f} | "
                         f"{r['step_median_ms']:.1f} | {r['wait_median_ms']:.1f} | "
                         f"{r['handover_median_ms']:.2f} | {_ms(r['first_batch_ms'])} | {r['build_s']:.2f} "
                         f"| {_mb(r['device_used_mb'])} |")
        else:
            lines.append(f"| {name} | {r['error']} | | | | | | | |")
    share = report["against_synthetic"]
    if share.get("share") is not None:
        lines.append(f"tilefeed at {share['share']:.1%} of synthetic data's img/s (goal "
                     f"{share['goal']:.0%}: {'met' if share['met'] else 'NOT met'})")
    tests = report.get("tests") or {}
    if "passed" in tests:
        lines += ["", f"gpu tests: {tests['passed']} passed, {len(tests['failed'])} failed, "
                  f"{tests['skipped']} skipped"]
        lines += [f"- FAILED {f['test']}: {f['message']}" for f in tests["failed"]]
    elif tests:
        lines += ["", f"gpu tests: {tests.get('error')}"]
    return "\n".join(lines)
