"""``import tilefeed`` is free: no heavy module, no change to the caller's process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = """
import sys
import numcodecs.blosc as blosc
from PIL import Image
before = (blosc.use_threads, len(Image.OPEN), len(Image.EXTENSION))
import tilefeed, tilefeed.pipeline, tilefeed.bench, tilefeed.preprocess
heavy = sorted(m for m in ("torch", "zarr", "nvidia.dali", "tilefeed.pipeline.loader.loader")
               if m in sys.modules)
assert not heavy, heavy
assert tilefeed.StoreReader.__name__ == "StoreReader" and tilefeed.__version__
import tilefeed.preprocess.images, tilefeed.store.format, tilefeed.pipeline.reading.reader
assert (blosc.use_threads, len(Image.OPEN), len(Image.EXTENSION)) == before, "global state changed"
print("ok")
"""


def test_the_root_import_loads_nothing_heavy_and_changes_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


HEAVY = ("numpy", "numcodecs", "PIL", "torch", "zarr")


def imported(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` reports in ``stderr``."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and not line.rstrip().endswith("package")}


def test_the_version_and_help_commands_load_nothing_heavy() -> None:
    for command in (["--version"], ["--help"], ["preprocess", "--help"], ["bench", "--help"]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tilefeed", *command],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        modules = imported(done.stderr)
        assert "tilefeed.cli.main" in modules, done.stderr[-2000:]
        heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
        assert not heavy, (command, heavy)


INFO = """
import sys
from tilefeed.cli.main import main
assert main(["info", sys.argv[1], "--json"]) == 0
print(sorted(m for m in ("torch", "nvidia.dali") if m in sys.modules))
"""


def test_info_does_not_load_torch_or_dali(tmp_path: Path) -> None:
    from tests.helpers import write_folder
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

    images = write_folder(tmp_path / "images", classes=2, per_class=2, size=(40, 32))
    preprocess(images, tmp_path / "store", TileSettings(tile=16), StoreSettings(shard_size=2),
               workers=1)
    done = subprocess.run([sys.executable, "-c", INFO, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"samples": 4' in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_every_public_name_resolves() -> None:
    import tilefeed
    import tilefeed.bench
    import tilefeed.pipeline

    for module in (tilefeed, tilefeed.pipeline, tilefeed.bench):
        for name in module.__all__:
            value = getattr(module, name)
            assert value is not None, (module.__name__, name)
            # each a class or function of the API (the version a string): not some other object
            assert callable(value) or (name == "__version__" and isinstance(value, str)), \
                (module.__name__, name)
