"""Captions, tokens and metadata fields beside the images: what ``Loader(text=..., tokenizer=...,
fields=...)`` hands over with each batch.

The store holds them per source (``store.pairs``); the Loader gathers them per sample once, when
it opens (``PairColumns``: one array per caption name and field, over the samples of every store
it reads, in the reader's global ids). Each batch takes its rows on a reader thread
(``BatchPairs``), where the tokenizer runs too: never on the training loop's clock.

Several caption names with weights (``text={"caption": 0.7, "synthetic": 0.3}``) pick one per
sample per epoch: the sample's names are put in a weighted random order drawn from (seed, epoch,
position) alone, and the first that is not empty is its caption (open_clip's rule for
``--json-text-key-probs``: an empty pick falls to the next). A resumed epoch draws the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.options import TextChoice
from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.store import format as fmt
from tilefeed.store.errors import ConfigError

TEXT_STREAM = "text"  # the draw stream of the caption picks
TEXTS = "texts"  # the keys of a handed-over batch: its captions (or tokens) and its fields
FIELDS = "fields"


@dataclass(frozen=True, eq=False)  # eq=False: arrays are among the fields
class PairColumns:
    """The captions and fields of every sample a Loader reads, by the reader's ids.

    Attributes
    ----------
    texts : dict of str to numpy.ndarray
        Caption name -> one string a sample (numpy ``StringDType``).
    fields : dict of str to numpy.ndarray
        Field name -> one value a sample.
    """

    texts: dict[str, np.ndarray]
    fields: dict[str, np.ndarray]


def gather_columns(stores: Sequence[tuple[str, Any]], text: TextChoice | None, fields: tuple[str, ...],
                   labels: bool) -> PairColumns:
    """The columns of ``stores`` ((location, StoreReader), in the reader's order, their samples
    concatenated as its global ids are), after checking that each holds what is asked; a
    ConfigError naming the store and what it lacks otherwise."""
    from tilefeed.store.arrays import read_small_array
    from tilefeed.store.pairs import read_pairs

    names = text.names if text is not None else ()
    parts_texts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    parts_fields: dict[str, list[np.ndarray]] = {n: [] for n in fields}
    for location, reader in stores:
        meta = reader.meta
        missing = [n for n in names if n not in meta.texts]
        if missing:
            held = ", ".join(meta.texts) or "none"
            raise ConfigError(f"text: store {location!r} holds no caption named {missing[0]!r} "
                              f"(it holds: {held})")
        kinds = dict(meta.fields)
        missing = [n for n in fields if n not in kinds]
        if missing:
            held = ", ".join(kinds) or "none"
            raise ConfigError(f"fields: store {location!r} holds no field {missing[0]!r} (it holds: {held})")
        if labels and not meta.labelled:
            raise ConfigError(f"labels=True: store {location!r} holds no class labels (an image-text store "
                              "made without a label column); leave labels out")
        if not names and not fields:
            continue
        pairs = read_pairs(reader.root, meta, names, fields)
        owners = read_small_array(reader.root, meta, fmt.SOURCES)  # each sample's source row
        for n in names:
            parts_texts[n].append(pairs.texts[n][owners])
        for n in fields:
            parts_fields[n].append(pairs.fields[n][owners])
    dtypes = {n: {dict(r.meta.fields)[n] for _, r in stores} for n in fields}
    for n, found in dtypes.items():
        if len(found) > 1:
            raise ConfigError(f"fields: {n!r} is {' in one store and '.join(sorted(found))} in another; "
                              "a batch's field holds one type")
    return PairColumns({n: np.concatenate(p) for n, p in parts_texts.items()},
                       {n: np.concatenate(p) for n, p in parts_fields.items()})


@dataclass(frozen=True, eq=False)
class BatchPairs:
    """One epoch's captions and fields per batch, on a reader thread: called with the batch's
    sample ids and positions, it gives what the hand-over adds to the batch (``TEXTS``: a list
    of str, or the tokenizer's tensor; ``FIELDS``: name -> tensor, or list of str)."""

    columns: PairColumns
    text: TextChoice | None
    tokenizer: Callable[[list[str]], Any] | None
    seed: int
    epoch: int

    def __call__(self, ids: np.ndarray, positions: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text is not None:
            texts = pick(self.columns.texts, self.text, self.seed, self.epoch, ids, positions)
            out[TEXTS] = texts if self.tokenizer is None else self.tokenizer(texts)
        if self.columns.fields:
            out[FIELDS] = {name: _field(values[ids]) for name, values in self.columns.fields.items()}
        return out


def pick(texts: Mapping[str, np.ndarray], text: TextChoice, seed: int, epoch: int, ids: np.ndarray,
         positions: np.ndarray) -> list[str]:
    """Each sample's caption: the first name not empty in its weighted order (module docstring)."""
    rows = np.stack([texts[n][ids] for n in text.names], axis=1) if len(ids) else np.empty((0, 1), "T")
    if len(text.names) == 1:
        return [str(s) for s in rows[:, 0]]
    # a weighted random order (Efraimidis and Spirakis): sorting u ** (1 / w) downwards puts
    # name k first with probability w_k / sum(w), then the rest by the same rule
    u = uniforms(stream_seed(seed, TEXT_STREAM), epoch, np.asarray(positions, dtype=np.int64), len(text.names))
    keys = np.log(np.maximum(u, 1e-300)) / np.asarray(text.weights)
    order = np.argsort(-keys, axis=1, kind="stable")
    chosen = np.take_along_axis(rows, order[:, :1], axis=1)[:, 0]
    for rank in range(1, len(text.names)):
        empty = chosen == ""
        if not empty.any():
            break
        nxt = np.take_along_axis(rows, order[:, rank : rank + 1], axis=1)[:, 0]
        chosen = np.where(empty, nxt, chosen)
    return [str(s) for s in chosen]


def _field(values: np.ndarray) -> Any:
    if values.dtype.kind in "iuf":
        return torch.from_numpy(np.ascontiguousarray(values))
    return [str(v) for v in values]
