"""An audit of exactly-once: which samples each rank handed over, per epoch, across restarts.

``Loader(..., ledger=DIR)`` writes, per epoch, one file per rank and run (a run is one Loader:
a restart is a new run): the sorted sample ids that rank handed over, delta-coded and
compressed (an ImageNet-sized epoch of 1.28 M samples over 8 ranks measured 1.04 MiB), with the
settings of that stretch of the epoch. A file is rewritten atomically whenever ``state_dict()``
is called (so a checkpoint and the ledger agree on what was trained on) and when the epoch ends.

``audit(DIR)`` adds the files up: per epoch, how many samples were delivered once, twice or
never, across all ranks and restarts, and whether the drop_last and padding rules explain every
sample delivered twice or never.
"""

from __future__ import annotations

import json
import os
import time
import uuid
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefeed.preprocess.atomic import atomic_write
from tilefeed.preprocess.errors import LedgerError

POPULATION = "population.npz"  # the samples an epoch covers (a subset's ids), written once


def _pack(ids: np.ndarray) -> bytes:
    ids = np.sort(ids.astype(np.int64))
    deltas = np.diff(ids, prepend=0).astype(np.uint32 if ids.size and ids.max() < 2**32 else np.uint64)
    return zlib.compress(deltas.tobytes(), 6) + deltas.dtype.char.encode()


MAX_IDS = 1 << 26  # sample ids one file may hold (768 MiB to unpack them); ImageNet-21k is 14 M
MAX_HEAD = 1 << 16  # bytes of a record's JSON header
_DELTAS: dict[str, np.dtype[Any]] = {np.dtype(t).char: np.dtype(t) for t in (np.uint32, np.uint64)}


def _unpack(data: bytes, name: str = "ledger") -> np.ndarray:
    """The sorted ids of ``_pack``; LedgerError (naming ``name``) for anything ``_pack`` cannot
    have written. Nothing is sized by the file's word: the inflated size is capped as it
    inflates, and the ids must ascend from 0 without wrapping."""
    dtype = _DELTAS.get(data[-1:].decode("latin-1"))
    if dtype is None:
        raise LedgerError(f"{name}: not a tilefeed ledger (unknown id width {data[-1:]!r})")
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data[:-1], MAX_IDS * dtype.itemsize)
    except zlib.error as e:
        raise LedgerError(f"{name}: damaged ({e})") from None
    if inflate.unconsumed_tail:
        raise LedgerError(f"{name}: holds more than {MAX_IDS} sample ids")
    if not inflate.eof or len(raw) % dtype.itemsize:
        raise LedgerError(f"{name}: damaged (cut short)")
    deltas = np.frombuffer(raw, dtype=dtype)
    # under 2**62 in all, so the running sum cannot wrap (uint32 deltas never could)
    if dtype.itemsize == 8 and deltas.size and (deltas >= 2**62 // deltas.size).any():
        raise LedgerError(f"{name}: sample ids overflow (damaged)")
    return np.cumsum(deltas, dtype=np.uint64).view(np.int64)


class Ledger:
    """The writer side: one per Loader; ``record`` rewrites this rank's file for an epoch."""

    def __init__(self, root: str | Path, *, rank: int, population: np.ndarray | None, samples: int) -> None:
        self.root = Path(root)
        self.rank = rank
        self.run = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(parents=True, exist_ok=True)
        ids = np.arange(samples, dtype=np.int64) if population is None else population
        pop = self.root / POPULATION
        if not pop.exists():
            atomic_write(pop, _pack(ids))

    def record(self, epoch: int, ids: np.ndarray, *, world_size: int, batch_size: int,
               drop_last: bool, complete: bool) -> None:
        folder = self.root / f"epoch-{epoch:06d}"
        folder.mkdir(exist_ok=True)
        meta = {"epoch": epoch, "rank": self.rank, "run": self.run, "world_size": world_size,
                "batch_size": batch_size, "drop_last": drop_last, "complete": complete,
                "delivered": int(len(ids))}
        head = json.dumps(meta).encode()
        atomic_write(folder / f"{self.run}-rank{self.rank:05d}.ledger",
                      len(head).to_bytes(4, "little") + head + _pack(ids))


_RECORD: dict[str, type] = {"epoch": int, "rank": int, "run": str, "world_size": int, "batch_size": int,
                            "drop_last": bool, "complete": bool, "delivered": int}


def read_record(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    """(settings, sorted ids) of one rank's file; LedgerError naming it when damaged."""
    data = path.read_bytes()
    n = int.from_bytes(data[:4], "little")
    if len(data) < 5 or not 0 < n <= min(MAX_HEAD, len(data) - 5):
        raise LedgerError(f"{path}: damaged (no header)")
    try:
        meta = json.loads(data[4 : 4 + n])
    except (ValueError, RecursionError):
        raise LedgerError(f"{path}: damaged (header is not JSON)") from None
    if not isinstance(meta, dict):
        raise LedgerError(f"{path}: damaged (header is not an object)")
    for key, kind in _RECORD.items():
        value = meta.get(key)
        whole = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not isinstance(value, kind) or kind is int and not whole:
            raise LedgerError(f"{path}: header field {key!r} is missing or not a {kind.__name__}")
    if meta["world_size"] < 1 or meta["batch_size"] < 1 or meta["rank"] >= meta["world_size"]:
        raise LedgerError(f"{path}: header has rank {meta['rank']} of world size {meta['world_size']}, "
                          f"batch size {meta['batch_size']}")
    ids = _unpack(data[4 + n :], str(path))
    if len(ids) != meta["delivered"]:
        raise LedgerError(f"{path}: holds {len(ids)} ids, its header says {meta['delivered']}")
    return meta, ids


@dataclass
class EpochAudit:
    epoch: int
    population: int
    once: int
    twice: int  # delivered two or more times
    never: int
    complete: bool  # some stretch of the epoch ran to its end on every rank
    allowed_twice: int  # what padding (drop_last=False) explains
    allowed_never: int  # what drop_last explains
    runs: int
    ok: bool
    examples_twice: list[int]
    examples_never: list[int]


def audit(root: str | Path) -> list[EpochAudit]:
    """Per epoch: delivered once / twice / never, and whether the rules explain the rest."""
    root = Path(root)
    population = _unpack((root / POPULATION).read_bytes(), str(root / POPULATION))
    if population.size > 1 and (np.diff(population) == 0).any():
        raise LedgerError(f"{root / POPULATION}: lists a sample twice (damaged)")
    out = []
    for folder in sorted(root.glob("epoch-*")):
        epoch = folder.name.split("-", 1)[1]
        if not folder.is_dir() or not epoch.isdigit():
            continue  # not one of the ledger's folders
        counts = np.zeros(len(population), dtype=np.int64)
        runs: set[str] = set()
        finished: dict[tuple[int, int, bool], set[int]] = {}  # settings -> ranks that ended the epoch
        for path in sorted(folder.glob("*.ledger")):
            meta, ids = read_record(path)
            # positions in the sorted population, by search: no table sized by the largest id
            at = np.searchsorted(population, ids)
            known = at < len(population)
            known[known] = population[at[known]] == ids[known]
            if not known.all():
                raise LedgerError(f"{path}: delivered sample {int(ids[~known][0])}, which is not in "
                                  f"the population the ledger records")
            np.add.at(counts, at, 1)
            runs.add(meta["run"])  # each rank's process is a run of its own
            if meta["complete"]:
                key = (meta["world_size"], meta["batch_size"], meta["drop_last"])
                finished.setdefault(key, set()).add(meta["rank"])
        allowed_twice = allowed_never = 0
        complete = False
        for (world, batch, drop_last), ranks in finished.items():
            if len(ranks) == world:  # every rank of a job with these settings ended the epoch (rank < world)
                complete = True
                if drop_last:
                    allowed_never += world * batch - 1
                else:
                    allowed_twice += world - 1
        twice = np.flatnonzero(counts >= 2)
        never = np.flatnonzero(counts == 0)
        extra = int((counts[twice] - 1).sum())  # each repeat beyond the first delivery
        ok = extra <= allowed_twice and (not complete or len(never) <= allowed_never)
        out.append(EpochAudit(
            epoch=int(epoch), population=len(population),
            once=int((counts == 1).sum()), twice=len(twice), never=len(never), complete=complete,
            allowed_twice=allowed_twice, allowed_never=allowed_never, runs=len(runs), ok=ok,
            examples_twice=population[twice[:5]].tolist(), examples_never=population[never[:5]].tolist(),
        ))
    return out


def format_audit(results: list[EpochAudit]) -> str:
    row = "{:>5}  {:>9}  {:>9}  {:>7}  {:>7}  {:>4}  {}"
    lines = [row.format("epoch", "samples", "once", "twice+", "never", "runs", "verdict")]
    for r in results:
        if r.ok:
            verdict = "ok" if r.complete else "ok so far (epoch not finished)"
        else:
            verdict = (f"FAIL: {r.twice} delivered more than once (padding explains {r.allowed_twice}, "
                       f"e.g. {r.examples_twice}), {r.never} never")
            if r.complete:
                verdict += f" (drop_last explains {r.allowed_never}, e.g. {r.examples_never})"
        lines.append(row.format(r.epoch, r.population, r.once, r.twice, r.never, r.runs, verdict))
    return "\n".join(lines)


def audit_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="tilefeed audit",
        description="Report, per epoch, the samples delivered once, twice or never across all ranks "
        "and restarts, from the ledger a Loader(ledger=DIR) wrote. Exits 1 when a sample was "
        "delivered twice or never beyond what drop_last and padding explain.")
    parser.add_argument("ledger", metavar="DIR")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if not (Path(args.ledger) / POPULATION).is_file():
        print(f"tilefeed: error: {args.ledger!r} holds no ledger (no {POPULATION})")
        return 1
    results = audit(args.ledger)
    print(json.dumps([asdict(r) for r in results], indent=2) if args.json else format_audit(results))
    return 0 if all(r.ok for r in results) else 1
