"""Fail when a module of the package is longer than the ceiling (docstrings and comments
included): ``python tools/module_lines.py 450``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "preprocess", "pipeline", "bench", "cli", "src/tilefeed")


def main() -> int:
    ceiling = int(sys.argv[1])
    over = sorted((n, str(p.relative_to(ROOT))) for package in PACKAGES
                  for p in (ROOT / package).glob("*.py")
                  if (n := len(p.read_text().splitlines())) > ceiling)
    for lines, path in over:
        print(f"{path}: {lines} lines, over {ceiling}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
