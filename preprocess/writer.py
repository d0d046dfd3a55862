"""Sources -> a sharded Zarr v3 store, in parallel, resumable after a crash at any moment.

Work is cut into *parts* of PART_SOURCES consecutive sources, independent of the worker count.
A worker process decodes its part's images and writes their encoded chunks to the work folder
(``OUT/.tilefeed-partial``), bytes first and a small JSON last, each under a temporary name then
renamed. Once every part is there, the driver copies the chunk bytes into shard files (again
temporary name, then rename), writes the small arrays and the array metadata, and writes the
group's tilefeed attributes last: that is what marks the store complete. A rerun of the same
command skips the parts already written, so a killed run resumes and ends in the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from preprocess import format as fmt
from preprocess.decode import Rejected, load_tiles
from preprocess.errors import SourceError, StoreExistsError, StoreWriteError
from preprocess.settings import StoreSettings, TileSettings, default_workers, describe
from preprocess.sources import Sources, find_sources

PART_SOURCES = 64
PLAN_FILE = "plan.json"


@dataclass
class Summary:
    sources: int
    accepted: int
    rejected: int
    tiles: int
    shards: int
    bytes: int
    seconds: float
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    resumed_parts: int = 0
    up_to_date: bool = False


ProgressFn = Callable[[int, int], None]  # (sources done in this step, rejects in this step)


def preprocess(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    tiles: TileSettings | None = None,
    store: StoreSettings | None = None,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int], ProgressFn] | None = None,
) -> Summary:
    """Convert the images under ``src`` into a tilefeed store at ``out``; see the module docstring.

    ``progress``, when given, is called once with the number of sources and returns a callback
    invoked as parts complete.
    """
    tiles = tiles or TileSettings()
    store = store or StoreSettings()
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    started = time.perf_counter()
    sources = find_sources(src)
    root = Path(out)
    plan = _plan(sources, tiles, store)
    if _prepare_output(root, plan, overwrite):
        attrs = fmt.read_attrs(root)
        return _summary_from_attrs(attrs, root, time.perf_counter() - started)
    work = root / fmt.WORK_DIR
    n_parts = -(-len(sources) // PART_SOURCES)
    done = {p for p in range(n_parts) if (work / _part_name(p, ".json")).exists()}
    tick = progress(len(sources)) if progress else None
    if tick:
        for p in sorted(done):
            tick(*_part_counts(work, p))
    _run_parts(sources, tiles, store, work, [p for p in range(n_parts) if p not in done], workers, tick)
    summary = _assemble(root, sources, tiles, store, plan["fingerprint"], n_parts)
    summary.resumed_parts = len(done)
    summary.seconds = time.perf_counter() - started
    return summary


def _plan(sources: Sources, tiles: TileSettings, store: StoreSettings) -> dict[str, Any]:
    h = hashlib.sha256()
    h.update(json.dumps([fmt.FORMAT_VERSION, asdict(tiles), asdict(store), sources.classes]).encode())
    for path, label in zip(sources.paths, sources.labels):
        try:
            size = os.stat(path).st_size
        except OSError:
            size = -1
        h.update(f"{path}\0{label}\0{size}\n".encode())
    return {"fingerprint": h.hexdigest(), "sources": len(sources), "settings": describe(tiles, store)}


def _prepare_output(root: Path, plan: dict[str, Any], overwrite: bool) -> bool:
    """Make ``root`` ready for this plan; True when it already holds this very store, complete."""
    if root.exists() and not root.is_dir():
        raise StoreExistsError(f"OUT {str(root)!r} is a file; give a folder path")
    work = root / fmt.WORK_DIR
    if root.is_dir() and any(root.iterdir()):
        attrs = fmt.read_attrs(root)
        try:
            pending = json.loads((work / PLAN_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            pending = None
        if attrs is None and pending is None:
            raise StoreExistsError(
                f"OUT {str(root)!r} is not empty and holds no tilefeed store; choose a new or "
                "empty folder (--overwrite only replaces tilefeed stores)"
            )
        ours = (attrs or pending or {}).get("fingerprint") == plan["fingerprint"]
        if ours and attrs is not None:
            shutil.rmtree(work, ignore_errors=True)  # a crash after the last write left it
            return True
        if not ours:
            if not overwrite:
                raise StoreExistsError(
                    f"OUT {str(root)!r} holds a {'complete' if attrs else 'partial'} tilefeed store "
                    "made from other sources or settings; pass --overwrite to replace it"
                )
            _remove_store(root)
    try:
        work.mkdir(parents=True, exist_ok=True)
        _atomic_write(work / PLAN_FILE, json.dumps(plan).encode())
    except OSError as e:
        raise StoreWriteError(f"cannot write to OUT {str(root)!r}: {e.strerror or e}") from None
    return False


def _remove_store(root: Path) -> None:
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _part_name(part: int, suffix: str) -> str:
    return f"part-{part:07d}{suffix}"


def _part_counts(work: Path, part: int) -> tuple[int, int]:
    meta = json.loads((work / _part_name(part, ".json")).read_text())
    return meta["count"], len(meta["rejects"])


def write_part(
    work: str, part: int, first: int, paths: list[str], tiles: TileSettings, store: StoreSettings
) -> tuple[int, int]:
    """Worker task: decode one part's sources, write its chunk bytes and its JSON record."""
    codec = fmt.TileCodec(store.codec, tiles.size, store.quality)
    sizes: list[int] = []
    owners: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    rejects: list[list[Any]] = []
    chunks: list[bytes] = []
    for k, path in enumerate(paths):
        try:
            result = load_tiles(path, tiles)
        except Rejected as e:
            rejects.append([first + k, str(e)])
            continue
        for pixels in result.pixels:
            chunks.append(codec.encode(pixels))
            sizes.append(len(chunks[-1]))
        owners += [first + k] * len(result.pixels)
        rows += result.rows.tolist()
        cols += result.cols.tolist()
    root = Path(work)
    _atomic_write(root / _part_name(part, ".bin"), b"".join(chunks))
    record = {"count": len(paths), "sizes": sizes, "sources": owners, "rows": rows, "cols": cols,
              "rejects": rejects}
    _atomic_write(root / _part_name(part, ".json"), json.dumps(record).encode())
    return len(paths), len(rejects)


def _run_parts(
    sources: Sources,
    tiles: TileSettings,
    store: StoreSettings,
    work: Path,
    todo: list[int],
    workers: int,
    tick: ProgressFn | None,
) -> None:
    def args(part: int) -> tuple[Any, ...]:
        first = part * PART_SOURCES
        return (str(work), part, first, sources.paths[first : first + PART_SOURCES], tiles, store)

    try:
        if workers == 1 or len(todo) <= 1:
            for part in todo:
                counts = write_part(*args(part))
                if tick:
                    tick(*counts)
            return
        ctx = multiprocessing.get_context("spawn")  # no inherited threads or locks from the driver
        with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx) as pool:
            # A bounded window of tasks keeps the driver's memory flat on huge source lists.
            pending: set[Future[tuple[int, int]]] = set()
            queue = iter(todo)
            for part in queue:
                pending.add(pool.submit(write_part, *args(part)))
                if len(pending) >= 4 * workers:
                    break
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    counts = fut.result()
                    if tick:
                        tick(*counts)
                    nxt = next(queue, None)
                    if nxt is not None:
                        pending.add(pool.submit(write_part, *args(nxt)))
    except BrokenProcessPool:
        raise StoreWriteError(
            "a worker process died (out of memory or killed); rerun the same command to resume"
        ) from None
    except OSError as e:
        raise StoreWriteError(
            f"writing parts under {str(work)!r} failed: {e.strerror or e}; free space or fix "
            "permissions, then rerun the same command to resume"
        ) from None


def _iter_part_records(work: Path, n_parts: int) -> Iterator[dict[str, Any]]:
    for part in range(n_parts):
        yield json.loads((work / _part_name(part, ".json")).read_text())


def _assemble(
    root: Path, sources: Sources, tiles: TileSettings, store: StoreSettings, fingerprint: str,
    n_parts: int,
) -> Summary:
    work = root / fmt.WORK_DIR
    records = list(_iter_part_records(work, n_parts))
    owners = np.array([s for r in records for s in r["sources"]], dtype=np.int64)
    rejects = [(sources.paths[i], reason) for r in records for i, reason in r["rejects"]]
    rejects += sources.skipped
    samples = len(owners)
    if samples == 0:
        reasons = Counter(_reason_kind(r) for _, r in rejects)
        raise SourceError(
            f"no usable image among {len(sources) + len(sources.skipped)} inputs "
            f"({', '.join(f'{n} {k}' for k, n in reasons.most_common())})"
        )
    try:
        _create_images_array(root, tiles.size, samples, store)  # clears any earlier shards
        nbytes = _write_shards(root, work, records, store.shard_size)
        _write_metadata(root, sources, tiles, store, fingerprint, records, owners, rejects)
    except OSError as e:
        raise StoreWriteError(
            f"writing the store {str(root)!r} failed: {e.strerror or e}; free space or fix "
            "permissions, then rerun the same command to resume"
        ) from None
    shutil.rmtree(work, ignore_errors=True)
    reasons = Counter(_reason_kind(r) for _, r in rejects)
    return Summary(
        sources=len(sources) + len(sources.skipped),
        accepted=len(sources) - sum(len(r["rejects"]) for r in records),
        rejected=len(rejects),
        tiles=samples,
        shards=fmt.shard_count(samples, store.shard_size),
        bytes=nbytes,
        seconds=0.0,
        rejects_by_reason=dict(reasons.most_common()),
    )


def _reason_kind(reason: str) -> str:
    return reason.split(":", 1)[0]


def _write_shards(root: Path, work: Path, records: list[dict[str, Any]], per_shard: int) -> int:
    """Copy every part's chunk bytes, in sample order, into shard files; returns bytes written."""
    total = 0
    shard = 0
    index = np.full((per_shard, 2), fmt.EMPTY_CHUNK, dtype=np.uint64)
    filled = 0
    offset = 0
    out = None
    tmp = final = Path()

    def finish() -> None:
        nonlocal out, total
        assert out is not None
        out.write(fmt.encode_index(index))
        out.flush()
        os.fsync(out.fileno())
        total += out.tell()
        out.close()
        out = None
        os.replace(tmp, final)

    for part, record in enumerate(records):
        data = (work / _part_name(part, ".bin")).read_bytes()
        pos = 0
        for size in record["sizes"]:
            if out is None:
                final = fmt.shard_path(root, shard)
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
                out = open(tmp, "wb")
                index[:] = fmt.EMPTY_CHUNK
                filled = offset = 0
            out.write(memoryview(data)[pos : pos + size])
            index[filled] = (offset, size)
            filled += 1
            offset += size
            pos += size
            if filled == per_shard:
                finish()
                shard += 1
    if out is not None:
        finish()
    return total


def _create_images_array(root: Path, tile: int, samples: int, store: StoreSettings) -> None:
    import zarr

    zarr.create_array(
        str(root), name=fmt.IMAGES, shape=(samples, tile, tile, 3), dtype="uint8",
        chunks=(1, tile, tile, 3), shards=(store.shard_size, tile, tile, 3), fill_value=0,
        overwrite=True, dimension_names=["sample", "y", "x", "channel"], zarr_format=3,
        **fmt.zarr_codecs(store.codec, store.quality),
    )


def _write_metadata(
    root: Path, sources: Sources, tiles: TileSettings, store: StoreSettings, fingerprint: str,
    records: list[dict[str, Any]], owners: np.ndarray, rejects: list[tuple[str, str]],
) -> None:
    import zarr

    samples = len(owners)
    t = tiles.size
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    labels = np.asarray(sources.labels, dtype=np.int64)[owners]
    columns: dict[str, np.ndarray] = {fmt.LABELS: labels, fmt.SOURCES: owners}
    if tiles.mode == "grid":
        columns[fmt.ROWS] = np.array([v for r in records for v in r["rows"]], dtype=np.int32)
        columns[fmt.COLS] = np.array([v for r in records for v in r["cols"]], dtype=np.int32)
    for name, values in columns.items():
        group.create_array(name, data=values, chunks=(min(samples, 1 << 20),), overwrite=True)
    paths = np.array(sources.paths, dtype=np.dtypes.StringDType())
    group.create_array(fmt.SOURCE_PATHS, data=paths, chunks=(min(len(paths), 1 << 16),),
                       overwrite=True)
    attrs = {
        "format": fmt.FORMAT_NAME,
        "version": fmt.FORMAT_VERSION,
        "samples": samples,
        "sources": len(sources) + len(sources.skipped),
        "accepted": len(sources) - sum(len(r["rejects"]) for r in records),
        "rejected": len(rejects),
        "tile": [t, t, 3],
        "codec": store.codec,
        "quality": store.quality if store.codec == "jpeg" else None,
        "shard_size": store.shard_size,
        "shards": fmt.shard_count(samples, store.shard_size),
        "classes": sources.classes,
        "made": describe(tiles, store),
        "rejects": [{"path": p, "reason": r} for p, r in rejects],
        "fingerprint": fingerprint,
    }
    group.update_attributes({fmt.ATTRS_KEY: attrs})  # last: this write marks the store complete


def _summary_from_attrs(attrs: dict[str, Any] | None, root: Path, seconds: float) -> Summary:
    assert attrs is not None
    nbytes = sum(
        fmt.shard_path(root, s).stat().st_size for s in range(attrs["shards"])
    )
    reasons = Counter(_reason_kind(r["reason"]) for r in attrs["rejects"])
    return Summary(
        sources=attrs["sources"], accepted=attrs["accepted"], rejected=attrs["rejected"],
        tiles=attrs["samples"], shards=attrs["shards"], bytes=nbytes, seconds=seconds,
        rejects_by_reason=dict(reasons.most_common()), up_to_date=True,
    )


def progress_bar(enabled: bool) -> Callable[[int], ProgressFn]:
    """A tqdm bar over sources, with rate, ETA and the running reject count."""

    def start(total: int) -> ProgressFn:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="img", disable=not enabled, file=sys.stderr,
                   dynamic_ncols=True, smoothing=0.1)
        rejected = 0

        def tick(done: int, rejects: int) -> None:
            nonlocal rejected
            rejected += rejects
            if rejects:
                bar.set_postfix(rejected=rejected, refresh=False)
            bar.update(done)
            if bar.n >= total:
                bar.close()

        return tick

    return start
