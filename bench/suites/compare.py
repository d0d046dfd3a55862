"""Loaders side by side on equal terms: the same samples, batch, output and augmentation."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tilefeed.bench.harness.watch import RunResult, Step, format_table, measure
from tilefeed.bench.peers.loaders import RowSettings, build_loader
from tilefeed.store.errors import ConfigError
from tilefeed.store.host import usable_cores


@dataclass
class SweepResult:
    """Every run of a sweep (each noting the value it ran at in ``extra``), the settings of the
    last value, and the path of its picture (wait per batch and images/s, ``sweep_figure``)."""

    over: str  # the setting swept: "step-ms" or "workers"
    values: list[float]
    runs: list[RunResult]
    settings: dict[str, Any]
    plot: str

    def as_dict(self) -> dict[str, Any]:
        """What the main form's ``--json`` writes, over every value's runs."""
        return {"runs": [r.as_dict() for r in self.runs], "fair": True, "settings": self.settings}

    def table(self) -> str:
        """Each loader's stall at each value, and where the plot is."""
        loaders = list(dict.fromkeys(r.loader for r in self.runs))
        lines = [f"| stall at {self.over} | " + " | ".join(f"{v:g}" for v in self.values) + " |",
                 "| --- |" + " ---: |" * len(self.values)]
        for name in loaders:
            stalls = [f"{r.stall_fraction:.1%}" for r in self.runs if r.loader == name]
            lines.append(f"| {name} | " + " | ".join(stalls) + " |")
        return "\n".join([*lines, f"plot: {self.plot}"])


class UnfairComparison(ConfigError):
    """Runs that did not deliver the same batches, outputs or augmentation."""


def fairness(runs: list[RunResult], augmentation: str) -> str:
    """One line saying what every run had in common; UnfairComparison when they differ."""
    keys = {r.loader: (r.batch_size, r.samples, r.steps, tuple(r.output.get("shape", ())),
                       r.output.get("dtype")) for r in runs}
    if len(set(keys.values())) > 1:
        lines = "; ".join(f"{name}: batch {k[0]}, {k[1]} samples in {k[2]} steps, output "
                          f"{k[3]} {k[4]}" for name, k in keys.items())
        raise UnfairComparison(f"refusing to compare runs that differ: {lines}")
    b, n, steps, shape, dtype = next(iter(keys.values()))
    return (f"fair: every loader delivered {n} samples in {steps} steps of batch {b}, "
            f"{dtype} {shape}, augmentation '{augmentation}'")


def compare(names: list[str], settings: RowSettings, step: Step, *, steps: int,
            warmup: int) -> tuple[list[RunResult], str]:
    if not names:
        raise ConfigError("no loader to compare: name at least one")
    runs = []
    for name in names:
        loader = build_loader(name, settings)
        run = measure(loader, step, steps=steps, warmup=warmup, name=name, device=settings.device)
        memory = getattr(step, "memory", None)
        if memory is not None:
            run.extra["memory_breakdown"] = memory.as_dict()
        runs.append(run)
        line = fairness(runs, settings.augmentation)  # stops at the first run off the terms
        del loader
    return runs, line


def settings_dict(settings: RowSettings, step: Any, steps: int, warmup: int) -> dict[str, Any]:
    d = {k: str(v) if isinstance(v, (Path, torch.device)) else v
         for k, v in asdict(settings).items()}
    d.update(steps=steps, warmup=warmup, step=step.describe(), augmentation=settings.augmentation,
             host=platform.node(), cpus=usable_cores(),
             gpu=torch.cuda.get_device_name(settings.device) if settings.device.type == "cuda"
             else None, torch=torch.__version__)
    return d


def write_json(path: Path, runs: list[RunResult], fair: bool, settings: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": [r.as_dict() for r in runs], "fair": fair,
                                "settings": settings}, indent=2))


def report(runs: list[RunResult], fair_line: str, step_text: str) -> str:
    lines = [f"step: {step_text}", format_table(runs), fair_line]
    for r in runs:
        if r.memory_growth:
            lines.append(f"WARNING {r.loader}: {r.memory_note}")
        if "memory_breakdown" in r.extra:
            m = r.extra["memory_breakdown"]
            lines.append(f"{r.loader}: model memory dominated by {m['dominant']} -> {m['lever']}")
    return "\n".join(lines)
