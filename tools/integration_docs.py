"""Write the swaps and flag tables of docs/integrations.md and docs/detection.md from their
sources: each script's ``tests/scripts/<script>/swap.patch`` and its adapter table
(``TIMM_FLAGS``, ``TORCHVISION_FLAGS``, ``TORCHVISION_DETECTION_FLAGS``, ``OPEN_CLIP_FLAGS``), between
``<!-- swap: NAME -->`` / ``<!-- flags: NAME -->`` and ``<!-- /generated -->`` markers.
``tests/pipeline/recipe/test_adapters.py`` fails until the pages match: run
``python tools/integration_docs.py`` after changing a patch or a table.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "docs" / "integrations.md", ROOT / "docs" / "detection.md")
SCRIPTS = ("timm", "torchvision", "torchvision_detection", "open_clip")
BLOCK = re.compile(r"(<!-- (swap|flags): (\w+) -->\n).*?(<!-- /generated -->)", re.S)


def flags_table(script: str) -> str:
    """The script's adapter table as a markdown table."""
    from tilefeed.pipeline.recipe.adapters import (TIMM_FLAGS, TORCHVISION_DETECTION_FLAGS, TORCHVISION_FLAGS,
                                                   table)
    from tilefeed.pipeline.recipe.open_clip_adapter import OPEN_CLIP_FLAGS

    rows = table({"timm": TIMM_FLAGS, "torchvision": TORCHVISION_FLAGS,
                  "torchvision_detection": TORCHVISION_DETECTION_FLAGS, "open_clip": OPEN_CLIP_FLAGS}[script])
    lines = ["| flag | Loader | what |", "| --- | --- | --- |"]
    lines += [f"| `{flag}` | {verdict} | {meaning} |" for flag, verdict, meaning in rows]
    return "\n".join(lines) + "\n"


def swap(script: str) -> str:
    """The script's committed swap patch as a diff block."""
    patch = (ROOT / "tests" / "scripts" / script / "swap.patch").read_text()
    return f"```diff\n{patch.rstrip()}\n```\n"


def rendered(text: str) -> str:
    """``text`` with every generated block written anew from its source."""
    def fill(match: re.Match[str]) -> str:
        kind, script = match.group(2), match.group(3)
        if script not in SCRIPTS:
            raise SystemExit(f"no script named {script!r} (known: {', '.join(SCRIPTS)})")
        body = swap(script) if kind == "swap" else flags_table(script)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(fill, text)


def main() -> int:
    for page in PAGES:
        page.write_text(rendered(page.read_text()))
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
