"""``tilefeed doctor`` never tracebacks, and speaks the words of the install it finds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BLOCKED_RUN = """
import importlib.abc, sys
BLOCKED = {blocked!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"No module named {{name!r}}")
        return None

sys.meta_path.insert(0, Block())
import tilefeed.cli.doctor as doctor
if {pip!r}:
    doctor.checkout = lambda: None  # as a pip install: no source checkout behind it
from tilefeed.cli.main import main
sys.exit(main(["doctor", "--json"]))
"""


def doctor_without(blocked: list[str], pip: bool = True,
                   env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, object]], str]:
    done = subprocess.run([sys.executable, "-c", BLOCKED_RUN.format(blocked=blocked, pip=pip)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]} if done.stdout.strip() else {}
    return done.returncode, checks, done.stderr


@pytest.mark.parametrize("blocked", [["PIL"], ["torch"], ["nvidia.dali"], ["PIL", "torch", "nvidia.dali"]])
def test_a_missing_pil_dali_or_torch_is_a_line_never_a_traceback(blocked: list[str]) -> None:
    code, checks, err = doctor_without(blocked)
    assert "Traceback" not in err and checks, err
    assert code == 1  # something tilefeed needs is missing: a problem, said in a line
    names = {"PIL": "PIL", "torch": "torch", "nvidia.dali": "DALI"}
    for module in blocked:  # each missing one is its own line, with a pip user's fix
        check = checks[names[module]]
        assert not check["ok"] and check["required"] and "cannot import" in str(check["detail"]) + str(
            check["fix"]) or "does not import" in str(check["detail"]), check
        assert "pip install" in str(check["fix"]) and "make setup" not in str(check["fix"]), check


def test_nothing_missing_is_no_problem_and_the_fixes_name_the_checkout() -> None:
    code, checks, err = doctor_without([], pip=False)
    assert code == 0 and "Traceback" not in err, err
    assert checks["PIL"]["ok"] and not checks["GPU"]["required"]  # no GPU: information
    simd = checks.get("pillow-simd")
    assert simd is None or (not simd["required"] and "make setup" in str(simd["fix"]))


@pytest.mark.parametrize("value", ["1", "0", "maybe"])
def test_the_device_graph_switch_is_said_when_set(value: str) -> None:
    """``TILEFEED_DEVICE_GRAPH=1`` is a line (information); unset or 0, no line; another value
    a problem with its fix."""
    code, checks, err = doctor_without([], pip=False, env={"TILEFEED_DEVICE_GRAPH": value})
    assert "Traceback" not in err, err
    if value == "0":
        assert "graph" not in checks and code == 0
    elif value == "1":
        assert code == 0 and "GPU's graph on DALI's CPU backend" in str(checks["graph"]["detail"])
    else:
        graph = checks["graph"]
        assert code == 1 and not graph["ok"] and "TILEFEED_DEVICE_GRAPH" in str(graph["fix"])


def test_a_missing_plugin_is_a_plain_line_and_nothing_strays_onto_stderr() -> None:
    """Without pillow-heif (and pillow-avif-plugin) the codec lines say what is missing (not a
    KeyError), AVIF is credited to whoever reads it, and doctor prints nothing on stderr."""
    code, checks, err = doctor_without(["pillow_heif", "pillow_avif"], pip=False)
    assert err == "", err
    heif = checks["codec heif"]
    assert not heif["ok"] and not heif["required"] and "KeyError" not in str(heif["detail"])
    assert "no reader or writer for HEIF is installed" in str(heif["detail"]), heif
    avif = checks["codec avif"]
    assert "pillow-avif plugin" not in str(avif["detail"]), avif  # not installed: no credit
    assert code == 0 or [c for c in checks.values() if c["required"] and not c["ok"]], checks


def test_what_a_codec_library_prints_is_caught_into_its_line(capfd: pytest.CaptureFixture[str]) -> None:
    """A C library's own words on file descriptor 2 (libtiff's ": WEBP compression support is not
    configured.") stay off the screen and become the failing check's detail."""
    import os

    from tilefeed.cli.doctor import _stderr_caught

    with _stderr_caught() as said:
        os.write(2, b": WEBP compression support is not configured.\n")
        words = said()
    assert words == ": WEBP compression support is not configured.\n"
    assert capfd.readouterr().err == ""
    from tilefeed.cli.doctor import _detail

    error = OSError("encoder error -2 when writing image file")
    error.add_note(words.strip(" :\n"))
    assert _detail(error) == ("OSError: encoder error -2 when writing image file "
                              "(WEBP compression support is not configured.)")


@pytest.mark.parametrize("cuda,extra", [("13.0", "cuda13"), ("12.8", "cuda12"), (None, "cuda13")])
def test_one_rule_picks_the_extra_and_every_page_states_it(cuda: str | None, extra: str) -> None:
    """The extra is the installed torch's CUDA major, ``cuda13`` for a CPU build: the function
    doctor and the Loader's error use, and the words of the README and the install page."""
    from pathlib import Path

    from tilefeed.pipeline.device import dali_extra

    assert dali_extra(cuda) == extra
    root = Path(__file__).resolve().parents[2]
    assert "13.x: cuda13, 12.x: cuda12, None: cuda13" in (root / "README.md").read_text()
    assert "a CPU build of torch: `cuda13`" in (root / "docs" / "install.md").read_text()


def test_no_temporary_folder_leaves_the_checks_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where stderr cannot be caught (no temporary folder), the round trips run uncaught rather
    than fail: a working codec stays ok."""
    import tempfile

    from tilefeed.cli import doctor

    def refuse() -> None:
        raise OSError("no usable temporary directory")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    assert doctor.PIL_CODECS["png"][0]() == "reads and writes PNG"
