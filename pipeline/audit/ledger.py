"""An audit of exactly-once: which samples each rank handed over, per epoch, across restarts.

``Loader(..., ledger=DIR)`` writes, per epoch, one file per rank and run (a run is one Loader:
a restart is a new run): the sorted sample ids that rank handed over, delta-coded and
compressed (``tilefeed bench scale`` reports a rank's packed size and time at scale), with the
settings of that stretch of the epoch. A file is rewritten atomically whenever ``state_dict()``
is called (so a checkpoint and the ledger agree on what was trained on) and when the epoch ends.

``audit(DIR)`` adds the files up: per epoch, how many samples were delivered once, twice or
never, across all ranks and restarts, and whether the drop_last and padding rules explain every
sample delivered twice or never.

What an epoch covers is written once: a subset's ids (``population.npz``), or, for a whole
store, only its sample count (``population.json``), so no process holds an id per sample it
never handed over. The audit tallies deliveries in sorted arrays while they are few and in two
bitmaps once those are smaller: at most about two bits a sample beside one rank's file, and
never a table sized by a number a file states.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tilefeed.pipeline.planning.order import sorted_distinct
from tilefeed.store.atomic import atomic_write
from tilefeed.store.errors import LedgerError
from tilefeed.store.inspection import printable

POPULATION = "population.npz"  # the samples an epoch covers: a subset's ids, written once
COUNT = "population.json"  # or, for a whole store, {"samples": N}: the samples 0..N-1
MAX_SAMPLES = 1 << 62  # a count beyond this is no store's (sample ids are below 2**62)


def _pack(ids: np.ndarray) -> bytes:
    ids = np.sort(ids.astype(np.int64))
    deltas = np.diff(ids, prepend=0).astype(np.uint32 if ids.size and ids.max() < 2**32 else np.uint64)
    # the fastest level: a record is packed at every state_dict(), on the training loop's clock
    return zlib.compress(deltas.tobytes(), 1) + deltas.dtype.char.encode()


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

    def __init__(self, root: str | Path, *, rank: int, population: np.ndarray | None, samples: int,
                 sources: Mapping[str, Any] = MappingProxyType({})) -> None:
        """``sources``: what the Loader's sources say of the epoch's ``samples`` positions
        (``Sources.describe``): of a mixture, its sources and their blocks of positions, which the
        records then hold (one position, one entry of the planned multiset); of one store,
        nothing (its positions are its samples)."""
        self.root = Path(root)
        self.rank = rank
        self.run = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / POPULATION).exists() and not (self.root / COUNT).exists():
            if population is None:
                described = {"samples": int(samples), **sources}
                atomic_write(self.root / COUNT, json.dumps(described).encode())
            else:
                atomic_write(self.root / POPULATION, _pack(population))
        else:  # a folder kept from an earlier run: its records must count the same population
            held = _population(self.root)
            same = (held.size == (samples if population is None else len(population))
                    and held.blocks == _blocks(sources, samples, self.root)
                    and (held.ids is None) == (population is None)
                    and (population is None or np.array_equal(held.ids, population)))  # type: ignore[arg-type]
            if not same:
                raise LedgerError(f"{self.root}: holds the ledger of another store, subset or mixture; "
                                  "give this run a folder of its own")

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
    sources: dict[str, dict[str, int]] | None = None  # a mixture's: per source, as above (null of one store)


@dataclass(frozen=True)
class _Population:
    """The samples an epoch covers: a subset's sorted ``ids``, or (``ids`` None) 0..size-1."""

    size: int
    ids: np.ndarray | None
    # a mixture's sources and their blocks of positions, as (name, start, quota); none of one store
    blocks: tuple[tuple[str, int, int], ...] = ()

    def places(self, ids: np.ndarray, path: Path) -> np.ndarray:
        """Where each of a record's ``ids`` stands in the population; LedgerError for an id
        outside it. Found by search: no table sized by the largest id."""
        if self.ids is None:
            outside, places = ids >= self.size, ids
        else:
            places = np.searchsorted(self.ids, ids)
            outside = places >= self.size
            outside[~outside] = self.ids[places[~outside]] != ids[~outside]
        if outside.any():
            raise LedgerError(f"{path}: delivered sample {int(ids[outside][0])}, which is not in the "
                              "population the ledger records")
        return places

    def samples(self, places: np.ndarray) -> list[int]:
        return (places if self.ids is None else self.ids[places]).tolist()


def _population(root: Path) -> _Population:
    """What the ledger in ``root`` says an epoch covers; LedgerError when it says nothing sound."""
    ids_file, count_file = root / POPULATION, root / COUNT
    if ids_file.is_file() and count_file.is_file():
        raise LedgerError(f"{root}: holds both {POPULATION} and {COUNT} (two ledgers in one folder?)")
    if ids_file.is_file():
        ids = _unpack(ids_file.read_bytes(), str(ids_file))
        if ids.size > 1 and (np.diff(ids) == 0).any():
            raise LedgerError(f"{ids_file}: lists a sample twice (damaged)")
        return _Population(len(ids), ids)
    if not count_file.is_file():
        raise LedgerError(f"{root}: holds no ledger (no {POPULATION} or {COUNT})")
    with open(count_file, "rb") as f:
        data = f.read(MAX_HEAD + 1)
    try:
        meta = json.loads(data) if len(data) <= MAX_HEAD else None
    except (ValueError, RecursionError):
        meta = None
    meta = meta if isinstance(meta, dict) else {}
    samples = meta.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples <= MAX_SAMPLES:
        raise LedgerError(f"{count_file}: damaged (not a sample count)")
    return _Population(samples, None, _blocks(meta, samples, count_file))


def _blocks(described: Mapping[str, Any], samples: int, path: Path) -> tuple[tuple[str, int, int], ...]:
    """The sources and their blocks of positions a count file (or a Loader's ``Sources.describe``)
    names under ``mixture``, checked: blocks that tile 0..samples-1; none for one store's, whose
    positions are its samples."""
    mixture = described.get("mixture")
    if mixture is None:
        return ()
    try:
        names, starts, quotas = mixture["names"], mixture["starts"], mixture["quotas"]
        ok = (all(isinstance(v, list) for v in (names, starts, quotas))
              and len(names) == len(starts) == len(quotas) == len(set(names))
              and all(isinstance(n, str) and n for n in names)
              and all(type(v) is int and 0 <= v <= samples for v in (*starts, *quotas))
              and [*starts, samples] == [0, *itertools.accumulate(quotas)])  # Python ints: no wrap
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise LedgerError(f"{path}: damaged (the mixture's sources do not tile its {samples} positions)")
    return tuple(zip(names, starts, quotas, strict=True))


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_SCAN = 1 << 20  # bitmap bytes looked at a time


def _set(bits: np.ndarray, places: np.ndarray) -> None:
    np.bitwise_or.at(bits, places >> 3, np.left_shift(1, places & 7).astype(np.uint8))


def _test(bits: np.ndarray, places: np.ndarray) -> np.ndarray:
    return ((bits[places >> 3] >> (places & 7)) & 1).astype(bool)


def _bitmap(places: np.ndarray, size: int) -> np.ndarray:
    bits = np.zeros(-(-size // 8), dtype=np.uint8)
    _set(bits, places)
    return bits


def _popcount(bits: np.ndarray) -> int:
    return sum(int(_POPCOUNT[bits[i : i + _SCAN]].sum(dtype=np.int64)) for i in range(0, len(bits), _SCAN))


def _first_bits(bits: np.ndarray, value: bool, size: int, count: int) -> np.ndarray:
    """The first ``count`` places below ``size`` whose bit is ``value``, scanning a chunk at a time."""
    found: list[np.ndarray] = []
    for start in range(0, len(bits), _SCAN):
        chunk = bits[start : start + _SCAN]
        chunk = chunk if value else ~chunk
        nonzero = np.flatnonzero(chunk)[:count]  # at least one wanted bit in each such byte
        flags = np.unpackbits(chunk[nonzero], bitorder="little").reshape(-1, 8).astype(bool)
        places = ((start + nonzero)[:, None] * 8 + np.arange(8))[flags]
        found.append(places[places < size])
        if sum(map(len, found)) >= count:
            break
    return np.concatenate([np.zeros(0, dtype=np.int64), *found])[:count].astype(np.int64)


def _member(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    at = np.searchsorted(sorted_values, values)
    hit = at < len(sorted_values)
    hit[hit] = sorted_values[at[hit]] == values[hit]
    return hit


class _Tally:
    """How many times each place of a population of ``size`` was delivered, counted to two.

    Sorted arrays of the places delivered once or more and twice or more while they are few;
    two bitmaps once those are smaller (8 bytes a place against 2 bits): memory stays near two
    bits a sample at most, and a population count a file states sizes nothing until records
    deliver a thirty-second of it.
    """

    EXAMPLES = 5

    def __init__(self, size: int) -> None:
        self.size = size
        self.deliveries = 0  # repeats included
        self.seen = np.zeros(0, dtype=np.int64)
        self.again = np.zeros(0, dtype=np.int64)
        self.bits: tuple[np.ndarray, np.ndarray] | None = None  # seen, again

    def add(self, places: np.ndarray) -> None:
        """One record's places, ascending (as ``_unpack`` gives them), repeats allowed."""
        self.deliveries += len(places)
        if not places.size:
            return
        first = np.concatenate([[True], places[1:] != places[:-1]])
        unique = places[first]
        repeated = unique[np.diff(np.append(np.flatnonzero(first), len(places))) > 1]
        if self.bits is None:
            before = unique[_member(self.seen, unique)]
            # sorted runs of distinct places merged into one
            self.again = sorted_distinct(np.concatenate([self.again, repeated, before]))
            self.seen = sorted_distinct(np.concatenate([self.seen, unique]))
            if len(self.seen) * 32 > self.size:  # the two bitmaps are smaller now
                self.bits = (_bitmap(self.seen, self.size), _bitmap(self.again, self.size))
                self.seen = self.again = np.zeros(0, dtype=np.int64)
        else:
            seen, again = self.bits
            _set(again, repeated)
            _set(again, unique[_test(seen, unique)])
            _set(seen, unique)

    def distinct(self) -> int:
        return len(self.seen) if self.bits is None else _popcount(self.bits[0])

    def within(self, low: int, high: int) -> tuple[int, int]:
        """Places in [low, high) delivered once or more, and twice or more."""
        if self.bits is None:
            return tuple(int(np.searchsorted(a, high) - np.searchsorted(a, low))  # type: ignore[return-value]
                         for a in (self.seen, self.again))
        counts = []
        for bits in self.bits:
            if high - low <= 16:
                flags = np.unpackbits(bits[low >> 3 : -(-high >> 3)], bitorder="little")
                counts.append(int(flags[(low & 7) : (low & 7) + high - low].sum()))
                continue
            # whole bytes counted a chunk at a time (two bits a place at most held), the two
            # part bytes at the ends by their bits
            first, last = -(-low >> 3), high >> 3
            head = np.unpackbits(bits[low >> 3 : first], bitorder="little")[low & 7 :].sum()
            tail = np.unpackbits(bits[last : last + 1], bitorder="little")[: high & 7].sum()
            counts.append(_popcount(bits[first:last]) + int(head) + int(tail))
        return counts[0], counts[1]

    def twice(self) -> int:
        return len(self.again) if self.bits is None else _popcount(self.bits[1])

    def examples_twice(self) -> np.ndarray:
        if self.bits is None:
            return self.again[: self.EXAMPLES]
        return _first_bits(self.bits[1], True, self.size, self.EXAMPLES)

    def examples_never(self) -> np.ndarray:
        if self.bits is None:
            # the k-th missing place (from 0) is k plus the places seen below it: those with at
            # most k places missing before them (seen[i] - i of them)
            k = np.arange(self.EXAMPLES, dtype=np.int64)
            missing = k + np.searchsorted(self.seen - np.arange(len(self.seen)), k, side="right")
            return missing[missing < self.size]
        return _first_bits(self.bits[0], False, self.size, self.EXAMPLES)


def audit(root: str | Path) -> list[EpochAudit]:
    """Per epoch: delivered once / twice / never, and whether the rules explain the rest."""
    root = Path(root)
    population = _population(root)
    out = []
    for folder in sorted(root.glob("epoch-*")):
        epoch = folder.name.split("-", 1)[1]
        if not folder.is_dir() or not epoch.isdigit():
            continue  # not one of the ledger's folders
        tally = _Tally(population.size)
        runs: set[str] = set()
        finished: dict[tuple[int, int, bool], set[int]] = {}  # settings -> ranks that ended the epoch
        for path in sorted(folder.glob("*.ledger")):
            meta, ids = read_record(path)
            tally.add(population.places(ids, path))
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
        distinct, twice = tally.distinct(), tally.twice()
        never = population.size - distinct
        extra = tally.deliveries - distinct  # each repeat beyond the first delivery
        ok = extra <= allowed_twice and (not complete or never <= allowed_never)
        out.append(EpochAudit(
            epoch=int(epoch), population=population.size, once=distinct - twice, twice=twice, never=never,
            complete=complete, allowed_twice=allowed_twice, allowed_never=allowed_never, runs=len(runs),
            ok=ok, examples_twice=population.samples(tally.examples_twice()),
            examples_never=population.samples(tally.examples_never()),
            sources=_per_source(tally, population.blocks) or None,
        ))
    return out


def _per_source(tally: _Tally, blocks: tuple[tuple[str, int, int], ...]) -> dict[str, dict[str, int]]:
    out = {}
    for name, start, quota in blocks:
        seen, again = tally.within(start, start + quota)
        out[name] = {"planned": quota, "once": seen - again, "twice": again, "never": quota - seen}
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
        for name, c in (r.sources or {}).items():  # a mixture: its positions, per source
            lines.append(row.format("", c["planned"], c["once"], c["twice"], c["never"], "",
                                    f"  {printable(name)}"))
    return "\n".join(lines)
