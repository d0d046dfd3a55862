"""The mixture row of ``tilefeed bench loader``: a store split into two halves, each of its
samples in exactly one, preprocessed with the settings the store records, so that a Loader over
a 50/50 ``Mix`` of the halves reads the store's very samples; and the check that refuses a pair
of halves that does not add up to the store (a comparison of other samples is no comparison).

The halves are made from the store's own source paths: two JSON Lines manifests (each class's
sources alternately into one and the other, so both hold every class and the class lists agree,
as ``labels="same"`` needs) naming the same files, read as they were for the store."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tilefeed.pipeline.reader import StoreReader
from tilefeed.pipeline.show import source_paths
from tilefeed.store.atomic import atomic_write
from tilefeed.store.attrs import store_attrs
from tilefeed.store.errors import ConfigError

if TYPE_CHECKING:
    from tilefeed.preprocess import StoreSettings, TileSettings

HALVES: Final = ("half-a", "half-b")
Progress = Callable[[int], Callable[[int, int], None]]


def split_store(store: Path, folder: Path, *, workers: int | None = None,
                progress: Progress | None = None, log: bool = True) -> tuple[Path, Path]:
    """The two halves of ``store`` in ``folder`` (made there once: a later call finds them up to
    date and leaves them). A store that keeps no source paths cannot be split."""
    from tilefeed.preprocess import preprocess
    from tilefeed.preprocess.scanning import SourceOptions

    with StoreReader(store) as reader:
        paths = source_paths(reader, np.arange(len(reader)))
        if not all(paths):
            raise ConfigError(f"{reader.location} keeps no source paths: it cannot be split into halves")
        classes, made = list(reader.classes), store_attrs(reader.attrs, reader.root).made
        rows = _halves(paths, reader.labels, classes)
    # class names as labels give the store's list when it is sorted (a class-folder store's is);
    # otherwise integer labels, which give "0", "1", ... (the check refuses any other list)
    by_name = classes == sorted(classes) and all(c == c.strip() for c in classes)
    tiles, settings = _settings(made)
    folder.mkdir(parents=True, exist_ok=True)
    made_halves = []
    for name, half in zip(HALVES, rows, strict=True):
        manifest = folder / f"{name}.jsonl"
        text = "".join(json.dumps({"path": path, "label": classes[label] if by_name else label}) + "\n"
                       for path, label in half)
        if not manifest.is_file() or manifest.is_symlink() or manifest.read_text() != text:
            atomic_write(manifest, text.encode())  # replaces the name: never writes through a link
        out = folder / name
        summary = preprocess(manifest, out, tiles, settings, workers=workers, progress=progress,
                             source_options=SourceOptions(labels="names" if by_name else "int",
                                                          allow_outside=True))
        if log:
            done = "reused" if summary.up_to_date else f"made in {summary.seconds:.1f} s"
            print(f"half store: {out} ({done})", flush=True)
        made_halves.append(out)
    return made_halves[0], made_halves[1]


def _halves(paths: list[str], labels: np.ndarray, classes: list[str]) -> list[list[tuple[str, int]]]:
    """(source path, label) of each source, in store order, dealt to the halves alternately
    class by class; a source with several tiles (grid mode) goes whole to one half."""
    halves: list[list[tuple[str, int]]] = [[], []]
    seen: set[str] = set()
    dealt = [0] * len(classes)
    for path, label in zip(paths, labels.tolist(), strict=True):
        if path not in seen:
            seen.add(path)
            halves[dealt[label] % 2].append((path, label))
            dealt[label] += 1
    return halves


def _settings(made: dict[str, Any]) -> tuple[TileSettings, StoreSettings]:
    """The TileSettings and StoreSettings a store records in ``made``."""
    from dataclasses import fields

    from tilefeed.preprocess import StoreSettings, TileSettings

    tile_keys = {f.name for f in fields(TileSettings)}
    store_keys = {f.name for f in fields(StoreSettings)}
    tiles: dict[str, Any] = {k: tuple(v) if k == "background" else v
                             for k, v in made.items() if k in tile_keys}
    return TileSettings(**tiles), StoreSettings(**{k: v for k, v in made.items() if k in store_keys})


def check_halves(single: StoreReader, halves: tuple[Path, Path]) -> None:
    """Refuse (ConfigError) halves that do not hold exactly ``single``'s samples: made with the
    same settings, the same classes, together the same number of samples, the same multiset of
    source paths and of labels."""
    def samples(reader: StoreReader) -> Counter[tuple[str, int]]:
        every = np.arange(len(reader))  # (source path, label): a path under another label differs
        return Counter(zip(source_paths(reader, every), reader.labels[every].tolist(), strict=True))

    counted: Counter[tuple[str, int]] = Counter()
    for half in halves:
        with StoreReader(half) as reader:
            why = _differs(single, reader)
            if why:
                raise ConfigError(f"the halves {halves[0]} and {halves[1]} do not hold exactly "
                                 f"{single.location}'s samples: {half} {why}")
            counted.update(samples(reader))
    whole = samples(single)
    why = ""
    if sum(counted.values()) != len(single):
        why = f"together {sum(counted.values())} samples, the store {len(single)}"
    elif counted != whole:
        missing = sum((whole - counted).values())
        why = f"{missing} of the store's source paths are not in them under the store's labels"
    if why:
        raise ConfigError(f"the halves {halves[0]} and {halves[1]} do not hold exactly "
                         f"{single.location}'s samples: {why}")


def _differs(single: StoreReader, half: StoreReader) -> str:
    """How ``half`` was made otherwise than ``single`` (empty when it was not)."""
    made, its = (store_attrs(r.attrs, r.root).made for r in (single, half))
    if its != made:
        changed = sorted(k for k in made.keys() | its.keys() if made.get(k) != its.get(k))
        return f"was made with other settings ({', '.join(changed)})"
    if half.classes != single.classes:
        return "has other classes"
    return ""
