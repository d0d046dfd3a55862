"""Shards written by img2dataset itself (run from its own venv: `make img2dataset-venv`) from URLs
served on 127.0.0.1, some of them missing (404) or not a picture, preprocess into a store whose
every caption, field and tile belongs to its source's key: joined by key through img2dataset's
own records (its ``.json`` per sample, its ``.parquet`` per shard), never by order, since its
download threads write a shard's samples in the order they finish."""

from __future__ import annotations

import csv
import functools
import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers import photo, psnr, run_cli
from tilefeed.store import format as fmt

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

IMG2DATASET = Path(__file__).resolve().parents[2] / ".img2dataset-venv" / "bin" / "img2dataset"
COUNT, PER_SHARD = 14, 5  # three shards
MISSING, GARBAGE, PNG, SILENT = {3, 8, 12}, 6, 10, 5  # SILENT: a picture listed with an empty caption
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy")
FIELDS = ("width", "height", "original_width", "original_height")


@dataclass(frozen=True)
class Served:
    """One URL of the list: its file (None: a 404), the picture's size and the caption listed."""

    name: str
    data: bytes | None
    size: tuple[int, int] | None
    caption: str


def served_files(input_format: str) -> list[Served]:
    files = []
    for i in range(COUNT):
        # commas, quotes and non-ASCII survive both list formats; a line break only a parquet list
        # (img2dataset reads a csv with pyarrow, which refuses one inside a value)
        broken = "\nits second line" if input_format == "parquet" and i % 4 == 1 else ""
        caption = "" if i == SILENT else f'photo {i}, "caf\u00e9" \u2615{broken}'
        if i in MISSING:
            files.append(Served(f"img{i}.jpg", None, None, caption))
        elif i == GARBAGE:
            files.append(Served(f"img{i}.jpg", b"not a picture at all", None, caption))
        else:
            size, form = ((50, 20), "PNG") if i == PNG else ((40 + 3 * i, 30 + 2 * i), "JPEG")
            out = io.BytesIO()
            photo(i, *size).save(out, format=form, **({"quality": 90} if form == "JPEG" else {}))
            files.append(Served(f"img{i}.{form.lower()}", out.getvalue(), size, caption))
    return files


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@contextmanager
def http_server(folder: Path) -> Iterator[str]:
    """``folder`` served on 127.0.0.1 (a missing file: 404) until the block ends; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def write_url_list(path: Path, input_format: str, rows: list[tuple[str, str]]) -> None:
    if input_format == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["url", "caption"])
            writer.writerows(rows)
    else:
        pq.write_table(pa.table({"url": [u for u, _ in rows], "caption": [c for _, c in rows]}), path)


def run_img2dataset(url_list: Path, input_format: str, shards: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXIES}
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", WANDB_MODE="disabled",
               WANDB_SILENT="true", NO_ALBUMENTATIONS_UPDATE="1")  # nothing reached beyond 127.0.0.1
    done = subprocess.run(
        [str(IMG2DATASET), "--url_list", str(url_list), "--output_folder", str(shards),
         "--output_format", "webdataset", "--input_format", input_format, "--url_col", "url",
         "--caption_col", "caption", "--processes_count", "1", "--thread_count", "4",
         # the pictures as served (a JPEG's bytes kept as they are), their sizes in each .json
         "--resize_mode", "no", "--skip_reencode", "True", "--encode_format", "jpg",
         "--number_sample_per_shard", str(PER_SHARD), "--enable_wandb", "False", "--timeout", "20",
         "--retries", "0"],
        capture_output=True, text=True, timeout=300, env=env, cwd=shards.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def tar_samples(tar_path: Path) -> dict[str, dict[str, bytes]]:
    """A tar's members, by key then extension."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            key, ext = member.name.split(".", 1)
            data = tar.extractfile(member)
            assert data is not None, member.name
            samples.setdefault(key, {})[ext] = data.read()
    return samples


@pytest.mark.parametrize("input_format", ["csv", "parquet"])
def test_img2dataset_shards_preprocess_by_key(tmp_path: Path, input_format: str) -> None:
    if not IMG2DATASET.exists():
        pytest.skip("needs img2dataset in its own venv: make img2dataset-venv")
    www, shards, out = tmp_path / "www", tmp_path / "shards", tmp_path / "out"
    www.mkdir()
    files = served_files(input_format)
    for f in files:
        if f.data is not None:
            (www / f.name).write_bytes(f.data)
    with http_server(www) as base:
        by_url = {f"{base}/{f.name}": f for f in files}
        url_list = tmp_path / f"urls.{input_format}"
        write_url_list(url_list, input_format, [(u, f.caption) for u, f in by_url.items()])
        run_img2dataset(url_list, input_format, shards)

    # what img2dataset did, from its own records: every URL tried once, under one key
    tars = sorted(shards.glob("*.tar"))
    assert len(tars) == 3, sorted(p.name for p in shards.iterdir())
    tried: dict[str, dict[str, Any]] = {}  # key -> its .parquet row, and the tar it belongs to
    members: dict[str, dict[str, bytes]] = {}
    for tar in tars:
        for row in pq.read_table(tar.with_suffix(".parquet")).to_pylist():
            assert row["key"] not in tried
            tried[row["key"]] = {**row, "tar": tar}
        members.update(tar_samples(tar))
    assert sorted(r["url"] for r in tried.values()) == sorted(by_url)
    fetched = {k for k, r in tried.items() if r["status"] == "success"}
    assert {tried[k]["url"] for k in fetched} == {u for u, f in by_url.items() if f.size is not None}
    assert set(members) == fetched
    meta = {k: json.loads(members[k]["json"]) for k in fetched}
    for key in fetched:
        served = by_url[meta[key]["url"]]
        assert meta[key]["key"] == key and meta[key]["url"] == tried[key]["url"]
        assert (meta[key]["width"], meta[key]["height"]) == served.size
        assert (meta[key]["original_width"], meta[key]["original_height"]) == served.size
        if served.name.endswith(".jpeg"):
            assert members[key]["jpg"] == served.data  # passed through, not re-encoded

    done = run_cli("preprocess", str(shards), str(out), "--tile", "32", "--processes", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SRC read as webdataset shards (3 tars)" in done.stdout + done.stderr
    silent = next(k for k in fetched if by_url[meta[k]["url"]].caption == "")
    kept = fetched - {silent}
    rejected = len(tried) - len(kept)
    assert f"sources {len(tried)}: accepted {len(kept)}, rejected {rejected}" in done.stdout, done.stdout

    # the store, row by row, joined to what was listed through the row's key
    import zarr

    from tilefeed.store.documents import open_store
    from tilefeed.store.pairs import read_pairs

    attrs = open_store(out)[1]
    group = zarr.open_group(str(out), mode="r")
    paths = [str(p) for p in group[fmt.SOURCE_PATHS][:]]  # type: ignore[index,union-attr]
    keys = []
    for path in paths:
        shard, member = path.split("#", 1)
        key, ext = member.split(".", 1)
        assert ext == "jpg" and shard == str(tried[key]["tar"]), path
        keys.append(key)
    assert sorted(keys) == sorted(kept)
    pairs = read_pairs(out, attrs)
    assert set(pairs.texts) == {"caption"}
    assert set(pairs.fields) == {"key", *FIELDS}
    for row, key in enumerate(keys):
        served = by_url[meta[key]["url"]]
        assert str(pairs.texts["caption"][row]) == served.caption == meta[key]["caption"], key
        assert str(pairs.fields["key"][row]) == key
        for name in FIELDS:
            assert int(pairs.fields[name][row]) == meta[key][name], (key, name)

    # each tile is its own source's picture, where its box says the picture lies
    sources = np.asarray(group[fmt.SOURCES][:])  # type: ignore[index]
    boxes = np.asarray(group[fmt.BOXES][:])  # type: ignore[index]
    images = group[fmt.IMAGES]
    assert sorted(sources.tolist()) == list(range(len(paths)))
    originals = {k: Image.open(io.BytesIO(by_url[meta[k]["url"]].data or b"")).convert("RGB") for k in kept}
    for tile, source in enumerate(sources.tolist()):
        top, left, height, width = (int(v) for v in boxes[tile])
        seen = np.asarray(images[tile])[top:top + height, left:left + width]  # type: ignore[index]
        scores = {k: psnr(seen, np.asarray(im.resize((width, height), Image.Resampling.BICUBIC)))
                  for k, im in originals.items()}
        key = keys[source]
        assert max(scores, key=scores.__getitem__) == key and scores[key] > 28, (key, scores)

    # the URLs not written are the store's rejects, with img2dataset's reason; so is the empty caption
    info = run_cli("info", str(out), "--json")
    assert info.returncode == 0, info.stderr
    reasons = {r["path"]: r["reason"] for r in json.loads(info.stdout)["rejects"]}
    expected = {f"{tried[silent]['tar']}#{silent}.jpg": "no caption: none of caption is given"}
    for key, row in tried.items():
        if row["status"] == "failed_to_download":
            assert "404" in row["error_message"] and by_url[row["url"]].data is None
            expected[f"{row['tar']}#{key}"] = f"download failed: {row['error_message']}"
        elif row["status"] != "success":
            assert row["status"] == "failed_to_resize" and by_url[row["url"]].name == f"img{GARBAGE}.jpg"
            expected[f"{row['tar']}#{key}"] = f"decode or resize failed: {row['error_message']}"
    assert len(expected) == len(MISSING) + 2
    assert reasons == expected
