"""``tilefeed bench schedule``: the ramp's epochs fit the fixed run's time, and a small run
reports both trainings."""

from __future__ import annotations

import pytest

from tilefeed.bench.suites.resize_schedule import FIXED, RAMPED, bench_schedule, plan_ramp, ramp_sizes


def test_the_ramp_takes_the_most_epochs_that_fit_the_budget() -> None:
    costs = {32: 1.0, 48: 2.0, 64: 4.0}
    epochs, schedule = plan_ramp(costs, 40.0, 32, 64, 16)  # the fixed run: 10 epochs at 64 px
    spent = sum(costs[schedule(e)] for e in range(epochs))
    assert spent <= 40.0 and epochs > 10
    longer = plan_ramp(costs, 1e9, 32, 64, 16)[0]
    assert longer > epochs  # not capped by the budget's first fit
    sizes = [schedule(e) for e in range(epochs)]
    assert sizes[0] == 32 and sizes[-1] == 64 and sizes == sorted(sizes)
    assert sizes.index(64) >= round(0.7 * epochs)  # the low size for most of the run
    assert plan_ramp(costs, 0.5, 32, 64, 16)[0] == 1  # always one epoch


@pytest.mark.parametrize("low", [8, 24, 32, 40, 48, 60, 64])
def test_every_size_a_planned_ramp_takes_is_timed(low: int) -> None:
    sizes = ramp_sizes(low, 64, 16)
    assert sizes[0] == low and sizes[-1] == 64
    for epochs in (1, 5, 13, 40):
        _, schedule = plan_ramp(dict.fromkeys(sizes, 1.0), float(epochs), low, 64, 16)
        assert {schedule(e) for e in range(epochs)} <= set(sizes)


@pytest.mark.slow
def test_a_small_schedule_bench_reports_both_trainings() -> None:
    result = bench_schedule(train_count=32, val_count=16, epochs=2, seeds=2, batch=8)
    assert set(result.epoch_seconds) == {32, 48, 64} and all(s > 0 for s in result.epoch_seconds.values())
    assert result.epochs[FIXED] == 2 and result.sizes[FIXED] == [64, 64]
    assert result.sizes[RAMPED][0] == 32 and result.epochs[RAMPED] >= 1
    for name in (FIXED, RAMPED):
        assert len(result.accuracy[name]) == 2 and all(0 <= a <= 1 for a in result.accuracy[name])
        assert len(result.seconds[name]) == 2
    table = result.table()
    assert "| fixed size | 2 | 64 px |" in table and "| ramp |" in table
