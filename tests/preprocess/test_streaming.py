"""The writer at any size: the scan, the bookkeeping and the metadata stream through files, so
the driver holds no list of the sources; each streaming piece gives what holding them all gave."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilefeed.preprocess.publish as publish
import tilefeed.preprocess.tasks as tasks
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess, writer
from tilefeed.preprocess.sources import folders, spill
from tilefeed.preprocess.sources import source_list as sourcelist
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError, StoreWriteError
from tilefeed.preprocess.sources.source_list import SourceListWriter, split_paths
from tilefeed.preprocess.sources.scanning import SourceOptions
from tilefeed.preprocess.sources.finding import find_sources, scan_sources
from tests.helpers import photo, tree_bytes, write_folder

TINY = TileSettings(tile=8)


def linked_folder(root: Path, classes: int, per_class: int) -> Path:
    """``classes`` folders of ``per_class`` hard links to one tiny JPEG each: many sources, fast."""
    for c in range(classes):
        folder = root / f"c{c:03d}"
        folder.mkdir(parents=True)
        photo(c, 16, 16).save(folder / "0000.jpg", quality=90)
        for i in range(1, per_class):
            os.link(folder / "0000.jpg", folder / f"{i:04d}.jpg")
    return root


def count_runs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every run file the sorted runs write from now on, in a list."""
    written: list[Path] = []
    real = spill.SortedRuns._write_run

    def write_run(self: spill.SortedRuns, records: Any) -> Path:
        written.append(real(self, records))
        return written[-1]

    monkeypatch.setattr(spill.SortedRuns, "_write_run", write_run)
    return written


# -- the pieces ---------------------------------------------------------------------------------
def test_sorted_runs_spill_to_disk_and_merge_in_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "FAN_IN", 3)
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, rng.integers(0, 20), dtype=np.uint8).tobytes() for _ in range(5000)]
    runs = spill.SortedRuns(tmp_path / "runs", budget=2000)
    runs.extend(records)
    assert len(runs.runs) > 3 * 3  # on disk, and more runs than two passes of three merge
    assert list(runs) == sorted(records)
    assert list((tmp_path / "runs").iterdir()) == []  # each run removed once read
    few = spill.SortedRuns(tmp_path / "few")
    few.extend([b"b", b"a\0z", b"a"])
    assert list(few) == [b"a", b"a\0z", b"b"] and not (tmp_path / "few").exists()  # never on disk


def test_the_source_list_reads_back_any_part_and_every_block(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sourcelist, "READ_SIZE", 7)  # reads that cut paths anywhere
    paths = [f"/d/{i}-{'é' * (i % 3)}\nx.png".encode() for i in range(1000)]
    sink = SourceListWriter(tmp_path / "list", stride=64)
    sink.add(paths[:100], 3)
    sink.add([], 4)
    sink.add(paths[100:], np.arange(100, 1000))
    listing = sink.close()
    blocks = list(listing.blocks(300))
    assert [len(names) for names, _ in blocks] == [300, 300, 300, 100]
    assert [p for names, _ in blocks for p in names] == paths
    assert np.concatenate([labels for _, labels in blocks]).tolist() == [3] * 100 + list(range(100, 1000))
    for first, count in [(0, 64), (64, 128), (896, 256), (960, 64), (0, 1000)]:
        assert split_paths(listing.read(first, count)) == paths[first : first + count]
    assert listing.labels(640, 3).tolist() == [640, 641, 642]


# -- manifests as streams -----------------------------------------------------------------------
def write_manifest(path: Path, rows: list[str]) -> Path:
    path.write_text("path,label\n" + "".join(row + "\n" for row in rows))
    return path


def test_a_repeat_far_from_its_first_line_is_refused_from_runs_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "RUN_BUDGET", 1 << 12)
    monkeypatch.setattr(spill, "FAN_IN", 4)
    runs = count_runs(monkeypatch)
    (tmp_path / "img").mkdir()
    os.symlink("00003.png", tmp_path / "img" / "link.png")  # another name of the file on line 5
    rows = [f"img/{i:05d}.png,{i % 7}" for i in range(20000)]
    m = tmp_path / "m.csv"
    rows[15000] = "img/00003.png,3"  # line 15002 (after the header) repeats line 5
    again = r"m\.csv:15002: 'img/00003\.png' is listed again \(first at line 5\)"
    with pytest.raises(SourceError, match=again):
        find_sources(write_manifest(m, rows))
    assert len(runs) > 4 * 4  # the rows were sorted on disk, merged in passes
    rows[15000] = "img/link.png,4"
    relabelled = r":15002: 'img/link\.png' is listed with another label \(first at line 5\)"
    with pytest.raises(SourceError, match=relabelled):
        find_sources(write_manifest(m, rows))
    rows[12000] = "img/00500.png,3"  # an earlier repeat is the one reported
    with pytest.raises(SourceError, match=r":12002: .* is listed again \(first at line 502\)"):
        find_sources(write_manifest(m, rows))
    rows[13000] = "../outside.png,1"  # a row at fault after the first repeat: the repeat still first
    with pytest.raises(SourceError, match=r":12002: .* is listed again"):
        find_sources(write_manifest(m, rows))
    rows[9000] = "../outside.png,1"  # and one before it
    with pytest.raises(SourceError, match=r":9002: path '\.\./outside\.png' is outside"):
        find_sources(write_manifest(m, rows))
    rows[9000] = rows[13000] = "img/new.png,1"
    kept = find_sources(write_manifest(m, rows), SourceOptions(allow_duplicates=True))
    assert len(kept) == 20000 and kept.paths[15000] == str(tmp_path / "img" / "link.png")


def test_the_label_rule_is_chosen_from_every_row_of_a_stream(tmp_path: Path) -> None:
    m = tmp_path / "m.csv"
    rows = [f"img/{i}.png,{i % 5}" for i in range(30000)]
    found = find_sources(write_manifest(m, rows))
    assert found.classes == ["0", "1", "2", "3", "4"] and found.labels[:6] == [0, 1, 2, 3, 4, 0]
    rows[29999] = "img/last.png,cat"  # the last line decides: not all integers
    with pytest.raises(SourceError, match=r"m\.csv:30001: label 'cat' mixes with integer labels"):
        find_sources(write_manifest(m, rows))
    names = [f"img/{i}.png,{('zebra', 'ant', 'cat')[i % 3]}" for i in range(30000)]
    found = find_sources(write_manifest(m, names))
    assert found.classes == ["ant", "cat", "zebra"] and found.labels[:4] == [2, 0, 1, 2]
    names[29000] = "img/x.png,7"
    with pytest.raises(SourceError, match=r":29002: label '7' mixes with class names"):
        find_sources(write_manifest(m, names))
    found = find_sources(write_manifest(m, names), SourceOptions(labels="names"))
    assert found.classes == ["7", "ant", "cat", "zebra"] and found.labels[29000] == 0


def test_a_large_manifest_is_scanned_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "RUN_BUDGET", 1 << 20)
    rows = [f"images/some/folder/{i:08d}.png,{('cat', 'dog')[i % 2]}" for i in range(200_000)]
    manifest = write_manifest(tmp_path / "m.csv", rows)
    del rows
    (tmp_path / "scan").mkdir()
    tracemalloc.start()
    try:
        listing = scan_sources(manifest, tmp_path / "scan")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(listing) == 200_000 and listing.classes == ["cat", "dog"]
    # held whole, the rows alone take ~60 MB; streamed, the sorted run's budget and a batch
    assert peak < 8 << 20, peak


# -- class folders ------------------------------------------------------------------------------
def test_a_class_sorted_on_disk_keeps_the_imagefolder_order(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    for rel in ["b/x.png", "b/a-b.png", "b/a.png", "b/a/z.png", "b/a/Z.png", "b/a-b/q.png", "b/é.png",
                "b/e.png", "b/a/sub/k.png", "a/1.png", "a/10.png", "a/2.png"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"")
    (src / "b" / "a" / "loop").symlink_to(src / "b")
    os.close(os.open(os.fsencode(src / "b") + b"/bad\xff.png", os.O_CREAT | os.O_WRONLY))
    held = find_sources(src)
    monkeypatch.setattr(folders, "SCAN_CHUNK", 2)  # each folder read a few names at a time
    chunked = find_sources(src)
    monkeypatch.setattr(folders, "HELD_NAMES", 2)
    monkeypatch.setattr(spill, "RUN_BUDGET", 100)
    runs = count_runs(monkeypatch)
    spilled = find_sources(src)
    assert len(runs) > 2
    for other in (chunked, spilled):
        assert (other.paths, other.labels, other.skipped) == (held.paths, held.labels, held.skipped)
    expected = []  # torchvision: sorted(os.walk(...)) then sorted file names within each folder
    for cls in ["a", "b"]:
        for root, _, names in sorted(os.walk(src / cls, followlinks=False)):
            expected += [str(Path(root, n)) for n in sorted(names) if n not in ("loop", "bad\udcff.png")]
    assert held.paths == expected
    assert [reason.split(":")[0] for _, reason in held.skipped] == ["unusable name", "symlink loop"]


# -- the driver ---------------------------------------------------------------------------------
# The driver's Python allocations in a fresh process (another test's leftovers would count):
# their peak up to the metadata, and the metadata's own.
_MEASURED = """
import json, sys, tracemalloc
import zarr  # imported before measuring: its modules are not the run's memory
from tilefeed.preprocess import TileSettings, preprocess, publish

peaks = {}
write_arrays = publish.write_arrays

def measured(*args):
    peaks["scan, plan and build"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    return write_arrays(*args)

publish.write_arrays = measured
tracemalloc.start()
summary = preprocess(sys.argv[1], sys.argv[2], TileSettings(tile=8), workers=2)
peaks["metadata"] = tracemalloc.get_traced_memory()[1]
print(json.dumps({"tiles": summary.tiles, **peaks}))
"""


def test_the_driver_holds_no_list_of_the_sources(tmp_path: Path) -> None:
    src = linked_folder(tmp_path / "src", classes=40, per_class=500)  # 20,000 sources
    done = subprocess.run([sys.executable, "-c", _MEASURED, str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    peaks = json.loads(done.stdout)
    assert peaks["tiles"] == 20_000
    # Streamed, ~3.5 MiB (buffers, and the fingerprint's blocks of paths in flight) then ~8 MiB
    # (a chunk of source_paths: up to 65,536 paths, here all); the writer that held the
    # sources, the parts' records and the arrays as lists peaked at ~9 MiB then ~17 MiB.
    assert peaks["scan, plan and build"] < 6 << 20, peaks
    assert peaks["metadata"] < 12 << 20, peaks


def test_the_store_is_the_same_whatever_the_part_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = linked_folder(tmp_path / "src", classes=9, per_class=1000)
    (src / "c004" / "0500.jpg").unlink()
    (src / "c004" / "0500.jpg").write_bytes(b"not a picture")  # a reject in the middle of a part
    assert writer.part_sources(9000) == 128
    preprocess(src, tmp_path / "large", TINY, StoreSettings(shard_size=700), workers=2)
    monkeypatch.setattr(writer, "part_sources", lambda count: writer.PART_SOURCES)
    preprocess(src, tmp_path / "small", TINY, StoreSettings(shard_size=700), workers=2)
    assert tree_bytes(tmp_path / "large") == tree_bytes(tmp_path / "small")


_REAL_WRITE_PART = tasks.write_part


@dataclass(frozen=True)
class _FullDiskOnFifthPart:
    """Stands in for write_part; picklable, and counts calls in a file, across processes."""

    counter: Path

    def __call__(self, *args: Any) -> Any:
        n = int(self.counter.read_text() or 0) + 1 if self.counter.exists() else 1
        self.counter.write_text(str(n))
        if n == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _REAL_WRITE_PART(*args)


def _preprocess_on_a_full_disk(src: Path, out: Path, calls: Path) -> str:
    """preprocess with the disk full at the fifth part: the error it stops with, in one line."""
    tasks.write_part = _FullDiskOnFifthPart(calls)  # type: ignore[assignment]
    try:
        preprocess(src, out, TINY, StoreSettings(shard_size=50), workers=1)
    except Exception as e:  # noqa: BLE001 - the caller checks which error it was
        return f"{type(e).__name__}: {e}"
    finally:
        tasks.write_part = _REAL_WRITE_PART
    return "no error"


def test_a_part_recorded_in_another_form_is_done_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_folder(tmp_path / "src", classes=3, per_class=100, size=(40, 30))
    store = StoreSettings(shard_size=50)
    preprocess(src, tmp_path / "reference", TINY, store, workers=1)
    out = tmp_path / "out"
    # in a fresh process: its workers fork from it and see the stand-in (a process that has
    # run an object-store client, as this one may have in earlier tests, starts them from a
    # forkserver, which never saw the patch)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
        failure = fresh.submit(_preprocess_on_a_full_disk, src, out, tmp_path / "calls").result()
    assert failure.startswith("StoreWriteError") and "No space left on device" in failure, failure
    records = sorted((out / fmt.WORK_DIR).glob("part-*.json"))
    assert len(records) == 4
    record = json.loads(records[0].read_text())
    old = {"count": record["count"], "sizes": [1, 2], "sources": [0, 0], "rejects": []}
    records[0].write_text(json.dumps(old))  # as an older writer recorded it
    record = json.loads(records[1].read_text())
    records[1].write_text(json.dumps({**record, "first": record["first"] + 1}))  # another cut
    summary = preprocess(src, out, TINY, store, workers=1)
    assert summary.resumed_parts == 2
    assert tree_bytes(out) == tree_bytes(tmp_path / "reference")


def test_a_run_killed_in_its_metadata_resumes_from_its_parts_and_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_folder(tmp_path / "src", classes=3, per_class=100, size=(40, 30))
    store = StoreSettings(shard_size=50)
    preprocess(src, tmp_path / "reference", TINY, store, workers=2)

    def full_disk(*args: Any) -> list[str]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(publish, "write_arrays", full_disk)
    with pytest.raises(StoreWriteError, match="No space left on device"):
        preprocess(src, tmp_path / "out", TINY, store, workers=2)
    monkeypatch.undo()
    assert len(list((tmp_path / "out" / fmt.IMAGES / "c").iterdir())) == 6  # every shard in place
    summary = preprocess(src, tmp_path / "out", TINY, store, workers=2)
    assert summary.resumed_parts == 5
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "reference")


def test_the_scan_folder_goes_with_the_run(tmp_path: Path) -> None:
    src = write_folder(tmp_path / "src", classes=2, per_class=3)
    scan = tmp_path / ".out.tilefeed-scan"
    scan.mkdir()
    (scan / "left-by-a-killed-run").write_text("")
    preprocess(src, tmp_path / "out", TINY, workers=1)
    assert not scan.exists()
    shutil.rmtree(tmp_path / "out")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(SourceError, match="holds no images"):
        preprocess(tmp_path / "empty", tmp_path / "out", TINY, workers=1)
    assert not scan.exists()
