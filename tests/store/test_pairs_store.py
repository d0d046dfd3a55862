"""An image-text store (format version 4) as others read it: zarr-python alone, with tilefeed
not importable, reads its captions and fields as written, by each picture's key; ``tilefeed
info`` shows its captions, fields and labels, text and JSON; ``verify --deep`` finds it sound.
In a bucket (a local S3 server), a Loader serves the captions and fields its folder copy does,
and a caption object larger than its rows can hold is refused before it is fetched."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilefeed.pipeline import Loader
from tilefeed.pipeline.reading.reader import source_paths
from tests.helpers import caption_of, make_pairs_store, run_cli, s3_environment

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
    from tests.store.hostile_store_cases import pairs_cases

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    dict(pairs_cases())["caption holding a NUL"](copy)
    done = run_cli("verify", "--deep", str(copy))
    assert done.returncode != 0
    problems = [x for x in (done.stdout + done.stderr).splitlines() if "text.caption" in x]
    assert len(problems) == 1 and "caption 0 holds a NUL character" in problems[0], done.stdout + done.stderr


# -- in a bucket ---------------------------------------------------------------------------------------
FIELDS = ("uid", "score", "width")
URL = "s3://tilefeed/pairs"


def by_key(loader: Loader) -> dict[str, tuple[object, ...]]:
    """One epoch's (caption, uid, score, width) of each sample, by its picture's file name (the
    key its captions were written under), as the Loader's own store names it."""
    out: dict[str, tuple[object, ...]] = {}
    for _, texts, fields, ids in loader:
        keys = [Path(p).name for p in source_paths(loader.reader, ids.numpy())]
        columns = [fields[n] if isinstance(fields[n], list) else fields[n].tolist() for n in FIELDS]
        for k, key in enumerate(keys):
            assert key not in out  # each sample once an epoch
            out[key] = (texts[k], *(c[k] for c in columns))
    return out


def test_a_bucket_store_serves_the_captions_and_fields_its_folder_does(store: Path, tmp_path: Path) -> None:
    from tilefeed.bench.fixtures.netem import s3_options
    from tilefeed.store.inspection import verify
    from tilefeed.store.object_storage import ObjectStorage

    with Loader(store, 4, text="caption", fields=FIELDS, with_index=True) as here:
        want = by_key(here)
    assert sorted(want) == [f"{i:03d}.jpg" for i in range(SAMPLES)]
    assert all(want[k][0] == caption_of(k) for k in want)
    with s3_environment(tmp_path / "cache") as env:
        ObjectStorage(URL).upload_tree(store, last="zarr.json")
        options = s3_options(env["AWS_ENDPOINT_URL"])
        with Loader(URL, 4, text="caption", fields=FIELDS, with_index=True, storage_options=options,
                    cache_dir=tmp_path / "loader-cache") as there:
            assert by_key(there) == want
        assert verify(URL, deep=True) == []  # the captions and fields read from the mirror, checked
        done = run_cli("info", "--json", URL, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["texts"] == ["caption", "synthetic"]


@pytest.mark.parametrize(("array", "rows_bytes"), [("text.caption", 33 << 10), ("field.width", 64)])
def test_a_bucket_object_larger_than_its_rows_hold_is_refused_before_it_is_fetched(
        store: Path, tmp_path: Path, array: str, rows_bytes: int) -> None:
    """A caption chunk may take a caption's 32 KiB and a little more a row, a numeric field's
    64 bytes; an object past that is named, by URL, and not copied into the mirror."""
    from tilefeed.store.errors import CorruptChunkError
    from tilefeed.store.object_storage import ObjectStorage

    url = f"{URL}-{array}"
    with s3_environment(tmp_path / "cache"):
        ObjectStorage(url).upload_tree(store, last="zarr.json")
        big = SAMPLES * rows_bytes + (64 << 10)
        with ObjectStorage(url).writer(f"{array}/c/0") as f:
            f.write(bytes(big))
        with pytest.raises(CorruptChunkError, match=rf"{url}/{array}/c/0: {big} bytes, more than the"):
            Loader(url, 4, text="caption", fields=FIELDS, cache_dir=tmp_path / "loader-cache")
        assert not list((tmp_path / "loader-cache").rglob(f"{array}/c/0"))
