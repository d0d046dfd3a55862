"""The store finished once every shard is in place, synced and digested: the small arrays and
the array metadata, then the group's tilefeed attributes last, whose write marks the store
complete; the work folder goes after.

The metadata of a store in a bucket is written in a scratch folder, then put object by object,
the group's last.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tilefeed.preprocess import tasks
from tilefeed.preprocess.metadata import write_reject_arrays, PartTiles, write_arrays, write_attrs
from tilefeed.store import format as fmt
from tilefeed.store.errors import SourceError

if TYPE_CHECKING:
    from tilefeed.preprocess.task_scheduler import Scheduler


SHOWN = 5  # rejected inputs named in the error of a run that stored none


@dataclass(frozen=True)
class Published:
    """What the store holds: its inputs, the rejected ones as (path, reason) in the order the
    store lists them, its tiles, and its shards and their bytes."""

    inputs: int
    rejects: list[tuple[str, str]]
    samples: int
    shards: int
    bytes: int
    objects: int = 0  # a store with targets: objects stored
    outside: int = 0  # and objects not stored, no part of their box in any tile (crop fit, grid gaps)


def publish(build: Scheduler, fingerprint: str) -> Published:
    """Write the store's metadata after the shards ``build`` wrote, the attributes last, and
    remove the work folder; SourceError when no source made a tile."""
    out, listing, samples = build.out, build.listing, build.samples
    rejects: list[tuple[str, str]] = []
    parts = _read_parts(build, rejects)
    inputs = len(listing) + len(listing.skipped)
    if samples == 0:
        for _ in parts:  # only their rejects, for the message
            pass
        rejected = rejects + listing.skipped
        reasons = reason_counts(r for _, r in rejected)
        named = "; ".join(f"{path}: {reason}" for path, reason in rejected[:SHOWN])
        more = f"; and {len(rejected) - SHOWN} more" if len(rejected) > SHOWN else ""
        # nothing to resume: the work folder goes, so no later command offers to finish this run
        # (a folder or bucket that refuses the removal must not hide why nothing was stored)
        try:
            out.remove(build.work)
        except OSError:
            pass
        raise SourceError(
            f"no usable image among {inputs} inputs "
            f"({', '.join(f'{n} {k}' for k, n in reasons.items())}): {named}{more}"
        )
    shards = fmt.shard_count(samples, build.per_shard)
    shard_bytes = build.shard_sizes(shards)
    # every shard on disk and digested before any metadata declares it
    shard_sha256 = build.shard_digests(shards)
    objects, outside, mask_shards = _targets(build) if listing.targets is not None else (0, 0, None)

    def write(root: Path) -> None:
        names = write_arrays(root, listing, build.tiles, build.store, samples, parts, objects)
        rejects.extend(listing.skipped)  # after the parts': the order the store lists them
        names += write_reject_arrays(root, rejects)
        write_attrs(root, listing, build.tiles, build.store, fingerprint, samples, rejects,
                    inputs - len(rejects), names, shard_bytes, shard_sha256, objects, mask_shards)

    if out.local is not None:
        for stray in (out.local / fmt.IMAGES).rglob(".*.tmp-*"):
            stray.unlink()  # a shard a killed worker was writing; written again since
        write(out.local)
    else:  # written in a scratch folder, then put object by object, the group's last
        with tempfile.TemporaryDirectory(prefix="tilefeed-metadata-") as scratch:
            write(Path(scratch))
            shutil.rmtree(Path(scratch) / fmt.WORK_DIR, ignore_errors=True)
            out.upload_tree(Path(scratch), last="zarr.json")
    out.remove(build.work)
    return Published(inputs, rejects, samples, shards, sum(shard_bytes), objects, outside)


def _targets(build: Scheduler) -> tuple[int, int, tuple[list[int], list[str]] | None]:
    """The objects the parts stored and left outside their tiles, and, with masks, the masks'
    shards written from the parts' mask chunks (each shard's size and sha256): one pass over
    the parts' records, a shard's runs held at a time."""
    assert build.listing.targets is not None
    masks = build.listing.targets.job.masks is not None
    per_shard = build.per_shard
    objects = outside = 0
    written: tuple[list[int], list[str]] = ([], [])
    pieces: list[tuple[int, int, int]] = []
    sizes: list[np.ndarray] = []
    held = 0

    def flush() -> None:
        spec = tasks.ShardSpec(len(written[0]), per_shard, pieces.copy(), np.concatenate(sizes), True,
                               fmt.MASKS)
        done = tasks.write_shard(build.out, build.work, spec)
        written[0].append(done.size)
        written[1].append(done.sha256)
        pieces.clear()
        sizes.clear()

    for part in range(build.parts):
        record, _ = tasks.read_part(build.out, build.work, part)
        objects += record.objects
        outside += record.outside
        if not masks:
            continue
        chunk = tasks.read_targets_table(build.out, build.work, part, record.tiles)["mask"]
        at = offset = 0
        while at < len(chunk):
            run = chunk[at : at + per_shard - held]
            pieces.append((part, offset, int(run.sum())))
            sizes.append(run)
            offset += int(run.sum())
            at += len(run)
            held += len(run)
            if held == per_shard:
                flush()
                held = 0
    if held:
        flush()
    return objects, outside, written if masks else None


def reason_counts(reasons: Iterable[str]) -> dict[str, int]:
    """How many rejects of each kind (a reason's words before its colon), the most first."""
    return dict(Counter(reason.split(":", 1)[0] for reason in reasons).most_common())


def _read_parts(build: Scheduler, rejects: list[tuple[str, str]]) -> Iterator[PartTiles]:
    """Every part's tile table in order, read from its record; its rejects go to ``rejects``
    and its seconds to the phases as it is read."""
    for part in range(build.parts):
        record, table = tasks.read_part(build.out, build.work, part)
        rejects.extend((path, reason) for _, path, reason in record.rejects)
        for phase, seconds in record.seconds.items():
            build.phases[phase] += seconds
        if build.listing.targets is None:
            yield PartTiles(part * build.part_size, record.count, table)
            continue
        targets = tasks.read_targets_table(build.out, build.work, part, record.tiles)
        objects = tasks.read_objects(build.out, build.work, part, record.objects)
        yield PartTiles(part * build.part_size, record.count, table, targets, objects)
