"""FFCV's side of ``tilefeed bench loader --peer ffcv`` runs as a script from its own file, in a
Python that may hold FFCV (the loader bench's tests play it with a stand-in)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


@pytest.mark.skipif(importlib.util.find_spec("ffcv") is not None, reason="FFCV is installed here")
def test_the_peer_script_looks_for_ffcv_rather_than_itself(tmp_path: Path) -> None:
    """Run as a script, ``ffcv.py``'s folder leads the path: unless the script takes it off,
    ``import ffcv`` finds the script itself, which is no package. Where FFCV is not installed,
    the script must stop for want of FFCV."""
    from tilefeed.bench.peers import ffcv

    script = Path(ffcv.__file__)
    assert script.name == "ffcv.py" and script.is_file()  # the file FfcvPeer runs
    np.save(tmp_path / "tiles.npy", np.zeros((2, 8, 8, 3), np.uint8))
    np.save(tmp_path / "labels.npy", np.zeros(2, np.int64))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "No module named 'ffcv'" in done.stderr and "is not a package" not in done.stderr, done.stderr
