from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zarr

from tilefeed.store import format as fmt
from tilefeed.store.attrs import StoreAttrs
from tilefeed.store.codec import TileCodec
from tilefeed.store.documents import load_attrs
from tilefeed.store.errors import CorruptChunkError, StoreFormatError
from tilefeed.store.shard import ShardFile, ShardIndex
from tilefeed.store.zarr_codecs import images_codecs
from tests.helpers import assert_plain, photo, psnr


@pytest.mark.parametrize("codec", fmt.CODECS)
@pytest.mark.parametrize("tile", [16, 64])
def test_tile_codec_round_trip(codec: str, tile: int) -> None:
    pixels = np.asarray(photo(tile, tile, tile))
    tc = TileCodec(codec, tile, quality=95)
    chunk = tc.encode(pixels)
    assert fmt.crc_bytes(chunk[:-4]) == chunk[-4:]
    back = tc.decode(chunk[:-4])
    if codec == "jpeg":
        assert psnr(pixels, back) > 35
    else:
        np.testing.assert_array_equal(back, pixels)


def test_a_jpeg_of_another_size_is_refused_not_read_into_part_of_a_tile() -> None:
    small = TileCodec("jpeg", 16, quality=90).encode(np.asarray(photo(16, 16, 16)))[:-4]
    tile = np.zeros((32, 32, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="the tile is"):
        TileCodec("jpeg", 32, quality=90).decode(small, tile)


@pytest.mark.parametrize("codec", fmt.CODECS)
def test_chunks_and_index_match_what_zarr_writes(tmp_path: Path, codec: str) -> None:
    """The fast encoder and zarr-python's sharding codec produce the very same shard bytes."""
    t, s, n = 16, 4, 6
    data = np.stack([np.asarray(photo(i, t, t)) for i in range(n)])
    arr = zarr.create_array(str(tmp_path), name=fmt.IMAGES, shape=(n, t, t, 3), dtype="uint8",
                            chunks=(1, t, t, 3), shards=(s, t, t, 3), fill_value=0,
                            **images_codecs(codec, 90))
    arr[:] = data
    tc = TileCodec(codec, t, 90)
    for shard in range(fmt.shard_count(n, s)):
        raw = fmt.shard_path(tmp_path, shard).read_bytes()
        index = ShardIndex.decode(raw[-fmt.index_nbytes(s):], s, "x")
        for local in range(s):
            sample = shard * s + local
            offset, nbytes = (int(v) for v in index.table[local])
            if sample >= n:
                assert index.is_empty(local)
                continue
            assert raw[offset : offset + nbytes] == tc.encode(data[sample])
        f = ShardFile(tmp_path, shard, s)
        assert len(f) == min(s, n - shard * s)
        f.close()


def test_index_corruption_is_named(tmp_path: Path) -> None:
    index = ShardIndex.packed(3, [10, 10])
    raw = bytearray(index.encode())
    decoded = ShardIndex.decode(bytes(raw), 3, "s")
    np.testing.assert_array_equal(decoded.table[:2], [[0, 10], [10, 10]])
    assert decoded.written() == 2 and decoded.is_empty(2) and not decoded.is_empty(1)
    raw[3] ^= 0xFF
    with pytest.raises(CorruptChunkError, match="s: index crc32c mismatch"):
        ShardIndex.decode(bytes(raw), 3, "s")


def test_codec_names_are_members_equal_to_their_strings() -> None:
    assert fmt.CODECS == ("lz4", "zstd", "none", "jpeg") and all(type(c) is str for c in fmt.CODECS)
    assert tuple(fmt.CODEC_TABLE) == tuple(fmt.Codec) and [c.value for c in fmt.Codec] == list(fmt.CODECS)
    assert fmt.Codec.JPEG == "jpeg" and f"{fmt.Codec.NONE}" == "none"
    assert fmt.SMALL_ARRAY_CODEC is fmt.Codec.ZSTD
    for name in fmt.CODECS:
        assert TileCodec(name, 16).name is fmt.Codec(name)  # a string given becomes the member
        assert fmt.CODEC_TABLE[fmt.Codec(name)] is fmt.CODEC_TABLE[name]  # hashed as its string
    with pytest.raises(ValueError, match=r"^codec must be one of lz4, zstd, none, jpeg, got 'png'$"):
        TileCodec("png", 16)


def test_codec_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="codec must be one of"):
        TileCodec("png", 16)
    with pytest.raises(ValueError, match="quality"):
        TileCodec("jpeg", 16, quality=0)


def test_load_attrs_refuses_what_is_not_a_complete_store(tmp_path: Path) -> None:
    with pytest.raises(StoreFormatError, match="does not exist"):
        load_attrs(tmp_path / "none")
    with pytest.raises(StoreFormatError, match="not a tilefeed store"):
        load_attrs(tmp_path)
    (tmp_path / fmt.WORK_DIR).mkdir()
    with pytest.raises(StoreFormatError, match="incomplete"):
        load_attrs(tmp_path)
    zarr.open_group(str(tmp_path), mode="a").update_attributes(
        {fmt.ATTRS_KEY: {"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION + 1}})
    with pytest.raises(StoreFormatError, match="upgrade tilefeed"):
        load_attrs(tmp_path)


def test_the_summary_says_where_the_workers_time_went(image_folder: Path, tmp_path: Path) -> None:
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

    summary = preprocess(image_folder, tmp_path / "store", TileSettings(tile=32), StoreSettings(shard_size=4),
                         workers=1)
    assert list(summary.phases) == ["decode", "encode", "write", "copy", "sync"]
    assert all(seconds > 0 for seconds in summary.phases.values()), summary.phases
    # one worker: its phases lie within the run; the copy and the sync run beside it (threads)
    phases = summary.phases
    assert phases["decode"] + phases["encode"] + phases["write"] < summary.seconds
    assert phases["copy"] < summary.seconds and phases["sync"] < summary.seconds
    again = preprocess(image_folder, tmp_path / "store", TileSettings(tile=32), StoreSettings(shard_size=4))
    assert again.up_to_date and again.phases == {}


def test_group_attributes_of_any_shape_are_not_ours_rather_than_an_error() -> None:
    from tilefeed.store.documents import parse_attrs

    for document in (b'{"attributes": 5}', b"[1, 2]", b'{"attributes": {"tilefeed": 3}}', b"null"):
        assert parse_attrs(document) is None


@pytest.mark.parametrize("codec", fmt.CODECS)
def test_zarr_declares_each_codec_as_the_table_says(codec: str) -> None:
    spec = fmt.CODEC_TABLE[codec]
    declared = images_codecs(codec, 90)
    written = [c.to_dict() for c in (declared["serializer"], *declared["compressors"])]
    assert [c["name"] for c in written] == [name for name, _ in spec.declared()]
    if spec.compressor is not None:
        assert written[1]["configuration"] == spec.settings


@pytest.mark.parametrize("codec", ["lz4", "jpeg"])
def test_the_attributes_a_writer_records_are_the_typed_record_written_out(
        image_folder: Path, tmp_path: Path, codec: str) -> None:
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

    store = tmp_path / "store"
    preprocess(image_folder, store, TileSettings(tile=32, mode="grid"), StoreSettings(codec, shard_size=4),
               workers=1)
    on_disk = load_attrs(store)
    record = StoreAttrs.from_dict(on_disk, "store")
    assert json.dumps(record.to_dict()) == json.dumps(on_disk)  # the same fields, in the same order
    assert record.codec is fmt.Codec(codec) and on_disk["codec"] == codec
    assert_plain(record.to_dict(), "to_dict()")  # json.dumps writes a member as its string; pickle would not
    assert b"Codec" not in pickle.dumps(record.to_dict())  # a member is pickled by its class
    assert StoreAttrs.from_dict(record.to_dict(), "again") == record
    assert record.sealed() == record and record.shard_sha256 is not None

    older = replace(record, shard_sha256=None).sealed()  # as stores written before shard digests
    assert "shard_sha256" not in older.to_dict()["arrays"][fmt.IMAGES]
    assert StoreAttrs.from_dict(older.to_dict(), "older") == older
