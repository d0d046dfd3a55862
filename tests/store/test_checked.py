"""A store is checked once per node: later opens map the arrays that check left, and nothing
planted, changed or linked can pass for a checked store."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_store
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.store import format as fmt
from tilefeed.store.arrays import read_small_array
from tilefeed.store.documents import load_attrs
from tilefeed.store.errors import CorruptChunkError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TILEFEED_CACHE", str(folder))
    return folder


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "made", "lz4")


def _checked(cache: Path) -> Path:
    (folder,) = (cache / "checked").iterdir()
    return folder


def test_the_second_open_maps_what_the_first_checked(store: Path, cache: Path) -> None:
    first = StoreReader(store)
    assert not first._arrays_mapped
    folder = _checked(cache)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    second = StoreReader(store)
    assert second._arrays_mapped and isinstance(second.labels.base, np.memmap)
    assert np.array_equal(first.labels, second.labels) and np.array_equal(first.boxes, second.boxes)
    assert second.labels.dtype == np.int64 and second.boxes.shape == (len(second), 4)
    assert first.padded == second.padded
    assert not second.labels.flags.writeable


def test_a_chunk_changed_after_the_check_is_checked_again(store: Path, cache: Path) -> None:
    StoreReader(store)
    chunk = store / "labels" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    stat = chunk.stat()
    data[-5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and mtime
    with pytest.raises(CorruptChunkError, match="crc32c|sha256"):
        StoreReader(store)


def test_a_shard_replaced_after_the_check_is_checked_again(store: Path, cache: Path) -> None:
    StoreReader(store)
    shard = fmt.shard_path(store, 1)
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(CorruptChunkError, match="truncated"):
        StoreReader(store)


def test_a_record_for_a_store_that_differs_is_not_used(store: Path, cache: Path) -> None:
    StoreReader(store)
    record = _checked(cache) / "record.json"
    text = record.read_text()
    # another process forging the record's stats cannot make a changed file pass: the record
    # must name exactly the files of this store, with their stats now
    record.write_text(text.replace('"stats":[[', '"stats":[[1'))
    reader = StoreReader(store)
    assert not reader._arrays_mapped  # checked afresh, and the record written again
    assert StoreReader(store)._arrays_mapped


@pytest.mark.parametrize("planted", ["open to others", "a link"])
def test_a_folder_others_could_write_is_not_trusted(store: Path, cache: Path, tmp_path: Path,
                                                   planted: str) -> None:
    StoreReader(store)
    folder = _checked(cache)
    if planted == "open to others":
        folder.chmod(0o777)
    else:
        elsewhere = tmp_path / "elsewhere"
        folder.rename(elsewhere)
        folder.symlink_to(elsewhere)
    with pytest.warns(UserWarning, match="cannot be kept"):
        reader = StoreReader(store)
    assert not reader._arrays_mapped
    assert np.array_equal(reader.labels, read_small_array(store, load_attrs(store), fmt.LABELS))


def test_a_mapped_reader_crosses_to_another_process_without_its_arrays(store: Path, cache: Path) -> None:
    StoreReader(store)
    reader = StoreReader(store)
    data = pickle.dumps(reader)
    assert reader.labels.nbytes > 0 and reader.labels.tobytes() not in data
    again = pickle.loads(data)
    assert again._arrays_mapped and np.array_equal(again.labels, reader.labels)


def test_an_unwritable_cache_still_opens_the_store(store: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("TILEFEED_CACHE", str(blocker / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = StoreReader(store)
    assert any("cannot be kept" in str(w.message) for w in caught)
    assert len(reader.labels) == len(reader)
