"""Stores from elsewhere, crafted to hurt (``tests.store.hostile_store_cases`` makes them): each is
refused in one line, within seconds and a memory budget, touching no file outside the store, and
no reader ever serves a pixel or label the honest store does not hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numcodecs import Zstd

from tilefeed.store import format as fmt
from tilefeed.store.codec import COMPRESSORS, TileCodec, decode_jpeg, encode_jpeg, zstd_content_size
from tilefeed.store.shard import ShardFile, ShardIndex, read_tiles_into
from tilefeed.store.shard import chunks as shard_chunks
from tilefeed.store.errors import CorruptChunkError, TileDecodeError
from tests.helpers import make_store

REPO = Path(__file__).resolve().parents[2]  # the repository: tests/store/ is two folders down
ROWS_BUDGET_MB, ROWS_SECONDS = 1024, 60  # the bound for each of its rows
FIELDS_BUDGET_MB, FIELDS_SECONDS = 512, 5  # and for each mutation of the property

# What each row's refusal names: the field, the file, or the sample (any one of them).
NAMED = {
    "shards 10**12": ["'shards'"],
    "labels length 10**12, chunk 1": ["'arrays.labels.length'"],
    "labels chunk 0": ["'arrays.labels.chunk'"],
    "shard_size 0": ["'shard_size'"],
    'shards "3"': ["'shards'"],
    "group zarr.json 200,000 deep": ["zarr.json: nested deeper"],
    "labels zarr.json 200,000 deep": ["labels/zarr.json: nested deeper"],
    "tile 100000": ["'tile'"],
    "tile 8192": ["sample 0", "'arrays.images.shard_bytes'"],
    "short tile chunk": ["sample 3", "'arrays.images.shard_bytes'"],
    "tile chunk bomb": ["sample 3", "'arrays.images.shard_bytes'"],
    "labels zstd bomb": ["labels/c/0"],
    "labels frame overfull": ["labels/c/0"],
    "array name ../": ["'arrays' names"],
    "array name absolute": ["'arrays' names"],
    "labels chunk links outside": ["labels/c/0: lies outside the store"],
    "group zarr.json links outside": ["zarr.json: lies outside the store"],
    "group zarr.json a pipe": ["not a tilefeed store"],
}


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("honest")
    return {codec: make_store(root / codec, codec) for codec in fmt.CODECS}


def run_cases(store: Path, work: Path, suite: str, budget_mb: int, seconds: float) -> list[dict[str, Any]]:
    """The cases of ``suite`` in a child process under the memory budget (see
    ``tests.store.hostile_store_cases``)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.store.hostile_store_cases", str(store), str(work), suite,
         str(budget_mb), str(seconds)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"})  # thread arenas would count against the budget
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert results, done.stdout[-2000:]
    return results


def _bounded(r: dict[str, Any], seconds: float) -> None:
    assert not r.get("late") and r["seconds"] < seconds, r
    assert r["outside"] == [], r  # no file outside the store was opened


@pytest.mark.parametrize("codec", fmt.CODECS)
def test_every_row_of_the_table_is_refused_in_one_line(honest: dict[str, Path], tmp_path: Path,
                                                        codec: str) -> None:
    results = run_cases(honest[codec], tmp_path, "rows", ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [r["case"] for r in results] == list(NAMED)
    for r in results:
        _bounded(r, ROWS_SECONDS)
        for reader in ("verify", "reader"):
            outcome, message = r[reader]
            assert outcome == "refused", (r["case"], reader, r[reader])  # not a crash, not served
            assert any(name in message for name in NAMED[r["case"]]), (r["case"], reader, message)
        assert r["info"][0] in ("refused", "ok"), r  # info reads the attributes only
        if codec == "jpeg" and r["case"] in ("short tile chunk", "tile chunk bomb"):
            assert r["zarr"][0] == "refused", r  # zarr-python through tilefeed.jpeg: no 10 GiB ask


# What each crafted store with targets is refused for: the array or field named, and the reason.
TARGETS = {
    "object_offsets decrease": ["objects: object_offsets decrease at sample 2"],
    "object_offsets end past the objects": ["objects: object_offsets must run from 0 to the object count"],
    "object_offsets start at 3": ["objects: object_offsets must run from 0 to the object count"],
    "object_offsets length 10**12": ["'arrays.object_offsets.length'"],
    "objects 2**32 rows, chunks of 1": ["'arrays.objects.chunk' must be 262144"],
    "objects 2**40 rows, chunks of 2**18": ["'targets.objects' must be a whole number"],
    "objects 2**32 rows, chunks of 2**18": ["objects/c/1/0: missing chunk"],
    "object x0 NaN": ["objects: an object row is not finite"],
    "object y1 inf": ["objects: an object row is not finite"],
    "object x1 < x0": ["objects: object 0's box"],
    "object category 5 not in the table": ["objects: object 0's category", "not in the category table"],
    "object category NaN": ["objects: an object row is not finite"],
    "object iscrowd 2": ["objects: object 0's iscrowd"],
    "object iscrowd 0.5": ["objects: object 0's iscrowd"],
    "frame sx 0": ["frames: sample 0's frame"],
    "frame sy -1": ["frames: sample 1's frame"],
    "frame tx NaN": ["frames: sample 2's frame"],
    "frame ty -inf": ["frames: sample 2's frame"],
    "objects zarr.json float32": ["objects/zarr.json: data_type is 'float32'"],
    "frames zarr.json rows of 3": ["frames/zarr.json: shape is"],
    "masks zarr.json shape 10**9": ["masks/zarr.json: shape is"],
    "masks zarr.json uint16": ["masks/zarr.json: data_type is 'uint16'"],
    "masks zarr.json quarter-tile chunks": ["masks/zarr.json: chunk_shape is"],
    "masks shard cut short": ["masks/c/0/0/0: sample 2"],
    "mask chunk zstd bomb": ["masks/c/0/0/0: sample 1: mask chunk declares 2147483648 decoded bytes"],
    "mask frame overfull": ["masks/c/0/0/0: sample 1: mask does not decode"],
    "instance id past the object count": ["masks/c/0/0/0: sample 0: the mask holds instance id"],
    "mask frame without a size": ["masks/c/0/0/0: sample 1: mask chunk declares no decoded size"],
    "mask chunk: a tile's frame, then a 2 GiB one": ["masks/c/0/0/0: sample 1: mask does not decode"],
    "a tile of 300 objects with instance masks": ["objects: sample 0 holds more than 254 objects"],
    "targets null, arrays present": ["'targets' must be an object"],
    "targets absent, arrays present": ["'arrays' holds object_offsets, which the store's targets do not hold"],
    "version 2, targets present": ["'targets' must be absent in a version-2 store"],
    "targets, objects absent": ["'arrays' lacks objects"],
    "objects chunk file absent": ["objects/c/0/0: missing chunk"],
}

SEMANTIC = {
    "class id 9 not in the table": ["masks/c/0/0/0: sample 0: the mask holds class id 9"],
    "class id 254 not in the table": ["masks/c/0/0/0: sample 0: the mask holds class id 254"],
    "semantic mask zstd bomb": ["masks/c/0/0/0: sample 1: mask chunk declares 2147483648 decoded bytes"],
    "masks called instance without boxes": ["'targets.masks' must not be instance without boxes"],
    "boxes claimed, no object arrays": ["'arrays' lacks object_offsets"],
    "objects claimed without boxes": ["'targets.objects' must be a whole number in 0..0"],
    "masks shard absent": ["masks/c/1/0/0: missing shard"],
}

BOXES = {
    # a gap once: the int64 differences of these offsets are all positive, so the tiles' rows
    # were served from the wrong places (verify found the store sound)
    "object_offsets wrap around int64": ["objects: object_offsets decrease at sample 1"],
    "object_offsets negative inside": ["objects: object_offsets decrease at sample 0"],
    "masks claimed, none written": ["'arrays' lacks masks"],
}


@pytest.fixture(scope="module")
def honest_boxes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of boxes without masks (32 px tiles, shards of 4) from a generated COCO set."""
    from tests.preprocess.targets_data import write_coco
    from tilefeed.preprocess import StoreSettings, TargetOptions, TileSettings, preprocess

    root = tmp_path_factory.mktemp("honest-boxes")
    coco = write_coco(root, images=9, planted=False)
    preprocess(coco.src, root / "store", TileSettings(tile=32), StoreSettings(shard_size=4), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations)))
    return root / "store"


@pytest.fixture(scope="module")
def honest_semantic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of semantic masks, no boxes (32 px tiles, shards of 4), from a generated folder."""
    from tests.preprocess.targets_data import write_semantic
    from tilefeed.preprocess import StoreSettings, TargetOptions, TileSettings, preprocess

    root = tmp_path_factory.mktemp("honest-semantic")
    sem = write_semantic(root)
    preprocess(sem.src, root / "store", TileSettings(tile=32), StoreSettings(shard_size=4), workers=1,
               targets=TargetOptions(masks=str(sem.masks)))
    return root / "store"


@pytest.fixture(scope="module")
def honest_targets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of boxes and instance masks (32 px tiles, shards of 4) from a generated COCO set."""
    from tests.preprocess.targets_data import write_coco
    from tilefeed.preprocess import StoreSettings, TargetOptions, TileSettings, preprocess

    root = tmp_path_factory.mktemp("honest-targets")
    coco = write_coco(root, images=9, planted=False)
    preprocess(coco.src, root / "store", TileSettings(tile=32), StoreSettings(shard_size=4), workers=1,
               targets=TargetOptions(annotations=str(coco.annotations), instance_masks=True))
    return root / "store"


@pytest.mark.parametrize("suite", ["targets", "semantic", "boxes"])
def test_every_crafted_targets_store_is_refused_in_one_line(request: pytest.FixtureRequest, tmp_path: Path,
                                                            suite: str) -> None:
    """verify --deep and the StoreReader (every object row, frame and mask tile read) refuse each
    store in one line naming the array or field; nothing is allocated by a declared size.
    ``targets``: boxes and instance masks; ``semantic``: semantic masks without boxes;
    ``boxes``: boxes without masks."""
    honest = request.getfixturevalue(f"honest_{suite}")
    expected = {"targets": TARGETS, "semantic": SEMANTIC, "boxes": BOXES}[suite]
    results = run_cases(honest, tmp_path, suite, ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [r["case"] for r in results] == list(expected)
    for r in results:
        _bounded(r, ROWS_SECONDS)
        for reader in ("verify", "reader"):
            outcome, message = r[reader]
            assert outcome == "refused", (r["case"], reader, r[reader])
            assert all(name in message for name in expected[r["case"]]), (r["case"], reader, message)
        assert r["info"][0] in ("refused", "ok"), r


def test_the_targets_harness_reads_the_honest_store_and_tells_a_changed_one(honest_targets: Path,
                                                                            tmp_path: Path) -> None:
    """The controls: the harness's reader serves the honest store's rows, frames and masks, a copy
    re-signed with the same values reads honestly (a harness that refused everything would pass
    the test above), and a valid box moved a pixel is told from the honest one."""
    results = run_cases(honest_targets, tmp_path, "targets-control", ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [(r["case"], r["verify"], r["reader"]) for r in results] == [
        ("honest", ["sound", ""], ["honest", ""]), ("re-signed", ["sound", ""], ["honest", ""]),
        ("box moved a pixel", ["sound", ""], ["wrong", "objects"])]


# What each crafted store of captions and fields is refused for: the array or attribute named, and why.
PAIRS = {
    "caption not UTF-8": ["text.caption/c/0: holds a string that is not valid UTF-8"],
    "caption holding a NUL": ["text.caption/c/0: caption 0 holds a NUL character"],
    "caption of 40 KiB": ["text.caption/c/0: string 0 is longer than 32768 UTF-8 bytes"],
    "vlen header declares 10**9 strings": ["text.caption/c/0: its vlen header does not declare its 24 strings"],
    "caption chunk zstd bomb": ["text.caption/c/0: declares 2147483648 decoded bytes"],
    "vlen item list truncated": ["text.caption/c/0: its strings do not decode"],
    "texts naming ../x": ["attribute 'texts' must list", "'../x'"],
    "texts naming a caption without its array": ["attribute 'arrays.text.alt' is missing"],
    "texts listing 10**6 names": ["attribute 'texts' must list at most 16"],
    "fields dtype int8": ["attribute 'fields' must list", "dtypes one of int64, float64, string"],
    "field.width zarr.json float64": ["field.width/zarr.json: data_type is 'float64'"],
    "text.caption a row shorter than source_paths": ["'arrays.text.caption.length' must be 24"],
    "version 3, texts present": ["attribute 'texts' must be absent in a version-3 store"],
    "string field of 10 KiB": ["field.uid/c/0: string 0 is longer than 4096 UTF-8 bytes"],
    "fields: score int64, its array float64": ["field.score/zarr.json: data_type is 'float64'",
                                               "attributes say 'int64'"],
    "field.score frame declaring 2 GiB": ["field.score/c/0: declares 2147483648 decoded bytes"],
    "text.caption chunk links outside": ["text.caption/c/0: lies outside the store"],
}


@pytest.fixture(scope="module")
def honest_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image-text store: 24 pictures, captions ``caption`` and ``synthetic``, fields ``uid``
    (strings), ``score`` (float64) and ``width`` (int64), no class labels."""
    from tests.helpers import make_pairs_store

    return make_pairs_store(tmp_path_factory.mktemp("honest-pairs"), 24)


def test_every_crafted_pairs_store_is_refused_in_one_line(honest_pairs: Path, tmp_path: Path) -> None:
    """verify --deep, the readers of every caption and field (``read_pairs`` after the
    StoreReader's tiles and labels) and a Loader asked for a caption and every field refuse each
    store in one line naming the array or attribute; no string is allocated by a declared size."""
    results = run_cases(honest_pairs, tmp_path, "pairs", ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [r["case"] for r in results] == list(PAIRS)
    for r in results:
        _bounded(r, ROWS_SECONDS)
        for reader in ("verify", "reader", "loader"):
            outcome, message = r[reader]
            assert outcome == "refused", (r["case"], reader, r[reader])
            assert all(name in message for name in PAIRS[r["case"]]), (r["case"], reader, message)
        assert r["info"][0] in ("refused", "ok"), r


def test_the_pairs_harness_reads_the_honest_store_and_tells_a_changed_one(honest_pairs: Path,
                                                                          tmp_path: Path) -> None:
    """The controls: the honest store's captions and fields are read back, so is a copy whose
    every caption and field chunk is written again with the same values and re-signed, and a
    valid caption changed is told from the honest one by both readers."""
    results = run_cases(honest_pairs, tmp_path, "pairs-control", ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [(r["case"], r["verify"], r["reader"], r["loader"]) for r in results] == [
        ("honest", ["sound", ""], ["honest", ""], ["honest", ""]),
        ("re-signed", ["sound", ""], ["honest", ""], ["honest", ""]),
        ("first caption changed", ["sound", ""], ["wrong", "text.caption"], ["wrong", "sample 0"])]


# What ``tilefeed audit`` makes of each hostile ledger: refused, or answered without a table or a
# set sized by the largest id or the world size a file states.
LEDGER = {
    "population holds id 10**12": ["ok", "once=1 twice=0 never=1"],  # a sparse subset is valid
    "record holds id 10**12": ["refused", "not in the population"],
    "record holds an id outside the population": ["refused", "not in the population"],
    "world size 10**12": ["ok", "once=1 twice=0 never=1"],  # one rank of many: not complete
    "population a zlib bomb": ["refused", "holds more than"],
    # a whole store's ledger states only a count: nothing is sized by it
    "population a count of 10**12": ["ok", "once=1 twice=0 never=999999999999"],
    "record past the population count": ["refused", "not in the population"],
    "population count not a count": ["refused", "not a sample count"],
    "population count a megabyte of JSON": ["refused", "not a sample count"],
}


def test_the_ledger_rows_are_answered_or_refused_in_one_line(honest: dict[str, Path], tmp_path: Path) -> None:
    results = run_cases(honest["lz4"], tmp_path, "ledger", ROWS_BUDGET_MB, ROWS_SECONDS)
    assert [r["case"] for r in results] == list(LEDGER)
    for r in results:
        _bounded(r, ROWS_SECONDS)
        outcome, text = LEDGER[r["case"]]
        assert r["audit"][0] == outcome and text in r["audit"][1], r


def _honest_or_refused(r: dict[str, Any]) -> None:
    _bounded(r, FIELDS_SECONDS)
    assert r["verify"][0] in ("refused", "sound"), r
    assert r["info"][0] in ("refused", "ok"), r
    for reader in ("reader", "loader") if "loader" in r else ("reader",):  # the pairs suites: a Loader too
        assert r[reader][0] in ("refused", "honest"), r
        if r["verify"][0] == "sound":
            assert r[reader][0] == "honest", r


def test_every_attribute_field_mutated_is_refused_or_read_honestly(honest: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """Each field of the attributes (every entry of the short lists, three of the long ones) as
    another type, negated, zero, huge, long, or nested deep, its digest recomputed."""
    results = run_cases(honest["lz4"], tmp_path, "fields", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
    fields = {r["case"].rsplit(" ", 1)[0] for r in results}
    assert {"samples", "shards", "shard_size", "tile.0", "arrays.labels.chunk",
            "arrays.images.shard_bytes.0", "classes"} <= fields
    assert sum(r["reader"][0] == "refused" for r in results) > len(results) // 2


def test_every_chunk_damaged_is_refused_or_read_honestly(honest: dict[str, Path], tmp_path: Path) -> None:
    """A byte flipped at the start, the end and each tile's boundaries of every shard and array
    chunk, and each file cut short and grown."""
    results = run_cases(honest["lz4"], tmp_path, "bytes", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
        assert r["verify"][0] == "refused", r  # every change to a chunk is found


def test_every_attribute_field_of_a_targets_store_mutated_is_refused_or_read_honestly(
        honest_targets: Path, tmp_path: Path) -> None:
    """The property above over a store of boxes and instance masks: the targets' fields and their
    arrays' records mutated too, the reader reading every row, frame and mask."""
    results = run_cases(honest_targets, tmp_path, "fields", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
    fields = {r["case"].rsplit(" ", 1)[0] for r in results}
    assert {"targets.boxes", "targets.masks", "targets.objects", "targets.categories.0.id",
            "arrays.objects.length", "arrays.object_offsets.chunk", "arrays.frames.sha256",
            "arrays.masks.shard_bytes.0"} <= fields, sorted(fields)


def test_every_chunk_of_a_targets_store_damaged_is_refused_or_read_honestly(honest_targets: Path,
                                                                          tmp_path: Path) -> None:
    """As above, over a store of boxes and instance masks: every mask shard's tile chunks and
    index, and the object, offset and frame chunks; the reader reads every row, frame and mask."""
    results = run_cases(honest_targets, tmp_path, "bytes", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
        assert r["verify"][0] == "refused", r
    damaged = {r["case"].split(" ")[0].split("/")[0] for r in results}
    assert {fmt.MASKS, fmt.OBJECTS, fmt.OBJECT_OFFSETS, fmt.FRAMES} <= damaged
    assert sum(r["case"].startswith(fmt.MASKS) for r in results) > 3 * 4  # every tile's chunk bounds


def test_every_attribute_field_of_a_pairs_store_mutated_is_refused_or_read_honestly(
        honest_pairs: Path, tmp_path: Path) -> None:
    """The property over a store of captions and fields: ``texts``, ``fields``, ``labelled`` and
    each caption and field array's record mutated; the readers read every caption and field."""
    results = run_cases(honest_pairs, tmp_path, "pairs-fields", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
    fields = {r["case"].rsplit(" ", 1)[0] for r in results}
    assert {"texts", "texts.0", "fields.0.name", "fields.1.dtype", "labelled", "arrays.text.caption.length",
            "arrays.field.uid.sha256", "arrays.field.width.chunk"} <= fields, sorted(fields)
    assert sum(r["loader"][0] == "refused" for r in results) > len(results) // 2


def test_every_chunk_of_a_pairs_store_damaged_is_refused_or_read_honestly(honest_pairs: Path,
                                                                        tmp_path: Path) -> None:
    """A byte flipped, each file cut short and grown, in every caption and field chunk too:
    each found by verify, none served."""
    results = run_cases(honest_pairs, tmp_path, "pairs-bytes", FIELDS_BUDGET_MB, FIELDS_SECONDS)
    for r in results:
        _honest_or_refused(r)
        assert r["verify"][0] == "refused", r
    damaged = {r["case"].split(" ")[0].split("/")[0] for r in results}
    assert {"text.caption", "text.synthetic", "field.uid", "field.score", "field.width"} <= damaged


# -- the decoded-size checks, one codec at a time --------------------------------------------------
@pytest.mark.parametrize("size", [0, 16, 255, 256, 300, 65_791, 70_000, 3 * 224 * 224])
def test_the_zstd_header_gives_the_content_size_numcodecs_wrote(size: int) -> None:
    frame = bytes(Zstd(level=3).encode(np.arange(size, dtype=np.uint8)))
    assert zstd_content_size(frame) == size


@pytest.mark.parametrize("codec", ["lz4", "zstd", "none"])
@pytest.mark.parametrize("tiles", [0.5, 2])
def test_a_chunk_of_another_size_is_refused_before_decoding(codec: str, tiles: float) -> None:
    tc = TileCodec(codec, 16)
    wrong = np.zeros(int(tc.nbytes * tiles), dtype=np.uint8)
    payload = {"lz4": lambda: bytes(COMPRESSORS["lz4"].encode(wrong)),
               "zstd": lambda: bytes(COMPRESSORS["zstd"].encode(wrong)),
               "none": lambda: wrong.tobytes()}[codec]()
    out = np.full(tc.shape, 7, dtype=np.uint8)
    with pytest.raises(TileDecodeError, match=f"{codec} chunk: declares {wrong.size} decoded bytes"):
        tc.decode(payload, out)
    assert (out == 7).all()  # nothing written: no part of a tile is left over from another sample


def test_a_shard_names_the_sample_whose_chunk_is_short(tmp_path: Path) -> None:
    tc = TileCodec("lz4", 16)
    short = bytes(COMPRESSORS["lz4"].encode(np.ones(16, np.uint8)))  # valid lz4, its crc32c right
    chunks = [tc.encode(np.ones(tc.shape, np.uint8)), short + fmt.crc_bytes(short)]
    path = fmt.shard_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(chunks) + ShardIndex.packed(2, [len(c) for c in chunks]).encode())
    f = ShardFile(tmp_path, 0, 2)
    out = np.empty(tc.shape, np.uint8)
    f.read_into(0, tc, out)
    with pytest.raises(CorruptChunkError, match=r"0/0/0/0: sample 1: declares 16 decoded bytes, the tile"):
        f.read_into(1, tc, out)
    f.close()



@pytest.mark.parametrize(("codec", "side"), [("none", 16), ("lz4", 16), ("jpeg", 16), ("lz4", 64)])
def test_a_batch_reads_as_its_tiles_one_by_one_and_names_a_bad_one(tmp_path: Path, codec: str,
                                                                   side: int) -> None:
    """Small chunks are gathered before decoding, large ones (64 px of noise) read in place."""
    tc = TileCodec(codec, side)
    rng = np.random.default_rng(0)
    tiles = [rng.integers(0, 256, tc.shape, dtype=np.uint8) for _ in range(3)]
    chunks = [tc.encode(t) for t in tiles]
    path = fmt.shard_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    index = ShardIndex.packed(4, [len(c) for c in chunks])
    index.table[3] = (len(b"".join(chunks)) - 4, 8)  # reaches past the data into the index
    path.write_bytes(b"".join(chunks) + index.encode())
    f = ShardFile(tmp_path, 0, 4)
    local, rows = [2, 0, 1, 0], [3, 1, 0, 2]
    batch = np.zeros((4, *tc.shape), np.uint8)
    read_tiles_into([f] * 4, local, tc, batch, rows)
    for i, k in zip(local, rows, strict=True):
        one = np.empty(tc.shape, np.uint8)
        f.read_into(i, tc, one)
        np.testing.assert_array_equal(batch[k], one)
    assert [bytes(c) for c in shard_chunks([f] * 3, [0, 1, 2])] == [c[:-4] for c in chunks]
    with pytest.raises(CorruptChunkError, match=r"sample 3: index entry \(\d+, 8\) is invalid"):
        read_tiles_into([f] * 2, [0, 3], tc, batch, range(2))
    crc_flipped = bytearray(path.read_bytes())
    crc_flipped[len(chunks[0]) - 1] ^= 1  # the first tile's crc32c
    path.write_bytes(bytes(crc_flipped))
    f = ShardFile(tmp_path, 0, 4)
    with pytest.raises(CorruptChunkError, match="sample 0: chunk crc32c mismatch"):
        read_tiles_into([f] * 2, [1, 0], tc, batch, range(2))

def test_a_huge_jpeg_is_refused_from_its_header_without_a_buffer() -> None:
    from tests.store.hostile_store_cases import jpeg_with_size

    jpeg = encode_jpeg(np.zeros((16, 16, 3), np.uint8), 90)
    with pytest.raises(TileDecodeError, match="65500x65500 picture"):
        decode_jpeg(jpeg_with_size(jpeg, 65500, 65500))
