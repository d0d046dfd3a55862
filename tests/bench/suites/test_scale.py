"""``tilefeed bench scale`` on two tiny sets: every figure comes back for each size, the rates
from one process that times each store's Loader in turn."""

from __future__ import annotations

from pathlib import Path

import pytest


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
    stores = [Path(row.store) for row in result.rows]
    turns = rates(stores, batch_size=4, warm=1, timed=2, rounds=4)
    assert [len(runs) for runs in turns] == [4, 4]
