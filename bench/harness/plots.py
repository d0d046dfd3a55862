"""PNG plots of bench results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from tilefeed.bench.harness.watch import RunResult


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(runs: list[RunResult], out_dir: Path) -> list[Path]:
    """stall.png (stall fraction per loader) and timeline.png (per-step wait and step)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r.loader for r in runs]
    ax.bar(names, [100 * r.stall_fraction for r in runs], color="#c0504d")
    for i, r in enumerate(runs):
        ax.text(i, 100 * r.stall_fraction, f"{r.stall_fraction:.0%}\n{r.samples_per_s:.0f} img/s",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("stall: time waiting for data (%)")
    ax.set_ylim(0, 110)
    ax.set_title("Input stall per loader")
    fig.tight_layout()
    stall = out_dir / "stall.png"
    fig.savefig(stall, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.8 + 1.6 * len(runs)), squeeze=False,
                             sharex=True)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        warm_wait, warm_step = r.timeline.get("warmup_wait_ms", []), r.timeline.get("warmup_step_ms", [])
        before = range(-len(warm_wait), 0)  # warm-up steps left of 0: out of the figures, not hidden
        ax.bar(before, warm_wait, color="#e6a5a3", label="wait (warm-up)")
        ax.bar(before, warm_step, bottom=warm_wait, color="#a7c0de", label="step (warm-up)")
        steps = range(len(r.timeline["step_ms"]))
        ax.bar(steps, r.timeline["wait_ms"], color="#c0504d", label="wait for batch")
        ax.bar(steps, r.timeline["step_ms"], bottom=r.timeline["wait_ms"], color="#4f81bd",
               label="step")
        ax.set_ylabel(f"{r.loader}\nms")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle("Per-step wait and step time")
    fig.tight_layout()
    timeline = out_dir / "timeline.png"
    fig.savefig(timeline, dpi=120)
    plt.close(fig)
    return [stall, timeline, plot_stages(runs, out_dir / "stages.png")]


STAGE_COLOURS = {"step": "#4f81bd", "wait": "#c0504d", "read": "#9bbb59", "decode": "#f79646",
                 "resize": "#8064a2", "download": "#4bacc6", "graph": "#7f7f7f", "copy": "#c4bd97"}


def plot_stages(runs: list[RunResult], path: Path) -> Path:
    """stages.png: per loader, a stacked bar of the consumer's milliseconds per batch (step,
    wait); beside it, for a loader that reports its stages, the milliseconds per batch each
    stage spent (host stages summed over the reader threads, so bars may exceed the step)."""
    plt = _pyplot()
    bars: list[tuple[str, dict[str, float]]] = []
    for r in runs:
        steps = max(1, r.steps)
        bars.append((r.loader, {"step": 1000 * r.step_s / steps, "wait": 1000 * r.wait_s / steps}))
        stages = r.extra.get("stages")
        if stages:
            bars.append((f"{r.loader}\nstages ({stages['bottleneck']})", stages["ms_per_batch"]))
    fig, ax = plt.subplots(figsize=(2.2 + 1.4 * len(bars), 3.8))
    drawn: set[str] = set()
    for i, (_, parts) in enumerate(bars):
        bottom = 0.0
        for name, ms in parts.items():
            label = None if name in drawn else name
            drawn.add(name)
            ax.bar(i, ms, bottom=bottom, color=STAGE_COLOURS.get(name, "#cccccc"), label=label)
            bottom += ms
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.set_ylabel("ms per batch")
    ax.set_title("Where each batch's time went")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_sweep(xs: list[float], curves: dict[str, list[float]], xlabel: str, path: Path) -> Path:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, ys in curves.items():
        ax.plot(xs, [100 * y for y in ys], marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("stall (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.set_title("Stall against " + xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
