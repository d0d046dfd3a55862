"""The targets' arrays under the store's promises: version 2 stores still read, version 3 stores'
object, frame and mask arrays checked as every array is, and hostile values in them (re-signed,
as anyone can) refused in one line by the reader and listed by ``verify``."""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_cli, write_folder
from tests.preprocess.targets_data import write_coco
from tests.store.hostile_store_cases import attrs_of, edit_attrs, write_mask_chunk, write_small_chunk, zstd_rle
from tilefeed.pipeline import StoreReader
from tilefeed.preprocess import StoreSettings, TargetOptions, TileSettings, preprocess
from tilefeed.store import format as fmt
from tilefeed.store.codec import COMPRESSORS
from tilefeed.store.documents import open_store
from tilefeed.store.errors import CorruptChunkError, StoreFormatError
from tilefeed.store.inspection import info, verify
from tilefeed.store.shard import ShardFile, ShardIndex

T = 32


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("targets-store")
    coco = write_coco(root, images=9, planted=False)
    out = root / "store"
    preprocess(coco.src, out, TileSettings(tile=T), StoreSettings(shard_size=4), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    return out


@pytest.fixture
def store(honest: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(honest, copy)
    return copy


def _objects_chunk(store: Path, change: Callable[[np.ndarray], object]) -> None:
    """The objects array's one chunk rewritten with ``change`` made to its rows."""
    _, meta = open_store(store)
    with StoreReader(store) as reader:
        assert reader.targets is not None and reader.targets.objects is not None
        rows = np.array(reader.targets.objects)
    change(rows)
    write_small_chunk(store, fmt.OBJECTS, 0, bytes(COMPRESSORS["zstd"].encode(rows.astype("<f8").tobytes())))


def _offsets_chunk(store: Path, change: Callable[[np.ndarray], object]) -> None:
    with StoreReader(store) as reader:
        assert reader.targets is not None and reader.targets.offsets is not None
        offsets = np.array(reader.targets.offsets)
    change(offsets)
    payload = bytes(COMPRESSORS["zstd"].encode(offsets.astype("<i8").tobytes()))
    write_small_chunk(store, fmt.OBJECT_OFFSETS, 0, payload)


def _mask_chunk(store: Path, sample: int, payload: bytes) -> None:
    """Sample's mask chunk replaced (crc32c appended) in a rebuilt shard, re-signed."""
    write_mask_chunk(store, sample, payload)


def _refused(store: Path, error: type[Exception], match: str, deep: bool = False) -> None:
    """The reader refuses the store in one line (reading every mask), and verify lists it."""
    with pytest.raises(error, match=match) as e:
        with StoreReader(store) as reader:
            assert reader.targets is not None
            out = np.empty((len(reader), T, T), dtype=np.uint8)
            reader.targets.read_masks_into(np.arange(len(reader)), out)
    assert "\n" not in str(e.value)
    problems = verify(store, deep=deep)
    assert any(m in line for line in problems for m in match.split("|")), problems


def test_the_honest_store_is_sound(honest: Path) -> None:
    assert verify(honest, deep=True) == []
    attrs, meta = open_store(honest)
    assert attrs["version"] == 3 and meta.targets is not None and meta.masks is not None
    assert info(honest).format == "tilefeed v3"


def test_the_targets_cross_to_another_process(honest: Path) -> None:
    """A reader pickled (as the Loader sends it to its workers) reads the same rows and masks."""
    with StoreReader(honest) as reader:
        assert reader.targets is not None
        masks = np.empty((len(reader), T, T), dtype=np.uint8)
        reader.targets.read_masks_into(np.arange(len(reader)), masks)
        copy = pickle.loads(pickle.dumps(reader))
    try:
        assert copy.targets is not None
        again = np.empty_like(masks)
        copy.targets.read_masks_into(np.arange(len(copy)), again)
        np.testing.assert_array_equal(again, masks)
        everyone = range(len(copy))
        for a, b in zip(copy.targets.rows(everyone), reader.targets.rows(everyone), strict=True):
            np.testing.assert_array_equal(a, b)
        assert copy.read(0).shape == (T, T, 3)
    finally:
        copy.close()


def test_a_version_2_store_is_read_and_has_no_targets(tmp_path: Path) -> None:
    """A store written as version 2 (no targets, the version field 2, re-signed) opens, reads and
    verifies; its targets are None. Version 1 and one newer than this tilefeed stay refused."""
    src = write_folder(tmp_path / "src", classes=2, per_class=3, size=(40, 30))
    out = tmp_path / "store"
    preprocess(src, out, TileSettings(tile=16), workers=1)
    edit_attrs(out, lambda a: a.update(version=2))
    with StoreReader(out) as reader:
        assert reader.targets is None and len(reader) == 6
        assert reader.read(0).shape == (16, 16, 3)
    assert verify(out, deep=True) == []
    assert info(out).format == "tilefeed v2" and info(out).targets is None
    assert "targets" not in run_cli("info", str(out)).stdout
    for version, match in ((1, "rebuild it"), (fmt.FORMAT_VERSION + 1, "upgrade tilefeed")):
        edit_attrs(out, lambda a, v=version: a.update(version=v))  # type: ignore[misc]
        with pytest.raises(StoreFormatError, match=match):
            StoreReader(out)


def test_targets_in_a_version_2_store_are_refused(store: Path) -> None:
    edit_attrs(store, lambda a: a.update(version=2))
    for opening in (StoreReader, verify):
        with pytest.raises(StoreFormatError, match="must be absent in a version-2 store"):
            opening(store)


def test_decreasing_offsets_are_refused(store: Path) -> None:
    def decrease(offsets: np.ndarray) -> None:
        offsets[2] = offsets[3] + 1  # sample 2 ends after sample 3

    _offsets_chunk(store, decrease)
    _refused(store, StoreFormatError, "object_offsets decrease")


def test_offsets_past_the_objects_are_refused(store: Path) -> None:
    _offsets_chunk(store, lambda o: o.__setitem__(-1, o[-1] + 5))
    _refused(store, StoreFormatError, "must run from 0 to the object count")


@pytest.mark.parametrize("column,value", [(2, T + 0.5), (0, -1.0), (3, 0.0), (4, 5.0), (5, 2.0), (1, np.nan)])
def test_an_object_row_out_of_range_is_refused(store: Path, column: int, value: float) -> None:
    """A box outside its tile (or of no height), a category not in the table, a crowd flag
    other than 0 or 1, a coordinate that is not finite."""
    _objects_chunk(store, lambda rows: rows.__setitem__((0, column), value))
    _refused(store, StoreFormatError, "not inside its|not in the category table|not 0 or 1|not finite")


def test_a_mask_chunk_of_the_wrong_size_is_refused_before_decoding(store: Path) -> None:
    _mask_chunk(store, 1, bytes(COMPRESSORS["zstd"].encode(np.zeros(T * T + 7, dtype=np.uint8))))
    _refused(store, CorruptChunkError, "mask chunk declares 1031 decoded bytes", deep=True)


def test_a_mask_bomb_is_refused_from_its_header(store: Path) -> None:
    _mask_chunk(store, 2, zstd_rle(2 << 30))
    _refused(store, CorruptChunkError, "mask chunk declares 2147483648 decoded bytes", deep=True)


def test_an_instance_id_past_the_tile_objects_is_refused(store: Path) -> None:
    with StoreReader(store) as reader:
        assert reader.targets is not None
        count = int(reader.targets.counts([0])[0])
    _mask_chunk(store, 0, bytes(COMPRESSORS["zstd"].encode(np.full(T * T, count + 1, dtype=np.uint8))))
    _refused(store, CorruptChunkError, f"instance id {count + 1}, the tile has {count} objects", deep=True)


def test_a_damaged_mask_chunk_fails_its_crc(store: Path) -> None:
    path = fmt.shard_path(store, 0, fmt.MASKS)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    _refused(store, CorruptChunkError, "chunk crc32c mismatch")


def test_mask_shards_moved_about_fail_their_sha256(store: Path) -> None:
    """Two mask chunks swapped, each crc32c intact and the sizes right: only the shard's sha256 tells."""
    attrs = attrs_of(store)
    per = attrs["shard_size"]
    f = ShardFile(store, 0, per, fmt.MASKS)
    chunks = [bytes(f.chunk(i)) + fmt.crc_bytes(bytes(f.chunk(i))) for i in range(len(f))]
    f.close()
    chunks[0], chunks[1] = chunks[1], chunks[0]
    fmt.shard_path(store, 0, fmt.MASKS).write_bytes(
        b"".join(chunks) + ShardIndex.packed(per, [len(c) for c in chunks]).encode())
    assert any("shard sha256 mismatch" in line for line in verify(store))


@pytest.mark.parametrize("change,match", [
    (lambda a: a["arrays"].pop(fmt.MASKS), "lacks masks"),
    (lambda a: a["arrays"].pop(fmt.FRAMES), "lacks frames"),
    (lambda a: a["targets"].update(masks=None), "holds masks"),
    (lambda a: a["targets"].update(masks="panoptic"), "must be null or one of"),
    (lambda a: a["targets"].update(objects=a["targets"]["objects"] + 1), "targets.objects"),
    (lambda a: a["targets"].update(categories=a["targets"]["categories"][::-1]), "ascending"),
    (lambda a: a["targets"].update(boxes=False), "instance without boxes"),
    (lambda a: a["arrays"][fmt.MASKS].update(shard_bytes=[1, 1, 1]), "must be at least"),
    (lambda a: a["arrays"][fmt.OBJECT_OFFSETS].update(length=a["samples"]), "one per sample and one more"),
])
def test_targets_attributes_that_disagree_are_refused(store: Path, change: Callable[[dict], object],
                                                      match: str) -> None:
    edit_attrs(store, change)
    with pytest.raises(StoreFormatError, match=match) as e:
        StoreReader(store)
    assert "\n" not in str(e.value)


def test_a_masks_document_that_disagrees_is_refused(store: Path) -> None:
    from tests.store.hostile_store_cases import edit_array_doc

    edit_array_doc(store, fmt.MASKS, lambda d: d["codecs"][0]["configuration"]["codecs"].pop(1))
    problems = verify(store)
    assert any("masks/zarr.json: codecs are" in line for line in problems), problems
    with pytest.raises(CorruptChunkError, match="codecs are"):
        StoreReader(store)


def test_the_node_s_record_holds_the_targets_and_vouches_for_no_changed_file(store: Path) -> None:
    """The first open checks the targets and leaves them in the node's record; the next maps
    them (the same values); a chunk rewritten since (re-signed) is checked again and refused."""
    with StoreReader(store) as first:
        assert first.targets is not None and first.targets.objects is not None
        rows = np.array(first.targets.objects)
        frames = np.array(first.targets.frames)
    with StoreReader(store) as second:
        assert second._arrays_mapped and second.targets is not None
        np.testing.assert_array_equal(second.targets.objects, rows)
        np.testing.assert_array_equal(second.targets.frames, frames)
        copy = pickle.loads(pickle.dumps(second))
        assert copy.targets is not None
        np.testing.assert_array_equal(copy.targets.objects, rows)
        copy.close()
    _objects_chunk(store, lambda r: r.__setitem__((0, 2), T + 3.0))
    with pytest.raises(StoreFormatError, match="not inside its"):
        StoreReader(store)
