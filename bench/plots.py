"""PNG plots of bench results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from tilefeed.bench.harness import RunResult


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
    return [stall, timeline]


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
