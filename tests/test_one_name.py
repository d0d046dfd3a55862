"""No module of the project loads under two names: run from a checkout's root, the folders
``pipeline/``, ``preprocess/`` and ``bench/`` are importable as themselves, and a second copy
of a module is a second graph pool, cache and set of globals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["store", "preprocess", "pipeline", "bench", "cli"])
def test_a_folder_imported_by_its_own_name_is_refused(package: str) -> None:
    r = subprocess.run([sys.executable, "-c", f"import {package}.__init__"], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and f"import tilefeed.{package}, not {package}" in r.stderr


def test_every_module_has_one_name() -> None:
    code = """
import importlib, pkgutil, sys, tilefeed
for pkg in ("store", "preprocess", "pipeline", "bench", "cli"):
    module = importlib.import_module(f"tilefeed.{pkg}")
    for info in pkgutil.iter_modules(module.__path__, f"tilefeed.{pkg}."):
        try:
            importlib.import_module(info.name)
        except ImportError:
            pass  # an optional dependency (FFCV, DALI's GPU parts)
files = {}
for name, m in list(sys.modules.items()):
    path = getattr(m, "__file__", None)
    top = name.split(".")[0]
    if path and ("tilefeed" in name or top in ("store", "preprocess", "pipeline", "bench", "cli")):
        files.setdefault(__import__("os").path.realpath(path), []).append(name)
twice = {f: n for f, n in files.items() if len(n) > 1}
print(twice or "ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok", r.stdout
