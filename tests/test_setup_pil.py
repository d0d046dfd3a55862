"""``make setup``'s PIL step: pillow-simd where it can be built, else plain Pillow with one line,
never a failure for want of root or headers. Run with stand-ins for the system's commands."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stand_ins(folder: Path, *, uid: int, headers: bool, simd_compiles: bool = True,
              simd_installed: bool = False) -> Path:
    """Commands on a PATH of their own: ``id``, ``pkg-config``, apt's, and a Python whose pip
    records what it was asked to do."""
    folder.mkdir()
    calls = folder / "calls"
    scripts = {
        "id": f"echo {uid}",
        "pkg-config": "exit 0" if headers else "exit 1",
        "apt-get": f"echo apt-get \"$@\" >> {calls}",
        "apt-cache": "exit 0",
        "dpkg": "exit 0",
        "python": ('case "$*" in *"pip show"*) exit ' + ("0" if simd_installed else "1") + ";; esac\n")
                  + f'echo "$@" >> {calls}\n' + (
            "" if simd_compiles else 'case "$*" in *"wheel --no-deps --no-cache-dir"*) exit 1;; esac\n'
        ) + "exit 0",
    }
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def install_pil(bin_dir: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["bash", str(ROOT / "tools" / "install-pil.sh"), str(bin_dir / "python")],
                          capture_output=True, text=True, env=env, timeout=60)
    calls = bin_dir / "calls"
    return done, calls.read_text() if calls.exists() else ""


def test_without_root_or_headers_plain_pillow_stays_in_one_line(tmp_path: Path) -> None:
    done, calls = install_pil(stand_ins(tmp_path / "bin", uid=1000, headers=False))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("make setup: keeping plain Pillow, pillow-simd not built: ")
    assert "sudo apt-get install" in lines[0]
    assert "pillow-simd" not in calls and "apt-get" not in calls  # nothing built, nothing installed


def test_with_the_headers_pillow_simd_replaces_pillow(tmp_path: Path) -> None:
    done, calls = install_pil(stand_ins(tmp_path / "bin", uid=1000, headers=True))
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    built = calls.index("wheel --no-deps --no-cache-dir")  # built first, swapped in once built
    assert built < calls.index("uninstall -y pillow pillow-simd") < calls.index("install --no-deps")


def test_as_root_the_headers_are_installed_first(tmp_path: Path) -> None:
    done, calls = install_pil(stand_ins(tmp_path / "bin", uid=0, headers=False))
    assert done.returncode == 0, done.stderr
    assert calls.index("apt-get install") < calls.index("wheel --no-deps --no-cache-dir")


def test_a_failed_compile_falls_back_to_plain_pillow_in_one_line(tmp_path: Path) -> None:
    done, calls = install_pil(stand_ins(tmp_path / "bin", uid=1000, headers=True, simd_compiles=False))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("make setup: keeping plain Pillow, pillow-simd did not compile")
    assert "uninstall" not in calls  # plain Pillow left whole: nothing was swapped


def test_an_earlier_pillow_simd_is_not_left_beside_plain_pillow(tmp_path: Path) -> None:
    """A venv set up before (pillow-simd), where the headers are gone now: plain Pillow alone."""
    done, calls = install_pil(stand_ins(tmp_path / "bin", uid=1000, headers=False, simd_installed=True))
    assert done.returncode == 0, done.stderr
    assert calls.index("uninstall -y pillow pillow-simd") < calls.index("install pillow")
