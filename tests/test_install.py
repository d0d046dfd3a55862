"""Installed as users install it: one import name, and an offline install from a wheelhouse.

One fresh venv, built the way an offline GPU node is: torch first (the node's own), then
tilefeed from a wheelhouse for this machine's Python with ``--no-index``. A working folder with
its own ``pipeline.py``, ``bench/`` and ``preprocess.py`` then imports them and tilefeed side by
side. The same folder is tried with the editable install ``make setup`` makes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.slow

USER_CODE = textwrap.dedent("""
    import importlib.util, json, pathlib, subprocess, sys
    import bench, pipeline, preprocess           # the user's own modules, from this folder
    import tilefeed
    from tilefeed import Loader, TileDataset, preprocess_images
    assert (bench.MINE, pipeline.MINE, preprocess.MINE) == ("bench", "pipeline", "preprocess")
    assert pathlib.Path(tilefeed.__file__).parent.name == "tilefeed"
    import tilefeed.pipeline as tp
    assert tp is not pipeline and tp.Loader is Loader
    summary = preprocess_images("images", "store", workers=1)
    with Loader("store", 4, train=True, size=24) as loader:
        seen = sum(len(labels) for _, labels in loader)
    out = subprocess.run(["tilefeed", "--version"], capture_output=True, text=True,
                         check=True).stdout.strip()
    print(json.dumps({"samples": summary.tiles, "seen": seen, "version": tilefeed.__version__,
                      "cli_version": out, "dataset": len(TileDataset("store"))}))
""")


def _user_folder(root: Path) -> Path:
    work = root / "work"
    (work / "bench").mkdir(parents=True)
    (work / "pipeline.py").write_text('MINE = "pipeline"\n')
    (work / "preprocess.py").write_text('MINE = "preprocess"\n')
    (work / "bench" / "__init__.py").write_text('MINE = "bench"\n')
    (work / "check.py").write_text(USER_CODE)
    sys.path.insert(0, str(ROOT))
    try:
        from tests.helpers import write_folder
    finally:
        sys.path.remove(str(ROOT))
    write_folder(work / "images", classes=2, per_class=4)
    return work


def _run_user_code(python: Path, work: Path) -> dict[str, object]:
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run([str(python), "check.py"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _installed_top_level(python: Path) -> list[str]:
    code = ("import importlib.util as u; print([n for n in ('pipeline', 'preprocess', 'bench') "
            "if u.find_spec(n)])")
    return eval(subprocess.run([str(python), "-c", code], cwd="/", capture_output=True, text=True,
                               check=True).stdout)


def test_offline_wheelhouse_install_in_a_fresh_venv_shadows_nothing(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--python", PYTHON,
                    "--cuda", "12", "--out", str(wheelhouse)], check=True, timeout=1200)
    manifest = (wheelhouse / "MANIFEST.json").read_text()
    assert "nvidia_dali_cuda120" in manifest and '"torch"' not in manifest and "sha256" in manifest
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=1200)  # the node's own torch
    subprocess.run([*pip, "--no-index", "--find-links", str(wheelhouse), "tilefeed[cuda12]",
                    "pillow-avif-plugin", "pillow-heif", "pillow"], check=True, timeout=1200)
    assert _installed_top_level(py) == []
    result = _run_user_code(py, _user_folder(tmp_path))
    assert result["samples"] == result["seen"] == result["dataset"] == 8
    assert result["cli_version"] == f"tilefeed {result['version']}"


def test_editable_install_shadows_nothing(tmp_path: Path) -> None:
    py = Path(sys.executable)
    assert _installed_top_level(py) == []
    result = _run_user_code(py, _user_folder(tmp_path))
    assert result["samples"] == result["seen"] == 8
