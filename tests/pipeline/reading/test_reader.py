"""``StoreReader``'s description of its store: one typed record, ``meta``."""

from __future__ import annotations

from pathlib import Path

from tilefeed.pipeline import StoreReader
from tilefeed.store import format as fmt
from tilefeed.store.attrs import StoreAttrs
from tilefeed.store.documents import load_attrs


def test_the_reader_describes_its_store_by_the_typed_record_alone(store: Path) -> None:
    with StoreReader(store) as reader:
        meta = reader.meta
        assert isinstance(meta, StoreAttrs) and not hasattr(reader, "attrs")  # no second, untyped copy
        assert meta == StoreAttrs.from_dict(load_attrs(store), "store")
        assert (meta.samples, meta.tile, meta.shard_size) == (len(reader), reader.tile, reader.shard_size)
        assert meta.codec is fmt.Codec.LZ4 and reader.codec.name is fmt.Codec.LZ4
        assert meta.made["codec"] == "lz4" and type(meta.made["codec"]) is str
        assert fmt.SOURCES in meta.arrays and meta.shards == fmt.shard_count(len(reader), reader.shard_size)
