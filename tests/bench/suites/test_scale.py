"""``tilefeed bench scale`` on two tiny sets: every figure comes back for each size, the rates
from one process that times each store's Loader in turn.

``check_rates_reported`` holds what the bench can get wrong about the rates: that each store is
timed on its own, and that the table's rate and ratio cells are the JSON's rates, the ratios
those of each round to the first store's. It runs on a real small run, on a run with faked
measurements (known rates), and on that run with the bench broken in two ways, where it must fail."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from tilefeed.bench.suites.scale import ScaleResult

# the Loader row's cell of each store: "median (min-max), ratio median x (min-max)"
CELL = re.compile(r"^([\d,]+) \(([\d,]+)-([\d,]+)\), (\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\)$")


def loader_cells(table: str) -> list[str]:
    """The rate cells of the table's Loader row, one per store (the name and the per-source cell dropped)."""
    row = next(line for line in table.splitlines() if line.startswith("| Loader uint8"))
    return [cell.strip() for cell in row.strip().strip("|").split("|")][1:-1]


def check_rates_reported(scaled: ScaleResult) -> None:
    """The rates of ``scaled`` (``run_scale``'s) are measured per store, and its ``table()``
    (looked up when called, so a broken one can stand in) prints them and their ratios to the
    first store's as they are in the JSON."""
    result = scaled.as_dict()
    assert json.loads(json.dumps(result)) == result  # what --json writes is what the table shows
    rows = result["rows"]
    rounds = len(rows[0]["rates"])
    assert rounds >= 2
    for row in rows:
        assert len(row["rates"]) == rounds
        assert all(math.isfinite(rate) and rate > 0 for rate in row["rates"]), row["rates"]
    # each store timed on its own: timings of two stores never agree to the last bit, round after round
    for k, row in enumerate(rows[1:], 1):
        assert row["rates"] != rows[0]["rates"], f"store {k} reports the first store's rates"
    cells = loader_cells(scaled.table())
    assert len(cells) == len(rows)
    first = rows[0]["rates"]
    for row, cell in zip(rows, cells, strict=True):
        found = CELL.match(cell)
        assert found is not None, cell
        runs = row["rates"]
        ratios = [mine / base for mine, base in zip(runs, first, strict=True)]
        want = (f"{statistics.median(runs):,.0f}", f"{min(runs):,.0f}", f"{max(runs):,.0f}",
                f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}", f"{max(ratios):.2f}")
        assert found.groups() == want, (cell, runs, first)


@pytest.mark.slow
def test_scale_bench_reports_every_figure_for_each_size(tmp_path: Path) -> None:
    from tilefeed.bench.suites.scale import rates, run_scale

    result = run_scale(tmp_path, [2, 4], per_class=6, size=8, workers=1, batch_size=4, warm=2,
                       timed=3, rounds=3)
    small, large = result.rows
    assert small.writer["sources"] == 12 and large.writer["sources"] == 24
    for row in result.rows:
        assert row.writer["peak_bytes"] > 0 and row.writer["us_per_source"] > 0
        assert row.open["samples"] == row.writer["sources"]
        assert len(row.rates) == 3 and all(rate > 0 for rate in row.rates)
        assert row.read["cpu_us"] > 0 and row.info_s > 0 and row.verify_s > 0
    table = result.table()
    assert "12 sources | 24 sources" in table and "median of the rounds' ratios" in table
    assert "1.00x (1.00-1.00)" in table  # the first store against itself
    cpu_row = next(line for line in table.splitlines() if line.startswith("| writer driver CPU"))
    assert cpu_row.rstrip(" |").endswith("µs")  # and per added source
    check_rates_reported(result)
    stores = [Path(row.store) for row in result.rows]
    turns = rates(stores, batch_size=4, warm=1, timed=2, rounds=4)
    assert [len(runs) for runs in turns] == [4, 4]


# -- a run with faked measurements: the rates known, so the table's cells can be worked out -------

# per store (by its class count), the samples/s of each round; the medians are equal (200) while
# the rounds' ratios are 1.5, 1.0 and 2.0: a ratio of medians would print 1.00x, the bench's 1.50x
FAKE_RATES = {2: [100.0, 200.0, 300.0], 4: [150.0, 200.0, 600.0]}


def _classes(store: str) -> int:
    """The class count in a store's name (``store-4x6-8``)."""
    found = re.search(r"store-(\d+)x", store)
    assert found is not None, store
    return int(found.group(1))


@pytest.fixture
def faked_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_scale`` with every measurement faked: no store is written, no process started; the
    rates process answers ``FAKE_RATES`` for the stores it is given, in their order."""
    from tilefeed.bench.suites import scale

    def child(code: str, *args: str) -> dict[str, Any]:
        if code == scale._RATES:
            rounds, stores = int(args[3]), args[4:]
            return {"rates": [FAKE_RATES[_classes(store)][:rounds] for store in stores]}
        if code == scale._OPEN:
            return {"seconds": 0.001, "growth_bytes": 1000, "samples": 0}
        assert code == scale._READ
        return {"cpu_us": 5.0, "faults": 0.0}

    def build(sources: Path, store: Path, *, size: int, workers: int) -> dict[str, Any]:
        count = sum(1 for _ in sources.glob("*/*.jpg"))
        return {"sources": count, "peak_bytes": 1e8, "cpu_s": 1.0, "wall_s": 2.0, "us_per_source": 1e6 / count}

    monkeypatch.setattr(scale, "_child", child)
    monkeypatch.setattr(scale, "build", build)
    monkeypatch.setattr(scale, "_timed", lambda command: 0.5)


def faked_scale_run(root: Path) -> ScaleResult:
    from tilefeed.bench.suites.scale import run_scale

    return run_scale(root, [2, 4], per_class=3, size=8, workers=1, batch_size=4, warm=1, timed=2, rounds=3)


def test_the_rates_check_holds_on_a_faked_run(tmp_path: Path, faked_run: None) -> None:
    result = faked_scale_run(tmp_path)
    assert [row.rates for row in result.rows] == [FAKE_RATES[2], FAKE_RATES[4]]  # each its own
    check_rates_reported(result)
    assert loader_cells(result.table()) == ["200 (100-300), 1.00x (1.00-1.00)",
                                                  "200 (150-600), 1.50x (1.00-2.00)"]


# -- the bench broken: each fixture puts one breakage in, and the check must fail there ----------

@pytest.fixture
def constant_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table that prints every store at 1.00x the first (the ratio cell true only of the first)."""
    from tilefeed.bench.suites import scale

    real = scale.ScaleResult.table

    def table(result: ScaleResult) -> str:
        return re.sub(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)", "1.00x (1.00-1.00)", real(result))

    monkeypatch.setattr(scale.ScaleResult, "table", table)


@pytest.fixture
def first_store_timed_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench that times the first store only and reports its rates for every store (every
    ratio then 1.00x, the table consistent with the JSON)."""
    from tilefeed.bench.suites import scale

    real = scale.rates

    def rates(stores: list[Path], **options: int) -> list[list[float]]:
        (runs,) = real(stores[:1], **options)
        return [list(runs) for _ in stores]

    monkeypatch.setattr(scale, "rates", rates)


@pytest.mark.parametrize("breakage", ["constant_ratio", "first_store_timed_for_all"])
def test_the_rates_check_fails_on_a_broken_bench(tmp_path: Path, faked_run: None, breakage: str,
                                                 request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(breakage)
    result = faked_scale_run(tmp_path)
    with pytest.raises(AssertionError):
        check_rates_reported(result)

