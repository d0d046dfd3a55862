from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FAULT_ARGS, write_folder



@pytest.fixture(scope="session")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("faults")
    src = write_folder(root / "src", classes=4, per_class=120, size=(160, 120))
    (src / "c1" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    reference = root / "reference"
    subprocess.run([sys.executable, "-m", "tilefeed", "preprocess", str(src), str(reference),
                    *FAULT_ARGS], check=True, timeout=300)
    return src, reference


