"""Before and after a change, side by side: each figure's median over the runs after against the
range of the runs before (``python tools/compare_runs.py DIR``, DIR holding ``before-*.json`` and
``after-*.json`` of ``tilefeed bench`` (stall) and ``tilefeed bench loader`` runs).

A figure passes when the median of its runs after lies within the range of its runs before (for
a stall, or at or below its top). Prints one line per figure and exits 1 when one does not pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def figures(path: Path) -> dict[str, float]:
    """The figures of one run's JSON: the tilefeed stall of a ``tilefeed bench`` run, or each
    loader's rate (samples/s) of a ``tilefeed bench loader`` run."""
    data = json.loads(path.read_text())
    if "runs" in data:  # tilefeed bench: one run per loader
        return {f"stall, {run['loader']}": run["stall_fraction"] for run in data["runs"]}
    return {f"img/s, {name}": rate for name, rate in data["rates"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the folder of before-*.json and after-*.json runs")
    args = parser.parse_args(argv)
    sides: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for side, named in sides.items():
        for path in sorted(args.folder.glob(f"{side}-*.json")):
            for name, value in figures(path).items():
                named.setdefault(name, []).append(value)
    failed = 0
    for name, before in sides["before"].items():
        after = sides["after"].get(name, [])
        if not after:
            continue
        median, low, high = statistics.median(after), min(before), max(before)
        stall = name.startswith("stall")
        ok = median <= high if stall else low <= median <= high
        failed += not ok
        unit = "{:.2%}" if stall else "{:,.0f}"
        runs, middle = ", ".join(unit.format(v) for v in after), unit.format(statistics.median(before))
        print(f"{'ok  ' if ok else 'OFF '} {name}: after median {unit.format(median)} (runs {runs}); "
              f"before {unit.format(low)}-{unit.format(high)} (median {middle})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
