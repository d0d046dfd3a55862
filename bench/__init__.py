"""Measure data-loader wait against step time: ``bench.watch(loader)`` or ``bench.measure``."""

from tilefeed.bench.harness import RunResult, measure, watch

__all__ = ["RunResult", "measure", "watch"]
