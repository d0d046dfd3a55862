"""Labels that cannot silently go wrong: manifest rules, class folders, every array checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from tilefeed.pipeline import Loader, StoreReader, TileDataset
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store.documents import load_attrs
from tilefeed.store.errors import (
    ConfigError,
    CorruptChunkError,
    SourceError,
    StoreExistsError,
    StoreFormatError,
)
from tilefeed.store.inspection import verify
from tilefeed.preprocess.sources.scanning import LABEL_RULES, ClassLabels, SourceOptions
from tilefeed.preprocess.sources.finding import find_sources
from tilefeed.preprocess.output import writer_lock
from tilefeed.store.storage import LocalStorage
from tests.helpers import photo, run_cli, write_folder

SMALL = TileSettings(tile=16)


@pytest.fixture
def images(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "img"
    folder.mkdir()
    paths = []
    for i in range(12):
        paths.append(folder / f"{i:02d}.png")
        photo(i, 24, 24).save(paths[-1])
    return paths


def labels_of(out: Path) -> list[int]:
    return [int(v) for v in zarr.open_group(str(out), mode="r")["labels"][:]]


# -- manifests ----------------------------------------------------------------------------------
def test_spreadsheet_csv_with_bom_and_crlf_keeps_integer_labels(tmp_path: Path, images: list[Path]) -> None:
    rows = [f"img/{p.name},{label}" for p, label in zip(images, [2, 10, 0, 1] * 3, strict=True)]
    (tmp_path / "m.csv").write_bytes(("\ufeffpath,label\r\n" + "\r\n".join(rows) + "\r\n").encode())
    summary = preprocess(tmp_path / "m.csv", tmp_path / "out", SMALL, workers=1)
    assert (summary.sources, summary.rejected) == (12, 0)
    assert labels_of(tmp_path / "out") == [2, 10, 0, 1] * 3  # not renumbered as text
    attrs = load_attrs(tmp_path / "out")
    assert attrs["classes"] == [str(i) for i in range(11)]


def test_header_is_found_by_its_column_names(tmp_path: Path, images: list[Path]) -> None:
    (tmp_path / "m.csv").write_text("label,id,path\n" + "".join(
        f"{i % 3},{i},img/{p.name}\n" for i, p in enumerate(images)))
    preprocess(tmp_path / "m.csv", tmp_path / "out", SMALL, workers=1)
    assert labels_of(tmp_path / "out") == [i % 3 for i in range(12)]


@pytest.mark.parametrize("bad,line", [("2.5", 5), ("1.0", 5)])
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_non_integer_among_integers_is_refused_naming_the_line(
        tmp_path: Path, images: list[Path], bad: str, line: int, kind: str) -> None:
    labels: list[object] = [1, 2, 3, 0, bad, 1, 2, 3, 0, 1, 2, 3]
    if kind == "jsonl":
        labels[4] = float(bad)
        text = "".join(json.dumps({"path": f"img/{p.name}", "label": v}) + "\n"
                       for p, v in zip(images, labels, strict=True))
    else:
        text = "path,label\n" + "".join(f"img/{p.name},{v}\n" for p, v in zip(images, labels, strict=True))
        line += 1  # the header
    manifest = tmp_path / f"m.{kind}"
    manifest.write_text(text)
    with pytest.raises(SourceError, match=rf"m\.{kind}:{line}: label .*{bad}.* mixes with integer labels"):
        find_sources(manifest)
    names = find_sources(manifest, SourceOptions(labels="names"))
    assert bad in names.classes
    with pytest.raises(SourceError, match=rf":{line}: label .* is not an integer"):
        find_sources(manifest, SourceOptions(labels="int"))


def test_a_label_rule_becomes_a_member_that_reads_as_its_string(tmp_path: Path, images: list[Path]) -> None:
    assert LABEL_RULES == ("auto", "int", "names") and all(type(r) is str for r in LABEL_RULES)
    assert SourceOptions().labels is ClassLabels.AUTO and SourceOptions(labels="int").labels is ClassLabels.INT
    with pytest.raises(ConfigError, match=r"^--labels must be one of auto, int, names, got 'same'$"):
        SourceOptions(labels="same")
    manifest = tmp_path / "m.csv"
    manifest.write_text("".join(f"img/{p.name},{i % 3}\n" for i, p in enumerate(images)))
    for rule in ClassLabels:  # the member and its string read the manifest alike
        by_member, by_name = (find_sources(manifest, SourceOptions(labels=r)) for r in (rule, rule.value))
        assert by_member.classes == by_name.classes == ["0", "1", "2"]


def test_a_number_among_names_is_refused(tmp_path: Path, images: list[Path]) -> None:
    labels = ["cat", "dog", "cat", "3", "dog"]
    rows = [f"img/{p.name},{v}\n" for p, v in zip(images, labels, strict=False)]
    (tmp_path / "m.csv").write_text("".join(rows))
    with pytest.raises(SourceError, match=r"m\.csv:4: label '3' mixes with class names"):
        find_sources(tmp_path / "m.csv")


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_empty_labels_paths_and_duplicates_are_refused_with_the_line(
        tmp_path: Path, images: list[Path], kind: str) -> None:
    def write(rows: list[tuple[str, object]]) -> Path:
        m = tmp_path / f"m.{kind}"
        if kind == "csv":
            m.write_text("".join(f"{p},{v}\n" for p, v in rows))
        else:
            m.write_text("".join(json.dumps({"path": p, "label": v}) + "\n" for p, v in rows))
        return m

    a, b = f"img/{images[0].name}", f"img/{images[1].name}"
    with pytest.raises(SourceError, match=r":2: empty label"):
        find_sources(write([(a, "cat"), (b, "")]))
    with pytest.raises(SourceError, match=r":2: empty path"):
        find_sources(write([(a, "cat"), ("", "dog")]))
    with pytest.raises(SourceError, match=r":3: .* is listed again \(first at line 1\).*--allow-duplicates"):
        find_sources(write([(a, "cat"), (b, "dog"), (a, "cat")]))
    with pytest.raises(SourceError, match=r":2: .* is listed with another label \(first at line 1\)"):
        find_sources(write([(a, "cat"), (a, "dog")]))
    kept = find_sources(write([(a, "cat"), (b, "dog"), (a, "cat")]), SourceOptions(allow_duplicates=True))
    assert len(kept) == 3
    os.symlink(images[0].name, tmp_path / "img" / "alias.png")  # a second name of the same file
    with pytest.raises(SourceError, match=r":2: .* is listed again \(first at line 1\)"):
        find_sources(write([(a, "cat"), ("img/alias.png", "cat")]))


def test_paths_outside_the_manifest_folder_need_allow_outside(tmp_path: Path, images: list[Path]) -> None:
    sub = tmp_path / "lists"
    sub.mkdir()
    (sub / "m.csv").write_text(f"../img/{images[0].name},0\n{images[1]},1\n")
    with pytest.raises(SourceError, match=r"m\.csv:1: path '\.\./img/00\.png' is outside .*--allow-outside"):
        find_sources(sub / "m.csv")
    found = find_sources(sub / "m.csv", SourceOptions(allow_outside=True))
    assert found.paths == [str(images[0]), str(images[1])]
    (sub / "m.csv").write_text("s3://bucket/a.jpg,0\n")
    with pytest.raises(SourceError, match=r"m\.csv:1: .* --allow-bucket s3://bucket"):
        find_sources(sub / "m.csv")  # read with this machine's credentials: only when allowed
    allowed = SourceOptions(buckets=("s3://bucket",))
    assert find_sources(sub / "m.csv", allowed).paths == ["s3://bucket/a.jpg"]  # a URL is not a path


# -- class folders ------------------------------------------------------------------------------
def test_an_empty_class_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=3, per_class=2)
    for f in (src / "c1").iterdir():
        f.unlink()
    with pytest.raises(SourceError, match=r"'c1' holds no files.*--allow-empty-classes"):
        preprocess(src, tmp_path / "out", SMALL, workers=1)
    summary = preprocess(src, tmp_path / "out", SMALL, workers=1,
                         source_options=SourceOptions(allow_empty_classes=True))
    assert summary.notes == ["empty classes kept: c1"]
    assert load_attrs(tmp_path / "out")["classes"] == ["c0", "c1", "c2"]
    assert labels_of(tmp_path / "out") == [0, 0, 2, 2]


def test_symlink_loops_hidden_files_and_dangling_links(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    (src / "c0" / "loop").symlink_to(src / "c0")
    (src / "c0" / ".DS_Store").write_bytes(b"junk")
    (src / "c1" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (src / "c2").mkdir()
    (src / "c2" / "only-a-loop").symlink_to(src / "c2")
    with pytest.raises(SourceError, match="'c2' holds no files"):
        preprocess(src, tmp_path / "out", SMALL, workers=1)
    (src / "c2" / "only-a-loop").unlink()
    (src / "c2").rmdir()
    summary = preprocess(src, tmp_path / "out", SMALL, workers=1)
    assert (summary.accepted, summary.rejected, summary.hidden) == (4, 2, 1)
    rejects = {r["path"]: r["reason"] for r in load_attrs(tmp_path / "out")["rejects"]}
    assert rejects == {
        str(src / "c0" / "loop"): "symlink loop: the folder it links to was already read",
        str(src / "c1" / "gone.jpg"): "dangling link: its target does not exist",
    }


def test_class_folder_order_is_torchvision_imagefolder_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in ["b/x.png", "b/a-b.png", "b/a.png", "b/a/z.png", "a/1.png"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        photo(1, 8, 8).save(src / rel)
    found = find_sources(src)
    # torchvision: sorted(os.walk(...)) then sorted file names within each folder
    expected = []
    for cls in ["a", "b"]:
        for root, _, names in sorted(os.walk(src / cls, followlinks=True)):
            expected += [str(Path(root, n)) for n in sorted(names)]
    assert found.paths == expected


# -- OUT and SRC --------------------------------------------------------------------------------
def test_out_inside_src_is_left_out_of_the_scan_and_reruns(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    out = src / "store"
    first = preprocess(src, out, SMALL, workers=1)
    assert load_attrs(out)["classes"] == ["c0", "c1"]
    assert first.notes == ["OUT 'store' inside SRC was not scanned"]
    again = preprocess(src, out, SMALL, workers=1)
    assert again.up_to_date
    with pytest.raises(SourceError, match="is SRC itself"):
        preprocess(src, src, SMALL, workers=1)


def test_overwrite_removes_only_what_tilefeed_wrote(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    out = tmp_path / "out"
    preprocess(src, out, SMALL, workers=1)
    (out / "notes.txt").write_text("mine")
    summary = preprocess(src, out, TileSettings(tile=24), workers=1, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert summary.notes == ["--overwrite removed the old store and left 1 entries it did not write: notes.txt"]
    assert load_attrs(out)["tile"] == [24, 24, 3]


def test_a_second_writer_is_told_to_wait(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    out = tmp_path / "out"
    busy = pytest.raises(StoreExistsError, match="being written right now.*wait for it")
    with writer_lock(LocalStorage(out)), busy:
        preprocess(src, out, SMALL, workers=1, overwrite=True)
    preprocess(src, out, SMALL, workers=1)  # the lock went with its holder


# -- every array checked ------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Path:
    src = write_folder(tmp_path / "src", classes=3, per_class=4)
    out = tmp_path / "store"
    preprocess(src, out, SMALL, StoreSettings(shard_size=5), workers=1)
    return out


def _readers_refuse(store: Path) -> None:
    """Every reader raises a tilefeed error, never yields a sample of a damaged store."""
    for open_reader in (lambda: StoreReader(store), lambda: TileDataset(store),
                        lambda: Loader(store, 4, size=16, device="cpu")):
        with pytest.raises((CorruptChunkError, StoreFormatError)):
            reader = open_reader()
            ds = reader if isinstance(reader, TileDataset) else None
            if ds is not None:
                [ds[i] for i in range(len(ds))]
            elif isinstance(reader, StoreReader):
                [reader.read(i) for i in range(len(reader))]
            else:
                list(reader)


DAMAGE = ["delete", "truncate", "flip"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_any_file_damaged_fails_verify_naming_it_and_every_reader_refuses(store: Path, damage: str) -> None:
    files = sorted(p for p in store.rglob("*") if p.is_file())
    assert {str(p.relative_to(store)) for p in files} >= {"zarr.json", "labels/c/0", "sources/c/0",
                                                            "source_paths/c/0", "images/c/0/0/0/0"}
    pristine = {p: p.read_bytes() for p in files}
    for path in files:
        data = pristine[path]
        if damage == "delete":
            path.unlink()
        elif damage == "truncate":
            path.write_bytes(data[: len(data) // 2])
        else:
            mid = len(data) // 2
            path.write_bytes(data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1 :])
        r = run_cli("verify", str(store), "--quiet")
        assert r.returncode == 1, (path, r.stdout)
        assert "Traceback" not in r.stderr + r.stdout, (path, r.stderr)
        named = str(path.relative_to(store)) in r.stdout + r.stderr or (
            path.name == "zarr.json" and path.parent == store)
        assert named, (path, r.stdout, r.stderr)
        _readers_refuse(store)
        path.write_bytes(data)
    assert verify(store) == []


def test_a_missing_labels_chunk_is_never_read_as_zeros(store: Path) -> None:
    (store / "labels" / "c" / "0").unlink()
    assert verify(store) == [f"{store}/labels/c/0: missing chunk (zarr would read it as zeros)"]
    with pytest.raises(CorruptChunkError, match=r"labels/c/0: missing chunk"):
        StoreReader(store)


def test_a_flipped_labels_byte_is_a_corrupt_chunk_error_not_a_codec_error(store: Path) -> None:
    chunk = store / "labels" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError, match=r"labels/c/0: chunk crc32c mismatch"):
        TileDataset(store)
    r = run_cli("verify", str(store))
    assert r.returncode == 1 and r.stdout.strip() == f"{chunk}: chunk crc32c mismatch"


def test_an_old_version_store_is_refused_with_what_to_do(store: Path) -> None:
    group = zarr.open_group(str(store), mode="a")
    attrs = dict(group.attrs["tilefeed"])
    attrs["version"] = 1
    group.update_attributes({"tilefeed": attrs})
    with pytest.raises(StoreFormatError, match="version 1.*rebuild it .*--overwrite"):
        StoreReader(store)


# -- output scripts can trust -------------------------------------------------------------------
def test_info_into_head_exits_quietly_and_text_output_escapes_control_characters(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=1, per_class=1)
    for i in range(3000):
        (src / "c0" / f"empty-{i:04d}.jpg").write_bytes(b"")
    (src / "c0" / "aa\nline.jpg").write_bytes(b"")
    out = tmp_path / "out"
    preprocess(src, out, SMALL, workers=2)
    pipe = subprocess.run(f"'{sys.executable}' -m tilefeed info --json '{out}' | head -1",
                          shell=True, capture_output=True, text=True, timeout=60)
    assert pipe.stdout == "{\n" and pipe.stderr == ""
    text = run_cli("info", str(out)).stdout
    assert "aa\\nline.jpg" in text and "aa\nline" not in text
    assert json.loads(run_cli("info", "--json", str(out)).stdout)["rejects"][0]["path"].endswith("aa\nline.jpg")
    assert np.all(np.asarray(labels_of(out)) == 0)


def test_an_unreadable_folder_inside_a_class_is_a_reject_not_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=2)
    locked = src / "c1" / "locked"
    locked.mkdir()
    real = os.scandir

    def scandir(path: object) -> object:
        if Path(str(path)) == locked:
            raise PermissionError(13, "Permission denied")
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    found = find_sources(src)
    assert len(found) == 4
    assert found.skipped == [(str(locked), "unreadable folder: Permission denied")]


def test_an_integer_label_too_large_for_any_class_list_is_refused_before_sizing_one(tmp_path: Path) -> None:
    from PIL import Image

    from tilefeed.preprocess.sources.finding import find_sources
    from tilefeed.store.errors import SourceError

    Image.new("RGB", (20, 20)).save(tmp_path / "a.png")
    (tmp_path / "m.csv").write_text("path,label\na.png,99999999999\n")
    with pytest.raises(SourceError, match="over the 1048576 classes"):
        find_sources(tmp_path / "m.csv")
