"""The benchmark tables cannot drift from their data: every table of docs/benchmarks.md and the
README's headline table is what ``tools/render_benchmarks.py`` draws from the committed JSON, every
table stands between data markers, and every JSON file carries its provenance."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "benchmarks.md", ROOT / "README.md"]


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "tools" / "render_benchmarks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_page_is_what_its_data_draws(tool: ModuleType, page: Path) -> None:
    text = page.read_text()
    assert tool.BLOCK.search(text), f"{page.name} has no data block"
    assert tool.render_page(text) == text, \
        f"{page.name} differs from its data: run python tools/render_benchmarks.py"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_stands_in_a_data_block(tool: ModuleType, page: Path) -> None:
    assert tool.unmarked_tables(page.read_text()) == [], \
        f"{page.name}: a table outside <!-- data: NAME --> ... <!-- /data --> (line numbers above)"


def test_every_data_file_says_where_it_came_from(tool: ModuleType) -> None:
    names = {m.group(1) for page in PAGES for m in tool.OPENING.finditer(page.read_text())}
    assert names <= set(tool.TABLES), names - set(tool.TABLES)
    for name in names:
        for path in tool.TABLES[name].files:
            provenance = json.loads((ROOT / path).read_text())["provenance"]
            assert provenance["command"].startswith("tilefeed bench"), path
            assert {"commit", "date", "machine", "load_before", "load_after"} <= set(provenance), path
            machine = set(provenance["machine"])
            assert {"cores", "cpu", "memory_gib", "python", "torch", "dali", "pil"} <= machine, path


def test_a_changed_figure_an_unmarked_table_and_unknown_data_are_caught(tool: ModuleType) -> None:
    # negative controls: each of the checks above fails on a page that breaks it
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    block = tool.BLOCK.search(page)
    assert block
    body = block.group("body")
    figure = next(line for line in body.splitlines()
                  if line.startswith("| ") and any(c.isdigit() for c in line))
    edited = page.replace(figure, figure.replace("|", "| 1", 1), 1)
    assert tool.render_page(edited) != edited
    assert tool.unmarked_tables(page + "\n| a | b |\n| --- | --- |\n| 1 | 2 |\n") != []
    assert tool.unmarked_tables("```text\n| in a fence |\n```\n") == []
    with pytest.raises(ValueError, match="no table named"):
        tool.render_page("<!-- data: nowhere -->\n<!-- /data -->\n")


def test_a_file_without_provenance_is_refused(tool: ModuleType) -> None:
    with pytest.raises(ValueError, match="no provenance"):
        tool.provenance_line({"runs": []})
