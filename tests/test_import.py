"""``import tilefeed`` is free: no heavy module, no change to the caller's process."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import numcodecs.blosc as blosc
from PIL import Image
before = (blosc.use_threads, len(Image.OPEN), len(Image.EXTENSION))
import tilefeed, tilefeed.pipeline, tilefeed.bench, tilefeed.preprocess
heavy = sorted(m for m in ("torch", "zarr", "nvidia.dali", "tilefeed.pipeline.loader") if m in sys.modules)
assert not heavy, heavy
assert tilefeed.StoreReader.__name__ == "StoreReader" and tilefeed.__version__
import tilefeed.preprocess.images, tilefeed.store.format, tilefeed.pipeline.reader
assert (blosc.use_threads, len(Image.OPEN), len(Image.EXTENSION)) == before, "global state changed"
print("ok")
"""


def test_the_root_import_loads_nothing_heavy_and_changes_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_version_command_does_not_load_torch() -> None:
    code = ("import sys\nfrom tilefeed.cli.main import main\ntry:\n    main(['--version'])\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout + done.stderr


def test_every_public_name_resolves() -> None:
    import tilefeed
    import tilefeed.bench
    import tilefeed.pipeline

    for module in (tilefeed, tilefeed.pipeline, tilefeed.bench):
        for name in module.__all__:
            assert getattr(module, name) is not None, (module.__name__, name)
