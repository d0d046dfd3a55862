from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.output import RunPlan
from tilefeed.preprocess.settings import describe
from tilefeed.store import format as fmt
from tilefeed.store.codec import TileCodec
from tilefeed.store.documents import load_attrs
from tilefeed.store.shard import ShardFile
from tilefeed.store.errors import SourceError, StoreExistsError, StoreFormatError
from tilefeed.cli.store_commands import format_info
from tilefeed.store.inspection import StoreInfo, info, verify
from tilefeed.pipeline import StoreReader
from tests.helpers import assert_plain, photo, run_cli, tree_bytes, write_folder

SMALL = TileSettings(tile=32)


@pytest.mark.parametrize("codec", fmt.CODECS)
def test_store_reads_back_through_zarr(tmp_path: Path, image_folder: Path, codec: str) -> None:
    out = tmp_path / "store"
    summary = preprocess(image_folder, out, SMALL, StoreSettings(codec=codec, shard_size=4),
                         workers=1)
    assert (summary.sources, summary.accepted, summary.tiles, summary.shards) == (15, 15, 15, 4)
    group = zarr.open_group(str(out), mode="r")
    images = group["images"]
    assert images.shape == (15, 32, 32, 3) and images.dtype == np.uint8
    assert list(group["labels"][:]) == [0] * 5 + [1] * 5 + [2] * 5
    assert list(group["sources"][:]) == list(range(15))
    paths = sorted(image_folder.rglob("*.jpg"))
    assert list(group["source_paths"][:]) == [str(p) for p in paths]
    codec_obj = TileCodec(codec, 32)
    for i in (0, 6, 14):
        tile = images[i]
        assert tile.shape == (32, 32, 3)
        shard = ShardFile(out, i // 4, 4)
        np.testing.assert_array_equal(codec_obj.decode(shard.chunk(i % 4)), tile)
        shard.close()
    assert not (out / fmt.WORK_DIR).exists()
    assert verify(out, deep=True) == []


INFO_KEYS = ["path", "format", "samples", "sources", "accepted", "rejected", "classes", "tile", "codec",
             "quality", "shard_size", "shards", "bytes", "made", "rejects", "targets", "texts", "fields",
             "labelled"]


def test_the_settings_record_plain_strings_as_they_always_did() -> None:
    """What the fingerprint hashes and ``made`` records: these strings are what tilefeed wrote
    before the codec was a ``Codec``, and a store's identity must not change with the type."""
    tiles = TileSettings(tile=32, fit="crop")
    jpeg, lz4 = StoreSettings(codec="jpeg", shard_size=4), StoreSettings(codec=fmt.Codec.LZ4, shard_size=4)
    assert jpeg.codec is fmt.Codec.JPEG and lz4.codec is fmt.Codec.LZ4
    assert StoreSettings().codec is fmt.Codec.LZ4
    assert json.dumps(jpeg.identity()) == '{"codec": "jpeg", "quality": 90, "shard_size": 4}'
    assert json.dumps(describe(tiles, lz4)) == (
        '{"tile": 32, "mode": "resize", "fit": "crop", "resample": "bicubic", "background": [255, 255, 255], '
        '"max_pixels": 178956970, "icc": "ignore", "codec": "lz4", "shard_size": 4}')
    for record in (jpeg.identity(), describe(tiles, jpeg), describe(tiles, lz4)):
        assert_plain(record)
    with pytest.raises(ValueError, match=r"^--codec must be one of lz4, zstd, none, jpeg, got 'png'$"):
        StoreSettings(codec="png")


def test_the_run_plan_is_written_as_the_same_json_object() -> None:
    plan = RunPlan(fingerprint="ab" * 32, sources=3, settings={"codec": "lz4", "shard_size": 4})
    assert json.dumps(plan.as_dict()) == ('{"fingerprint": "' + "ab" * 32 + '", "sources": 3, '
                                          '"settings": {"codec": "lz4", "shard_size": 4}}')


def test_info_is_a_record_whose_dict_is_what_info_json_prints(tmp_path: Path, image_folder: Path) -> None:
    out = tmp_path / "store"
    preprocess(image_folder, out, SMALL, StoreSettings(codec="jpeg", shard_size=4), workers=1)
    d = info(out)
    assert isinstance(d, StoreInfo) and list(d.as_dict()) == INFO_KEYS
    assert (d.format, d.samples, d.codec, d.quality) == ("tilefeed v3", 15, "jpeg", 90)
    assert (d.tile, d.shards) == ([32, 32, 3], 4)
    assert_plain(d.as_dict())
    r = run_cli("info", str(out), "--json")
    assert r.returncode == 0 and r.stdout == json.dumps(d.as_dict(), indent=2) + "\n"
    text = run_cli("info", str(out))
    assert text.stdout == format_info(d) + "\n" and "codec jpeg q90" in text.stdout


def test_bad_inputs_are_listed_and_nothing_is_lost(tmp_path: Path, bad_folder: Path) -> None:
    (bad_folder / "stray.jpg").write_bytes(b"outside any class")
    out = tmp_path / "store"
    s = preprocess(bad_folder, out, TileSettings(tile=32, max_pixels=100_000), workers=2)
    d = info(out)
    assert d.sources == 2 + 2 + 5 + 1
    assert d.accepted + d.rejected == d.sources
    assert (s.accepted, s.rejected, s.tiles) == (4, 6, 4) and d.samples == 4
    reasons = {Path(r["path"]).name: r["reason"] for r in d.rejects}
    assert reasons.keys() == {"zero.jpg", "truncated.jpg", "text.jpg", "garbled.png", "huge.png",
                              "stray.jpg"}
    assert reasons["huge.png"].startswith("too large")
    assert reasons["stray.jpg"] == "outside any class folder"
    assert set(s.rejects_by_reason) >= {"empty file (0 bytes)", "too large", "not an image"}


def test_grid_mode_stores_provenance(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    photo(1, 100, 64).save(src / "0.png")
    photo(2, 40, 40).save(src / "1.png")
    out = tmp_path / "store"
    preprocess(tmp_path / "src", out, TileSettings(tile=32, mode="grid"), StoreSettings(codec="none"),
               workers=1)
    g = zarr.open_group(str(out), mode="r")
    assert list(g["sources"][:]) == [0] * 8 + [1] * 4
    assert list(g["rows"][:]) == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1]
    assert list(g["cols"][:]) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 0, 1]
    full = np.asarray(photo(1, 100, 64))
    np.testing.assert_array_equal(g["images"][5], full[32:64, 32:64])


def test_store_is_the_same_for_any_worker_count(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=80)  # several parts
    stores = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        preprocess(src, out, SMALL, StoreSettings(shard_size=50), workers=workers)
        stores.append(tree_bytes(out))
    assert stores[0] == stores[1]


def test_manifests(tmp_path: Path, image_folder: Path) -> None:
    files = sorted(image_folder.rglob("*.jpg"))[:4]
    csv = tmp_path / "m.csv"
    csv.write_text("path,label\n" + "".join(
        f"{p.relative_to(tmp_path)},{'cat' if i % 2 else 'dog'}\n" for i, p in enumerate(files)))
    preprocess(csv, tmp_path / "a", SMALL, workers=1)
    g = zarr.open_group(str(tmp_path / "a"), mode="r")
    assert g.attrs["tilefeed"]["classes"] == ["cat", "dog"] and list(g["labels"][:]) == [1, 0, 1, 0]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text("".join(json.dumps({"path": str(p), "label": 3}) + "\n" for p in files))
    preprocess(jsonl, tmp_path / "b", SMALL, workers=1)
    g = zarr.open_group(str(tmp_path / "b"), mode="r")
    assert g.attrs["tilefeed"]["classes"] == ["0", "1", "2", "3"] and list(g["labels"][:]) == [3] * 4
    jsonl.write_text('{"path": "x.jpg"}\n')
    with pytest.raises(SourceError, match="m.jsonl:1"):
        preprocess(jsonl, tmp_path / "c", SMALL, workers=1)


def test_output_folder_rules(tmp_path: Path, image_folder: Path) -> None:
    out = tmp_path / "store"
    first = preprocess(image_folder, out, SMALL, workers=1)
    again = preprocess(image_folder, out, SMALL, workers=1)
    assert again.up_to_date and again.tiles == first.tiles
    with pytest.raises(StoreExistsError, match="--overwrite"):
        preprocess(image_folder, out, TileSettings(tile=48), workers=1)
    preprocess(image_folder, out, TileSettings(tile=48), workers=1, overwrite=True)
    assert info(out).tile == [48, 48, 3]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match="holds no tilefeed store"):
        preprocess(image_folder, foreign, SMALL, workers=1, overwrite=True)
    assert (foreign / "keep.txt").read_text() == "mine"


def test_empty_or_missing_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        preprocess(tmp_path / "nope", tmp_path / "o", SMALL)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(SourceError, match="holds no images"):
        preprocess(tmp_path / "empty", tmp_path / "o", SMALL)
    (tmp_path / "empty" / "a" / "x.jpg").write_bytes(b"")
    with pytest.raises(SourceError, match="no usable image among 1 inputs") as caught:
        preprocess(tmp_path / "empty", tmp_path / "o", SMALL, workers=1)
    assert "x.jpg" in str(caught.value) and "\n" not in str(caught.value)  # the rejected input, named
    # nothing left that offers to resume a run that stored nothing; the same run again says the same
    with pytest.raises(StoreFormatError, match="not a tilefeed store"):
        load_attrs(tmp_path / "o")
    with pytest.raises(SourceError, match="no usable image among 1 inputs"):
        preprocess(tmp_path / "empty", tmp_path / "o", SMALL, workers=1)
    # once a good image joins, the same command makes the store
    write_folder(tmp_path / "empty", classes=1, per_class=2)
    preprocess(tmp_path / "empty", tmp_path / "o", SMALL, workers=1)
    assert load_attrs(tmp_path / "o")["samples"] == 2


def test_cli_errors_are_one_line(tmp_path: Path, image_folder: Path) -> None:
    r = run_cli("preprocess", str(tmp_path / "missing"), str(tmp_path / "o"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr
    r = run_cli("preprocess", str(image_folder), str(tmp_path / "o"), "--tile", "0")
    assert r.returncode == 2 and "--tile" in r.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # OUT's parent is a file: no folder can be made there, even by root
    r = run_cli("preprocess", str(image_folder), str(blocker / "o"))
    assert r.returncode == 1 and "cannot write to OUT" in r.stderr
    assert r.stderr.count("\n") == 1


def test_cli_summary_strict_info_and_verify(tmp_path: Path, bad_folder: Path) -> None:
    out = tmp_path / "store"
    r = run_cli("preprocess", str(bad_folder), str(out), "--tile", "32", "--max-pixels", "100000",
                "--strict", "--processes", "2")
    assert r.returncode == 1 and "--strict: 5 inputs were rejected" in r.stderr
    assert "accepted 4, rejected 5" in r.stdout and "too large" in r.stdout
    r = run_cli("info", str(out), "--json")
    d = json.loads(r.stdout)
    for key in ("samples", "sources", "rejected", "rejects", "classes", "tile", "codec", "shards"):
        assert key in d
    assert {"path", "reason"} == set(d["rejects"][0])
    assert run_cli("verify", str(out), "--deep").returncode == 0
    quiet = run_cli("verify", str(out), "--quiet")  # no bar, still the count
    assert quiet.returncode == 0 and f"sound ({d['shards']} shards checked)" in quiet.stdout
    shard = fmt.shard_path(out, 0)
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0x01
    shard.write_bytes(bytes(raw))
    r = run_cli("verify", str(out))
    assert r.returncode == 1 and f"{shard}: sample 0: chunk crc32c mismatch" in r.stdout


def _parts_written(out: Path) -> bool:
    return len(list((out / fmt.WORK_DIR).glob("part-*.json"))) >= 3


def _shard_written(out: Path) -> bool:
    return fmt.shard_path(out, 0).exists()


@pytest.mark.parametrize("moment", [_parts_written, _shard_written])
def test_kill_9_mid_run_then_resume_gives_the_same_store(tmp_path: Path, moment: object) -> None:
    src = write_folder(tmp_path / "src", classes=4, per_class=160, size=(320, 240))
    args = ["--tile", "64", "--shard-size", "100", "--processes", "2", "--quiet"]
    reference = tmp_path / "reference"
    assert run_cli("preprocess", str(src), str(reference), *args).returncode == 0

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "tilefeed", "preprocess", str(src),
                             str(out), *args], start_new_session=True)
    deadline = time.monotonic() + 60
    while not moment(out):  # type: ignore[operator]
        assert proc.poll() is None and time.monotonic() < deadline, "run ended before the kill"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, mid-run
    proc.wait()
    with pytest.raises(StoreFormatError, match="incomplete"):
        load_attrs(out)
    r = run_cli("preprocess", str(src), str(out), *args[:-1])
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout
    assert tree_bytes(out) == tree_bytes(reference)


def test_out_inside_src_reached_through_a_link_is_not_a_class(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=3)
    (tmp_path / "link").symlink_to(src)
    out = src / "out"
    summary = preprocess(tmp_path / "link", out, TileSettings(tile=16), StoreSettings(shard_size=8), workers=1)
    assert summary.sources == 6
    assert StoreReader(out).classes == ["c0", "c1"]  # not "out": it is OUT, whatever path reaches it


def test_a_refused_clean_up_does_not_hide_why_nothing_was_stored(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that stores nothing removes its work folder; where the removal fails, the error is
    still the one that says what was rejected."""
    from tilefeed.store.storage import LocalStorage

    (tmp_path / "bad" / "a").mkdir(parents=True)
    (tmp_path / "bad" / "a" / "x.jpg").write_bytes(b"")

    def refuse(self: LocalStorage, name: str) -> None:
        raise OSError(f"cannot remove {name}")

    monkeypatch.setattr(LocalStorage, "remove", refuse)
    with pytest.raises(SourceError, match="no usable image among 1 inputs.*x.jpg"):
        preprocess(tmp_path / "bad", tmp_path / "o", SMALL, workers=1)


def test_more_rejects_than_the_attributes_list_are_all_kept_in_arrays(tmp_path: Path) -> None:
    """Ten thousand and more rejected sources (an img2dataset download's failures) leave the
    group's zarr.json small: the attributes list the first, two string arrays hold every one."""
    from tests.helpers import run_cli, write_caption_table
    from tilefeed.preprocess.sources.scanning import PairOptions

    table = write_caption_table(tmp_path / "src", 3)
    extra = fmt.MAX_LISTED_REJECTS + 5
    with open(table, "a", encoding="utf-8") as f:  # rows without a caption: each a reject
        f.writelines(f"{i % 3:03d}.jpg\t\t\tx\t0\t0\n" for i in range(extra))
    out = tmp_path / "store"
    summary = preprocess(table, out, TileSettings(tile=16), workers=1,
                         pairs=PairOptions(caption_key=("caption", "synthetic")))
    assert (summary.accepted, summary.rejected) == (3, extra)
    assert (out / "zarr.json").stat().st_size < 4 << 20
    attrs = info(out)
    assert attrs.rejected == extra and len(attrs.rejects) == fmt.MAX_LISTED_REJECTS
    group = zarr.open_group(str(out), mode="r")
    paths, reasons = group[fmt.REJECT_PATHS][:], group[fmt.REJECT_REASONS][:]
    assert len(paths) == len(reasons) == extra and reasons[-1].startswith("no caption")
    assert [r["path"] for r in attrs.rejects] == list(paths[: fmt.MAX_LISTED_REJECTS])
    assert verify(out, deep=True) == []
    shown = run_cli("info", str(out)).stdout
    assert f"the arrays reject_paths and reject_reasons hold all {extra}" in shown
