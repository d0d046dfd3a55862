"""The layout table of the development page (docs/development.md) is the tree: every path it
names exists, and every module of the package is named there (itself, or a folder holding it);
and no module imports itself back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the page that holds the "## Layout" section and its table
LAYOUT_PAGE = ROOT / "docs" / "development.md"
PACKAGES = ("store", "preprocess", "pipeline", "bench", "cli")


def table_paths(page: str) -> list[str]:
    """The backticked paths in the rows of the Layout section's table."""
    section = page[page.index("## Layout"):]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return [path for row in rows[1:] for path in re.findall(r"`([\w./-]+/|[\w./-]+\.py)`", row.split("|")[2])]


def unnamed_modules(paths: list[str], root: Path) -> list[str]:
    """Modules of the packages that no path of the table names."""
    modules = [str(p.relative_to(root)) for package in PACKAGES for p in sorted((root / package).rglob("*.py"))
               if p.name != "__init__.py"]
    return [m for m in modules if not any(m == p or (p.endswith("/") and m.startswith(p)) for p in paths)]


def test_the_layout_table_names_every_module_and_only_what_exists() -> None:
    paths = table_paths(LAYOUT_PAGE.read_text())
    assert len(paths) > 30, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"the layout table of {LAYOUT_PAGE.name} names what is not there: {missing}"
    assert not unnamed_modules(paths, ROOT), f"modules the layout table of {LAYOUT_PAGE.name} does not name"


def test_the_check_finds_a_module_left_out_and_a_path_that_moved(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "format.py").write_text("")
    (tmp_path / "store" / "new.py").write_text("")
    for package in PACKAGES[1:]:
        (tmp_path / package).mkdir()
    assert unnamed_modules(["store/format.py"], tmp_path) == ["store/new.py"]
    assert unnamed_modules(["store/"], tmp_path) == []
    page = "## Layout\n\n| concept | where |\n| --- | --- |\n| a | `store/format.py`, `store/` |\n"
    assert table_paths(page) == ["store/format.py", "store/"]


def test_no_module_imports_itself_back() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "import_cycles.py")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def unlisted_packages(listed: list[str], root: Path) -> list[str]:
    """Folders of the packages (each with an ``__init__.py``) the wheel's package list leaves out."""
    found = [".".join(("tilefeed", *p.parent.relative_to(root).parts)) for package in PACKAGES
             for p in sorted((root / package).rglob("__init__.py"))]
    return [name for name in found if name not in listed]


def test_the_wheel_lists_every_package_folder() -> None:
    """setuptools installs only the packages pyproject.toml lists: a new room left out of it is a
    wheel that cannot import the Loader."""
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert unlisted_packages(listed, ROOT) == []
    short = [name for name in listed if name != "tilefeed.pipeline.recipe"]
    assert unlisted_packages(short, ROOT) == ["tilefeed.pipeline.recipe"]  # the check sees a room left out
