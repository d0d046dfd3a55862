"""The work that runs on worker processes (local, or Dask workers on other machines).

Each task is idempotent: every file appears whole or not at all (a temporary name then a
rename in a folder, one put in a bucket), so a task whose worker died simply runs again. A
part's chunk bytes stream to its file as they are encoded; its small JSON record is written
last and marks the part done.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

from numcodecs import blosc

from tilefeed.preprocess import format as fmt
from tilefeed.preprocess.images import Rejected, Tiles, load_tiles
from tilefeed.preprocess.settings import StoreSettings, TileSettings
from tilefeed.preprocess.storage import Storage


def part_name(part: int, suffix: str) -> str:
    return f"part-{part:07d}{suffix}"


def write_part(
    out: Storage, work: str, part: int, first: int, paths: list[str], tiles: TileSettings,
    store: StoreSettings, isolate: bool = False,
) -> dict[str, Any]:
    """Worker task: decode one part's sources, write their chunk bytes, then the part's record.

    Chunks stream to the file as they are encoded, so no part is ever held in memory whole.
    ``isolate`` decodes each image in a child process of its own: the retry of a part whose
    worker died, so that the image that kills a decoder is the only one lost.
    """
    blosc.use_threads = False  # a worker process of the writer's: its parallelism is the pool's
    load = load_isolated if isolate else load_tiles
    codec = fmt.TileCodec(store.codec, tiles.tile, store.quality)
    record: dict[str, Any] = {"count": len(paths), "sizes": [], "sources": [], "rows": [],
                              "cols": [], "boxes": [], "rejects": []}
    clock = time.perf_counter
    spent = dict.fromkeys(("decode", "encode", "write"), 0.0)  # seconds, for `bench preprocess`
    with out.writer(f"{work}/{part_name(part, '.bin')}") as f:
        for k, path in enumerate(paths):
            t0 = clock()
            try:
                result = load(path, tiles)
            except Rejected as e:
                record["rejects"].append([first + k, str(e)])
                continue
            finally:
                spent["decode"] += clock() - t0
            for pixels in result.pixels:
                t1 = clock()
                payload, crc = codec.encode_parts(pixels)
                t2 = clock()
                f.write(payload)
                f.write(crc)
                spent["encode"] += t2 - t1
                spent["write"] += clock() - t2
                record["sizes"].append(len(payload) + len(crc))
            record["sources"] += [first + k] * len(result.pixels)
            record["rows"] += result.rows.tolist()
            record["cols"] += result.cols.tolist()
            record["boxes"] += result.boxes.tolist()
        t3 = clock()
    spent["write"] += clock() - t3  # the part file's rename (or upload)
    record["seconds"] = spent
    out.write(f"{work}/{part_name(part, '.json')}", json.dumps(record).encode())
    return record


def load_isolated(path: str, tiles: TileSettings) -> Tiles:
    """``load_tiles`` in a forked child: a segfault or the OOM killer there becomes a reject."""
    if not hasattr(os, "fork"):
        return load_tiles(path, tiles)
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads: the child only decodes
        pid = os.fork()
    if pid == 0:  # the child: decode, send the outcome, leave without running any cleanup
        os.close(read_end)
        try:
            try:
                outcome: tuple[str, Any] = ("tiles", load_tiles(path, tiles))
            except Rejected as e:
                outcome = ("rejected", str(e))
            with os.fdopen(write_end, "wb") as f:
                pickle.dump(outcome, f, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise Rejected(f"crashed the decoder (signal {os.WTERMSIG(status)})")
    if os.WEXITSTATUS(status) != 0 or not data:
        raise Rejected(f"crashed the decoder (exit status {os.WEXITSTATUS(status)})")
    kind, value = pickle.loads(data)
    if kind == "rejected":
        raise Rejected(value)
    return value  # type: ignore[no-any-return]


def write_shard(out: Storage, work: str, shard: int, per_shard: int,
                pieces: list[tuple[int, int, int]], sizes: list[int], sync: bool) -> dict[str, Any]:
    """Worker task: copy chunk byte runs from part files into one shard; returns its size
    (``bytes``) and the ``seconds`` it took.

    ``pieces`` are (part, byte offset, byte count) runs, in sample order; ``sizes`` the chunk
    sizes that make up those runs. Locally each run is one in-kernel copy (copy_file_range) and
    ``sync`` fsyncs here, for workers on other machines; in a bucket the shard is one put.
    """
    start = time.perf_counter()
    index = fmt.ShardIndex.packed(per_shard, sizes)
    runs = [(f"{work}/{part_name(part, '.bin')}", offset, count) for part, offset, count in pieces]
    size = out.concat(fmt.shard_relpath(shard), runs, index.encode(), sync=sync)
    return {"bytes": size, "seconds": time.perf_counter() - start}


def fsync(path: Path) -> float:
    """fsync ``path``; the seconds it took."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start
