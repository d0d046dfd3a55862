"""Name the modules of the package longer than a reader may want (docstrings and comments
included): ``python tools/module_lines.py 600``. A warning for a reader to judge, never a failure:
a module is as long as its one job needs."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "preprocess", "pipeline", "bench", "cli", "src/tilefeed")


def long_modules(threshold: int) -> list[tuple[int, str]]:
    """(lines, path) of every module over ``threshold`` lines, longest first."""
    return sorted(((n, str(p.relative_to(ROOT))) for package in PACKAGES
                   for p in (ROOT / package).rglob("*.py")
                   if (n := len(p.read_text().splitlines())) > threshold), reverse=True)


def main() -> int:
    threshold = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    for lines, path in long_modules(threshold):
        print(f"warning: {path}: {lines} lines, over {threshold}: is it still one job?")
    return 0


if __name__ == "__main__":
    sys.exit(main())
