"""No module of the project loads under two names: run from a checkout's root, the folders
``pipeline/``, ``preprocess/`` and ``bench/`` are importable as themselves, and a second copy
of a module is a second graph pool, cache and set of globals.

The guard is the ``if __name__ != "tilefeed.<package>"`` at the top of each package's
``__init__``. The checks here run in a fresh interpreter whose working folder is a checkout's
root (where the bare names resolve to the folders), against this checkout and against copies of
it whose guard was removed or turned around, to show that they fail without a working guard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("store", "preprocess", "pipeline", "bench", "cli")

# Imports every module of every package by its tilefeed name, then tries each again by its bare
# name (``pipeline.loader.loader``), as code run from a checkout's root could. Nothing is swallowed
# but a third-party module missing (an optional dependency such as FFCV); every other failure is
# reported, so a guard that refuses the right name too cannot pass for one that works.
_SURVEY = """
import importlib, json, os, pkgutil, sys
packages = sys.argv[1].split(",")
project = {"tilefeed", *packages}
report = {"tilefeed": None, "imported": [], "failed": {}, "optional": {}, "bare": {}, "twice": {}}

def attempt(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] in project:
            return f"{type(error).__name__}: {error}"
        report["optional"][name] = str(error)
        return None
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return ""

import tilefeed
report["tilefeed"] = os.path.realpath(tilefeed.__file__)
for pkg in packages:
    names = [f"tilefeed.{pkg}"]
    failed = attempt(names[0])
    if failed:
        report["failed"][names[0]] = failed
        continue
    module = sys.modules[names[0]]
    # walk_packages skips a subpackage that fails to import unless told: every failure is kept
    walked = pkgutil.walk_packages(module.__path__, f"tilefeed.{pkg}.",
                                   onerror=lambda name: report["failed"].setdefault(name, "walk"))
    names += [info.name for info in walked]
    for name in names:
        failed = attempt(name)
        if failed:
            report["failed"][name] = failed
        elif failed == "":
            report["imported"].append(name)
    for name in names:
        bare = name.removeprefix("tilefeed.")
        try:
            importlib.import_module(bare)
        except ImportError as error:
            report["bare"][bare] = str(error)
        else:
            report["bare"][bare] = None  # loaded: a second copy
files = {}
for name, m in list(sys.modules.items()):
    path = getattr(m, "__file__", None)
    if path and name.split(".")[0] in project:
        files.setdefault(os.path.realpath(path), []).append(name)
report["twice"] = {f: n for f, n in files.items() if len(n) > 1}
print(json.dumps(report))
"""


def modules_on_disk(root: Path) -> set[str]:
    """The tilefeed names of every module file in the checkout at ``root``."""
    names = set()
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join(("tilefeed", *parts)))
    return names


def survey(root: Path) -> dict[str, Any]:
    """Run ``_SURVEY`` from the checkout at ``root``, with its ``src`` the only tilefeed on the path."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    r = subprocess.run([sys.executable, "-c", _SURVEY, ",".join(PACKAGES)], cwd=root, env=env,
                       capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    report: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return report


def check_every_module_has_one_name(root: Path) -> None:
    """Every module of the checkout at ``root`` imports by its tilefeed name, is refused by its
    bare name with the guard's message, and no file is loaded under two names."""
    report = survey(root)
    assert report["tilefeed"] == str((root / "src" / "tilefeed" / "__init__.py").resolve())
    assert not report["failed"], report["failed"]
    # every module file was imported, but those that need an absent optional dependency
    assert set(report["imported"]) | set(report["optional"]) == modules_on_disk(root)
    assert len(report["imported"]) > len(report["optional"])  # the optional are a few, not all
    wrong = {bare: message for bare, message in report["bare"].items()
             if message is None or f"import tilefeed.{bare.split('.')[0]}, not " not in message}
    assert not wrong, wrong  # None: loaded under the bare name
    assert len(report["bare"]) == len(modules_on_disk(root))
    assert not report["twice"], report["twice"]


def check_folder_refused(root: Path, package: str) -> None:
    """``import <package>`` from the checkout's root fails with the guard's message."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    r = subprocess.run([sys.executable, "-c", f"import {package}.__init__"], cwd=root, env=env,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and f"import tilefeed.{package}, not {package}" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("package", PACKAGES)
def test_a_folder_imported_by_its_own_name_is_refused(package: str) -> None:
    check_folder_refused(ROOT, package)


def test_every_module_has_one_name() -> None:
    check_every_module_has_one_name(ROOT)


# -- the same checks against broken builds: each must fail there ---------------------------------

def _remove_guard(text: str, package: str) -> str:
    """The package's ``__init__`` without its guard (the ``if`` and its ``raise``)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f'if __name__ != "tilefeed.{package}"'))
    end = start + 1
    while lines[end].startswith(" "):  # the raise, over its lines
        end += 1
    return "".join(lines[:start] + lines[end:])


def _turn_guard_around(text: str, package: str) -> str:
    """A guard that refuses the tilefeed name and lets the bare one through."""
    guard = f'if __name__ != "tilefeed.{package}"'
    assert guard in text
    return text.replace(guard, f'if __name__ == "tilefeed.{package}"')


BREAKAGES: dict[str, Callable[[str, str], str]] = {
    "removed": _remove_guard,
    "turned around": _turn_guard_around,
}


def copy_checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's packages and ``src`` (its relative links kept, so the copy's
    ``tilefeed`` is the copy's folders)."""
    root = tmp_path / "checkout"
    for folder in (*PACKAGES, "src"):
        shutil.copytree(ROOT / folder, root / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def broken_checkout(tmp_path: Path, package: str, breakage: str) -> Path:
    """``copy_checkout`` with ``package``'s guard broken (``BREAKAGES``)."""
    root = copy_checkout(tmp_path)
    init = root / package / "__init__.py"
    broken = BREAKAGES[breakage](init.read_text(), package)
    assert broken != init.read_text()
    init.write_text(broken)
    return root


def test_the_checks_pass_on_an_unbroken_copy(tmp_path: Path) -> None:
    """So that a failure below is the breakage's, not the copy's."""
    root = copy_checkout(tmp_path)
    check_every_module_has_one_name(root)
    check_folder_refused(root, "pipeline")


@pytest.mark.parametrize("package,breakage", [("pipeline", "removed"), ("bench", "removed"),
                                              ("preprocess", "removed"), ("pipeline", "turned around")])
def test_the_one_name_check_fails_without_a_working_guard(tmp_path: Path, package: str, breakage: str) -> None:
    root = broken_checkout(tmp_path, package, breakage)
    with pytest.raises(AssertionError):
        check_every_module_has_one_name(root)
    with pytest.raises(AssertionError):
        check_folder_refused(root, package)
