"""The figures drawn from a bench's JSON: drawn from small fake JSON, checked through matplotlib's
objects (labels, units, the data each line or bar carries), never through pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt  # noqa: E402 - after the skip: matplotlib is the plot extra
from PIL import Image  # noqa: E402

from tilefeed.bench.harness.plots import (  # noqa: E402
    save_figure,
    stages_figure,
    sweep_figure,
    swept_setting,
)

ROOT = Path(__file__).resolve().parents[3]


def run(loader: str, value: float, *, wait_s: float, rate: float, over: str = "step-ms",
        stages: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run as the bench's JSON writes it, with the fields the figures read."""
    extra: dict[str, Any] = {over: value}
    if stages is not None:
        extra["stages"] = stages
    return {"loader": loader, "batch_size": 32, "samples": 32 * 20, "steps": 20, "wait_s": wait_s,
            "samples_per_s": rate, "stall_fraction": 0.5, "extra": extra}


def stages(wait: float, resize: float, graph: float, bottleneck: str) -> dict[str, Any]:
    busy = {"read": 0.05, "decode": 0.1, "resize": resize, "download": 0.0, "graph": graph, "copy": 0.01}
    return {"busy": busy, "wait": wait, "bottleneck": bottleneck, "advice": "",
            "ms_per_batch": {k: 10 * v for k, v in busy.items()}}


@pytest.fixture
def sweep() -> dict[str, Any]:
    """A sweep over step time: the baseline slow everywhere, tilefeed waiting only at 0 ms."""
    runs = []
    for value, base_wait, base_rate, tf_wait, tf_rate, tf_stages in (
            (0, 2.0, 300.0, 0.4, 1600.0, stages(0.98, 0.9, 0.3, "resize")),
            (10, 1.8, 310.0, 0.1, 1500.0, stages(0.3, 0.85, 0.2, "resize")),
            (40, 1.0, 320.0, 0.004, 790.0, stages(0.005, 0.3, 0.1, "step"))):
        runs += [run("baseline", value, wait_s=base_wait, rate=base_rate),
                 run("tilefeed", value, wait_s=tf_wait, rate=tf_rate, stages=tf_stages)]
    return {"runs": runs, "fair": True,
            "settings": {"batch_size": 32, "workers": 2, "size": 224, "device": "cpu", "cpus": 2},
            "provenance": {"date": "2026-12-04T00:00:00+00:00", "commit": "0123456789abcdef",
                           "machine": {"cpu": "Some CPU", "cores": 2}}}


@pytest.fixture(autouse=True)
def close_figures() -> Any:
    yield
    plt.close("all")


def lines_by_label(ax: Any) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines()}


def test_sweep_figure_has_two_panels_one_unit_each(sweep: dict[str, Any]) -> None:
    fig = sweep_figure(sweep)
    wait_ax, rate_ax = fig.axes
    assert wait_ax.get_ylabel() == "wait per batch (ms)"
    assert rate_ax.get_ylabel() == "images/s"
    assert rate_ax.get_xlabel() == "emulated step time (ms per batch)"
    assert not any("%" in ax.get_ylabel() or "stall" in ax.get_ylabel() for ax in fig.axes)
    # a 0 ms step is drawn, in milliseconds of wait: the faster loader waits less there, not more
    waits = lines_by_label(wait_ax)
    assert list(waits["tilefeed"].get_xdata()) == [0, 10, 40]
    assert list(waits["tilefeed"].get_ydata()) == pytest.approx([20.0, 5.0, 0.2])  # 1000 * wait_s / steps
    assert list(waits["baseline"].get_ydata()) == pytest.approx([100.0, 90.0, 50.0])
    rates = lines_by_label(rate_ax)
    assert list(rates["tilefeed"].get_ydata()) == [1600.0, 1500.0, 790.0]
    assert list(rates["baseline"].get_ydata()) == [300.0, 310.0, 320.0]


def test_sweep_figure_draws_the_step_ceiling_from_the_shortest_real_step(sweep: dict[str, Any]) -> None:
    rate_ax = sweep_figure(sweep).axes[1]
    ceiling = next(line for line in rate_ax.get_lines() if line.get_label().startswith("the step alone"))
    xs, ys = ceiling.get_xdata(), ceiling.get_ydata()
    assert xs[0] == 10 and xs[-1] == 40  # 0 ms allows any rate: not drawn
    assert ys[0] == pytest.approx(1000 * 32 / 10) and ys[-1] == pytest.approx(1000 * 32 / 40)


def test_sweep_figure_over_workers_labels_workers_and_draws_no_ceiling(sweep: dict[str, Any]) -> None:
    data = {**sweep, "runs": [run(name, w, wait_s=1.0, rate=400.0, over="workers")
                              for w in (1, 2, 4) for name in ("baseline", "tilefeed")]}
    assert swept_setting(data) == "workers"
    fig = sweep_figure(data)
    assert fig.axes[1].get_xlabel() == "workers per loader"
    assert set(lines_by_label(fig.axes[1])) == {"baseline", "tilefeed"}


def test_sweep_figure_refuses_a_json_that_is_no_sweep(sweep: dict[str, Any]) -> None:
    for r in sweep["runs"]:
        del r["extra"]["step-ms"]
    with pytest.raises(ValueError, match="not a sweep"):
        sweep_figure(sweep)


def test_stages_figure_draws_each_resource_share_in_percent(sweep: dict[str, Any]) -> None:
    fig = stages_figure(sweep)
    assert len(fig.axes) == 3  # the three tilefeed runs; the baseline reports no stages
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_yticklabels()] == ["training loop", "reader threads",
                                                              "feeding thread"]
    assert "%" in fig.axes[-1].get_xlabel()
    assert first.get_title(loc="left") == "tilefeed, 0 ms step: bottleneck resize"
    assert fig.axes[-1].get_title(loc="left") == "tilefeed, 40 ms step: bottleneck step"
    # bars in percent, stacked per resource: the reader threads' stages one after another
    def row(k: int) -> list[float]:
        """left, width, left, width, ... of the bars on row ``k``, in the order drawn."""
        return [v for p in first.patches if round(p.get_y() + p.get_height() / 2) == k
                for v in (p.get_x(), p.get_width())]

    assert row(0) == pytest.approx([0.0, 98.0])  # the training loop's wait
    assert row(1) == pytest.approx([0.0, 5.0, 5.0, 10.0, 15.0, 90.0, 105.0, 0.0])  # read .. download
    assert row(2) == pytest.approx([0.0, 30.0, 30.0, 1.0])  # graph, copy
    labels = [c.get_label() for c in first.containers]
    assert labels == ["wait", "read", "decode", "resize", "download", "graph", "copy"]
    assert fig.axes[-1].get_xlim()[1] >= 105.0  # a share past 100% stays in sight


def test_stages_figure_keeps_the_values_asked_for(sweep: dict[str, Any]) -> None:
    fig = stages_figure(sweep, values=[10])
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["tilefeed, 10 ms step: bottleneck resize"]


def test_stages_figure_refuses_runs_without_stages(sweep: dict[str, Any]) -> None:
    sweep["runs"] = [r for r in sweep["runs"] if r["loader"] == "baseline"]
    with pytest.raises(ValueError, match="reports its stages"):
        stages_figure(sweep)


def test_save_figure_writes_a_png_and_closes_the_figure(sweep: dict[str, Any], tmp_path: Path) -> None:
    fig = sweep_figure(sweep)
    path = save_figure(fig, tmp_path / "deep" / "sweep.png")
    assert path == tmp_path / "deep" / "sweep.png"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 300
    assert fig.number not in plt.get_fignums()


def test_the_committed_sweep_json_draws_both_figures() -> None:
    data = json.loads((ROOT / "docs" / "img" / "sweep.json").read_text())
    assert {"command", "commit", "date", "machine"} <= set(data["provenance"])
    assert len(sweep_figure(data).axes) == 2
    assert len(stages_figure(data).axes) == len([r for r in data["runs"] if r["loader"] == "tilefeed"])
