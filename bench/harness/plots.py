"""PNG plots of bench results (matplotlib, headless).

Two kinds: the ``plot_*`` functions draw a bench's results as it runs (``--plots``); the
``*_figure`` functions draw a bench's ``--json`` afterwards, so a committed JSON renders the same
picture again (``tools/render_pictures.py``). Each figure keeps one unit per axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilefeed.bench.harness.watch import RunResult
from tilefeed.pipeline.stats import FEED_STAGES, HOST_STAGES

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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


# -- from a bench's JSON ---------------------------------------------------------------------------
SWEPT = {"step-ms": "emulated step time (ms per batch)", "workers": "workers per loader"}
LOADER_COLOURS = {"baseline": "#c0504d", "tilefeed": "#4f81bd", "dali-files": "#9bbb59",
                  "tiles-dataloader": "#8064a2"}
# the resources a tilefeed Loader's stages run on, each judged by its own time (pipeline.stats)
RESOURCES = (("training loop", ("wait",)), ("reader threads", HOST_STAGES), ("feeding thread", FEED_STAGES))


def swept_setting(data: Mapping[str, Any]) -> str:
    """The setting a sweep's JSON swept: the key of ``SWEPT`` every run notes in its ``extra``."""
    runs = data["runs"]
    for key in SWEPT:
        if runs and all(key in r.get("extra", {}) for r in runs):
            return key
    raise ValueError(f"not a sweep's JSON: no run notes one of {', '.join(SWEPT)} in its extra")


def _caption(data: Mapping[str, Any]) -> str:
    """One line under a figure: what ran, where and when (from the JSON's settings and the
    provenance ``tools/render_pictures.py record`` adds)."""
    settings = data.get("settings", {})
    made = data.get("provenance", {})
    machine = made.get("machine", {})
    where = machine.get("cpu") or settings.get("host") or "?"
    cores = machine.get("cores") or settings.get("cpus")
    parts = [f"batch {settings.get('batch_size', '?')}", f"{settings.get('workers', '?')} workers",
             f"{settings.get('size', '?')} px", str(settings.get("device", "?")),
             f"{where}, {cores} cores" if cores else where]
    if settings.get("gpu"):
        parts.append(str(settings["gpu"]))
    if made.get("date"):
        parts.append(str(made["date"])[:10])
    if made.get("commit"):
        parts.append(f"commit {str(made['commit'])[:10]}")
    return ", ".join(parts)


def sweep_figure(data: Mapping[str, Any]) -> Figure:
    """A sweep's JSON (``tilefeed bench sweep --json``) as two panels over the swept setting:
    the mean wait per batch (ms) and the images per second, one line per loader.

    The wait is the total wait over the measured steps (``wait_s / steps``), so it is what the
    stall fraction is made of, in time rather than as a share: a faster loader never reads as
    worse where the step is short. Over step time, the images/s panel also draws what the step
    alone allows (batch size / step time), the ceiling a loader that never stalls reaches.
    """
    plt = _pyplot()
    over = swept_setting(data)
    runs = data["runs"]
    fig, (wait_ax, rate_ax) = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True)
    for name in dict.fromkeys(r["loader"] for r in runs):
        mine = sorted((r for r in runs if r["loader"] == name), key=lambda r: r["extra"][over])
        xs = [r["extra"][over] for r in mine]
        colour = LOADER_COLOURS.get(name)
        wait_ax.plot(xs, [1000 * r["wait_s"] / max(1, r["steps"]) for r in mine], marker="o",
                     color=colour, label=name)
        rate_ax.plot(xs, [r["samples_per_s"] for r in mine], marker="o", color=colour, label=name)
    if over == "step-ms":
        steps = sorted({float(r["extra"][over]) for r in runs if r["extra"][over] > 0})
        batch = max(r["batch_size"] for r in runs)
        if steps:  # a step of 0 ms allows any rate: the ceiling starts at the shortest real step
            import numpy as np

            span = np.linspace(steps[0], steps[-1], 100)
            rate_ax.plot(span, 1000 * batch / span, linestyle="--", color="#7f7f7f",
                         label=f"the step alone ({batch} / step time)")
    wait_ax.set_ylabel("wait per batch (ms)")
    wait_ax.set_title("Time each step waited for its batch")
    rate_ax.set_ylabel("images/s")
    rate_ax.set_title("Images per second through the training loop")
    rate_ax.set_xlabel(SWEPT[over])
    for ax in (wait_ax, rate_ax):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.text(0.5, 0.005, _caption(data), ha="center", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _run_title(data: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """A run's name in the stages figure: its loader and, in a sweep, the value it ran at."""
    title = run["loader"]
    for key, unit in (("step-ms", " ms step"), ("workers", " workers")):
        if key in run.get("extra", {}):
            title += f", {run['extra'][key]:g}{unit}"
            break
    else:
        step = data.get("settings", {}).get("step")
        if step:
            title += f", {step}"
    return f"{title}: bottleneck {run['extra']['stages']['bottleneck']}"


def stages_figure(data: Mapping[str, Any], *, values: Sequence[float] | None = None) -> Figure:
    """The runs of a bench's JSON that report a Loader's stages (tilefeed's: ``extra.stages``,
    from its ``stats()``), each as the share of its resources' time every stage took.

    One unit on the axis, the share (%) of the time of the resource a stage runs on: the
    training loop waiting for batches (of its wall time), the reader threads' read, decode,
    resize and download (of the threads' time together: wall time x threads), the feeding
    thread's graph and copy (of its wall time). A resource near 100% binds; ``stats()`` names
    the busiest stage as the bottleneck when the loop waited at all. ``values``: of a sweep's
    runs, only those swept at these values.
    """
    plt = _pyplot()
    staged = [r for r in data["runs"] if r.get("extra", {}).get("stages")]
    if values is not None:
        over = swept_setting(data)
        staged = [r for r in staged if r["extra"][over] in values]
    if not staged:
        raise ValueError("no run in this JSON reports its stages (a tilefeed Loader's run does)")
    fig, axes = plt.subplots(len(staged), 1, figsize=(7.2, 0.9 + 1.35 * len(staged)), sharex=True,
                             squeeze=False)
    drawn: set[str] = set()
    widest = 100.0
    for ax, run in zip(axes[:, 0], staged, strict=True):
        stages = run["extra"]["stages"]
        shares = {"wait": stages["wait"], **stages["busy"]}
        for row, (_resource, names) in enumerate(RESOURCES):
            left = 0.0
            for name in names:
                share = 100 * shares.get(name, 0.0)
                ax.barh(row, share, left=left, color=STAGE_COLOURS.get(name, "#cccccc"),
                        label=None if name in drawn else name)
                drawn.add(name)
                left += share
            widest = max(widest, left)
        ax.axvline(100, color="#333333", linewidth=0.8, linestyle=":")
        ax.set_yticks(range(len(RESOURCES)), [resource for resource, _ in RESOURCES], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(_run_title(data, run), fontsize=9, loc="left")
    axes[-1, 0].set_xlim(0, 1.05 * widest)
    axes[-1, 0].set_xlabel("share of each resource's time (%): 100 = busy all the time")
    top = 1 - 0.6 / fig.get_figheight()  # the title and the legend's row: 0.6 inch
    fig.suptitle("Where a tilefeed Loader's time went (Loader.stats(), its last batches)", x=0.01,
                 y=0.995, ha="left", va="top", fontsize=11)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower left", fontsize=8, ncol=len(drawn),
               bbox_to_anchor=(0.0, top), frameon=False, handlelength=1.2, columnspacing=1.2)
    fig.text(0.5, 0.005, _caption(data), ha="center", va="bottom", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, top + 0.2 / fig.get_figheight()))  # less its padding above
    return fig


def save_figure(fig: Figure, path: Path, *, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` as PNG (its folder made) and close it."""
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
