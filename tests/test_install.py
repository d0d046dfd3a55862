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


def _quickstart(readme: str) -> list[tuple[str, str]]:
    """The README's quickstart as (language, code), in order: its python and sh blocks."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.test_docs import blocks, commands
    finally:
        sys.path.remove(str(ROOT))
    start = readme.index("## Quickstart")
    section = readme[start : readme.index("\n## ", start + 1)]
    steps = []
    for block in blocks(section, "README.md"):
        if block.lang == "python":
            steps.append(("python", block.code))
        elif block.lang in ("sh", "bash"):
            steps.append(("sh", "set -e\n" + "\n".join(commands(block.code)) + "\n"))
    return steps


def test_the_wheel_in_a_fresh_venv_runs_the_quickstart_as_written_without_root(tmp_path: Path) -> None:
    """The README's install words with plain Pillow from the index (no pillow-simd, no make): the
    extra picked by the installed torch's CUDA, the rule the README states, then the README's
    quickstart, step by step, as an unprivileged user, and ``tilefeed doctor`` exiting 0 with
    nothing on stderr."""
    import shutil
    import tempfile

    wheels = tmp_path / "wheels"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(ROOT)], check=True, timeout=600)
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = wheels.glob("tilefeed-*.whl")
    # a folder an unprivileged user can reach: pytest's own tmp_path is root's alone
    home = Path(tempfile.mkdtemp(prefix="tilefeed-quickstart-"))
    try:
        home.chmod(0o755)
        # the system's Python: pytest's may live under /root, which an unprivileged user cannot enter
        system = Path(f"/usr/bin/python{PYTHON}")
        if not system.exists():
            pytest.skip(f"no system Python {PYTHON} for an unprivileged user to run")
        venv = home / "venv"
        subprocess.run([str(system), "-m", "venv", str(venv)], check=True, env=clean)
        py = venv / "bin" / "python"
        pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # the checkout's own path, if the caller's environment names it, must not count as installed
        subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=1200, env=clean)
        readme = (ROOT / "README.md").read_text()
        assert "13.x: cuda13, 12.x: cuda12, None: cuda13" in readme  # the rule, as the README words it
        cuda = subprocess.run([str(py), "-c", "import torch; print(torch.version.cuda)"], capture_output=True,
                              text=True, check=True, env=clean).stdout.strip()
        extra = "cuda13" if cuda == "None" else f"cuda{cuda.split('.')[0]}"
        subprocess.run([*pip, f"tilefeed[{extra}] @ {wheel.as_uri()}"], check=True, timeout=1200, env=clean)
        work = home / "work"
        sys.path.insert(0, str(ROOT))
        try:
            from tests.helpers import write_folder
        finally:
            sys.path.remove(str(ROOT))
        write_folder(work / "images" / "train", classes=2, per_class=8, size=(80, 60))
        write_folder(work / "images" / "val", classes=2, per_class=4, size=(80, 60), seed=1)
        subprocess.run(["chown", "-R", "nobody:nogroup", str(work)], check=True)
        env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}
        for k, (lang, code) in enumerate(_quickstart((ROOT / "README.md").read_text())):
            script = work / f"step{k}.{'py' if lang == 'python' else 'sh'}"
            script.write_text(code)
            argv = [str(py), script.name] if lang == "python" else ["bash", script.name]
            done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                   "--inh-caps=-all", "--bounding-set=-all", *argv],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"quickstart step {k} ({lang}):\n{code}\n{done.stdout}\n{done.stderr}"
        pil = subprocess.run([str(py), "-c", "import PIL; print(PIL.__version__)"], capture_output=True,
                             text=True, check=True).stdout
        assert "post" not in pil  # plain Pillow, as pip gave it
        doctor = subprocess.run([str(venv / "bin" / "tilefeed"), "doctor"], env=env, capture_output=True,
                                text=True, timeout=300)
        assert "Traceback" not in doctor.stdout + doctor.stderr and "make setup" not in doctor.stdout
        assert doctor.returncode == 0, doctor.stdout  # plain Pillow, no GPU: nothing wrong
        assert doctor.stderr == "", doctor.stderr  # no library's own words past the report
        assert f"DALI's extra is tilefeed[{extra}]" in doctor.stdout, doctor.stdout
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_the_docs_build_from_their_requirements_without_torch(tmp_path: Path) -> None:
    """``pip install -r docs/requirements.txt`` in a fresh venv pulls no torch (nor DALI), and
    ``mkdocs build --strict`` builds the site from it: mkdocstrings reads the source unimported."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=clean)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                    str(ROOT / "docs" / "requirements.txt")], check=True, timeout=1200, env=clean)
    probe = "import importlib.util as u; print([m for m in ('torch', 'nvidia', 'tilefeed') if u.find_spec(m)])"
    found = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True,
                           env=clean).stdout.strip()
    assert found == "[]", found
    built = subprocess.run([str(venv / "bin" / "mkdocs"), "build", "--strict", "--quiet", "-d",
                            str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**clean, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "api" / "index.html").is_file()
