"""The store's metadata, written last: the small arrays, the array documents and the
group's tilefeed attributes, whose presence marks the store complete."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess.settings import StoreSettings, TileSettings, describe
from tilefeed.preprocess.sources import Sources


def write_metadata(
    root: Path, sources: Sources, tiles: TileSettings, store: StoreSettings, fingerprint: str,
    records: list[dict[str, Any]], owners: np.ndarray, rejects: list[tuple[str, str]],
    accepted: int, shard_bytes: list[int], shard_sha256: list[str],
) -> None:
    import zarr

    from tilefeed.preprocess import zarr_codecs

    samples = len(owners)
    t = tiles.tile
    # zarr.create_array would clear the shards already in place, so let it write the images
    # array's metadata in a scratch folder and move just that document into the store.
    scratch = root / fmt.WORK_DIR / "metadata"
    zarr.create_array(
        str(scratch), name=fmt.IMAGES, shape=(samples, t, t, 3), dtype="uint8",
        chunks=(1, t, t, 3), shards=(store.shard_size, t, t, 3), fill_value=0, overwrite=True,
        dimension_names=["sample", "y", "x", "channel"], zarr_format=3,
        **zarr_codecs.images_codecs(store.codec, store.quality),
    )
    (root / fmt.IMAGES).mkdir(exist_ok=True)
    os.replace(scratch / fmt.IMAGES / "zarr.json", root / fmt.IMAGES / "zarr.json")
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    labels = np.asarray(sources.labels, dtype=np.int64)[owners]
    columns: dict[str, np.ndarray] = {fmt.LABELS: labels, fmt.SOURCES: owners}
    if tiles.mode == "grid":
        columns[fmt.ROWS] = np.array([v for r in records for v in r["rows"]], dtype=np.int32)
        columns[fmt.COLS] = np.array([v for r in records for v in r["cols"]], dtype=np.int32)
    columns[fmt.BOXES] = np.array([v for r in records for v in r["boxes"]], dtype=np.int32).reshape(-1, 4)
    for name, values in columns.items():
        group.create_array(name, data=values, chunks=(min(samples, fmt.SMALL_CHUNK), *values.shape[1:]),
                           overwrite=True, **zarr_codecs.small_array_codecs())
    paths = np.array(sources.paths, dtype=np.dtypes.StringDType())
    group.create_array(fmt.SOURCE_PATHS, data=paths, chunks=(min(len(paths), fmt.PATHS_CHUNK),),
                       overwrite=True, **zarr_codecs.small_array_codecs())
    attrs = {
        "format": fmt.FORMAT_NAME,
        "version": fmt.FORMAT_VERSION,
        "samples": samples,
        "sources": len(sources) + len(sources.skipped),
        "accepted": accepted,
        "rejected": len(rejects),
        "tile": [t, t, 3],
        "codec": store.codec,
        "quality": store.quality if store.codec == "jpeg" else None,
        "shard_size": store.shard_size,
        "shards": len(shard_bytes),
        "classes": sources.classes,
        "made": describe(tiles, store),
        "rejects": [{"path": p, "reason": r} for p, r in rejects],
        "fingerprint": fingerprint,
        "arrays": fmt.describe_arrays(root, [*columns, fmt.SOURCE_PATHS], shard_bytes,
                                      shard_sha256),
    }
    attrs["digest"] = fmt.attrs_digest(attrs)
    group.update_attributes({fmt.ATTRS_KEY: attrs})  # last: this write marks the store complete
