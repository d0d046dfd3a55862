"""The device-graph bench: both graph shapes over a corner of the matrix, each cell within its
recipe's tolerance, refused cells said, the table drawn again from its JSON; a cell whose
shapes part is told apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tilefeed.bench.suites import device_graph
from tilefeed.bench.suites.device_graph import DeviceGraphResult, bench_device_graph


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> DeviceGraphResult:
    return bench_device_graph(tmp_path_factory.mktemp("device-graph-bench"), count=8, tile=48, size=32,
                              codecs=("jpeg",), recipes=("evaluation", "crop", "lsj", "erasing"),
                              outputs=("uint8 NHWC", "float32 NCHW"))


def test_every_cell_runs_in_both_shapes_within_its_tolerance(result: DeviceGraphResult) -> None:
    assert len(result.cells) == 2 * 4 * 2  # fits x recipes x outputs
    refused = [c for c in result.cells if c.refused]
    assert [(c.recipe, c.output) for c in refused] == [("erasing", "uint8 NHWC")] * 2
    assert "float dtype" in refused[0].refused
    ran = [c for c in result.cells if not c.refused]
    assert all(c.device is not None and c.samples == 8 for c in ran)
    assert all(c.targets is True for c in ran if c.recipe != "evaluation")  # boxes and masks equal
    assert all(c.reference is not None for c in ran if c.recipe in ("evaluation", "crop"))
    assert result.ok, result.table()


def test_the_table_comes_back_from_its_json(result: DeviceGraphResult) -> None:
    again = DeviceGraphResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again.table() == result.table() and again.ok
    assert "| jpeg | pad | lsj |" in result.table() and "refused" in result.table()


def test_a_cell_past_its_tolerance_fails_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The control: the shapes' resizes differ by a fraction of a level, so a crop held to no
    difference at all is over, and the run says so."""
    monkeypatch.setitem(device_graph.TOLERANCE, "crop", (0.0, "nothing"))
    parted = bench_device_graph(tmp_path, count=8, tile=48, size=32, codecs=("lz4",), fits=("crop",),
                                recipes=("crop",), outputs=("uint8 NHWC",))
    assert not parted.ok and "**over**" in parted.table()
