"""An image-text store (format version 4) as others read it: zarr-python alone, with tilefeed
not importable, reads its captions and fields as written, by each picture's key; ``tilefeed
info`` shows its captions, fields and labels, text and JSON; ``verify --deep`` finds it sound."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import caption_of, make_pairs_store, run_cli

SAMPLES = 12

# zarr-python in a process where importing tilefeed fails: nothing of tilefeed's (its codecs,
# its entry points) can take part in the read
ZARR_ALONE = textwrap.dedent("""
    import json, sys
    sys.modules["tilefeed"] = None
    import zarr
    group = zarr.open_group(sys.argv[1], mode="r")
    column = lambda name: group[name][:].tolist()
    print(json.dumps({name: column(name) for name in sys.argv[2:]}))
""")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pairs_store(tmp_path_factory.mktemp("pairs"), SAMPLES)


def test_zarr_python_without_tilefeed_reads_the_captions_and_fields_by_key(store: Path) -> None:
    names = ["source_paths", "text.caption", "text.synthetic", "field.uid", "field.score", "field.width"]
    done = subprocess.run([sys.executable, "-c", ZARR_ALONE, str(store), *names], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout)
    keys = [Path(p).name for p in read["source_paths"]]
    assert sorted(keys) == [f"{i:03d}.jpg" for i in range(SAMPLES)]  # one row per source
    numbers = [int(k.split(".")[0]) for k in keys]
    assert read["text.caption"] == [caption_of(k) for k in keys]
    assert read["text.synthetic"] == [caption_of(k, "synthetic") for k in keys]
    assert read["field.uid"] == [f"u{n:04d}" for n in numbers]
    assert read["field.score"] == [n / 4 for n in numbers]
    assert read["field.width"] == [40 + n for n in numbers]


def test_the_zarr_child_cannot_import_tilefeed(store: Path) -> None:
    """The child above reads without tilefeed: its import is refused there."""
    probe = 'import sys\nsys.modules["tilefeed"] = None\nimport zarr\nimport tilefeed.store'
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr[-2000:]


def test_info_shows_the_captions_fields_and_labels(store: Path) -> None:
    done = run_cli("info", str(store))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("texts"))
    assert "caption, synthetic" in line
    assert "uid (string), score (float64), width (int64)" in line
    assert "no class labels" in line
    done = run_cli("info", "--json", str(store))
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["format"] == "tilefeed v4"
    assert info["texts"] == ["caption", "synthetic"]
    assert info["fields"] == [{"name": "uid", "dtype": "string"}, {"name": "score", "dtype": "float64"},
                              {"name": "width", "dtype": "int64"}]
    assert info["labelled"] is False


def test_verify_deep_finds_the_store_sound(store: Path) -> None:
    done = run_cli("verify", "--deep", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sound" in done.stdout


def test_verify_deep_names_a_damaged_caption_in_one_line(store: Path, tmp_path: Path) -> None:
    import shutil

    from tests.store.hostile_store_cases import pairs_cases

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    dict(pairs_cases())["caption holding a NUL"](copy)
    done = run_cli("verify", "--deep", str(copy))
    assert done.returncode != 0
    problems = [x for x in (done.stdout + done.stderr).splitlines() if "text.caption" in x]
    assert len(problems) == 1 and "caption 0 holds a NUL character" in problems[0], done.stdout + done.stderr
