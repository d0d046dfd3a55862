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

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.options import TextChoice
from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.store import format as fmt
from tilefeed.store.errors import ConfigError, one_line
from tilefeed.store.pairs import check_held, read_pairs, sample_rows

TEXT_STREAM = "text"  # the draw stream of the caption picks
TEXTS = "texts"  # the keys of a handed-over batch: its captions (or tokens) and its fields
FIELDS = "fields"


@dataclass(frozen=True, eq=False)  # eq=False: arrays are among the fields
class PairColumns:
    """The captions and fields of every store a Loader reads, one row per source, and each
    sample's row (the reader's ids index ``rows``): a caption is held once however many tiles
    its picture made, and a sample costs 8 bytes.

    Attributes
    ----------
    texts : dict of str to numpy.ndarray
        Caption name -> one string a source (numpy ``StringDType``), the stores' one after another.
    fields : dict of str to numpy.ndarray
        Field name -> one value a source.
    rows : numpy.ndarray
        int64, one a sample: its row of ``texts`` and ``fields``.
    """

    texts: dict[str, np.ndarray]
    fields: dict[str, np.ndarray]
    rows: np.ndarray


def gather_columns(stores: Sequence[tuple[str, Any]], text: TextChoice | None, fields: tuple[str, ...],
                   labels: bool) -> PairColumns:
    """The columns of ``stores`` ((location, StoreReader), in the reader's order, their samples
    one after another as its global ids are), after checking that each holds what is asked; a
    ConfigError naming the store and what it lacks otherwise."""
    names = text.names if text is not None else ()
    parts_texts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    parts_fields: dict[str, list[np.ndarray]] = {n: [] for n in fields}
    rows: list[np.ndarray] = []
    listed = 0  # the sources of the stores before this one
    for location, reader in stores:
        meta = reader.meta
        check_held(meta, names, fields, location)
        if labels and not meta.labelled:
            raise ConfigError(f"labels=True: store {location!r} holds no class labels (an image-text store "
                              "made without a label column); leave labels out")
        if not names and not fields:
            continue
        pairs = read_pairs(reader.root, meta, names, fields)
        for n in names:
            parts_texts[n].append(pairs.texts[n])
        for n in fields:
            parts_fields[n].append(pairs.fields[n])
        rows.append(sample_rows(reader.root, meta) + listed)
        listed += meta.arrays[fmt.SOURCE_PATHS].length
    dtypes = {n: {dict(r.meta.fields)[n] for _, r in stores} for n in fields}
    for n, found in dtypes.items():
        if len(found) > 1:
            raise ConfigError(f"fields: {n!r} is {' in one store and '.join(sorted(found))} in another; "
                              "a batch's field holds one type")
    return PairColumns({n: np.concatenate(p) for n, p in parts_texts.items()},
                       {n: np.concatenate(p) for n, p in parts_fields.items()},
                       np.concatenate(rows) if rows else np.empty(0, np.int64))


class BatchPairs:
    """One epoch's captions and fields per batch, on a reader thread: called with the batch's
    sample ids and positions, it gives what the hand-over adds to the batch (``TEXTS``: a list
    of str, or the tokenizer's tensor; ``FIELDS``: name -> tensor, or list of str).

    The tokenizer is called by one reader thread at a time (``Tokenizer``): Hugging Face's fast
    tokenizers refuse concurrent calls that pad or truncate ("Already borrowed")."""

    def __init__(self, columns: PairColumns, text: TextChoice | None, tokenizer: Tokenizer | None,
                 seed: int, epoch: int) -> None:
        self.columns, self.text, self.tokenizer, self.seed, self.epoch = columns, text, tokenizer, seed, epoch

    def __call__(self, ids: np.ndarray, positions: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        rows = self.columns.rows[ids]
        if self.text is not None:
            texts = pick(self.columns.texts, self.text, self.seed, self.epoch, rows, positions)
            out[TEXTS] = texts if self.tokenizer is None else self.tokenizer(texts, ids)
        if self.columns.fields:
            out[FIELDS] = {name: _field(values[rows]) for name, values in self.columns.fields.items()}
        return out


class Tokenizer:
    """The caller's tokenizer, called by one thread at a time; a failure or a result that is not
    one row per caption is a one-line ConfigError naming the batch's first sample."""

    def __init__(self, call: Callable[[list[str]], Any]) -> None:
        self.call = call
        self.lock = threading.Lock()

    def __call__(self, texts: list[str], ids: np.ndarray) -> Any:
        first = int(ids[0]) if len(ids) else -1
        try:
            with self.lock:
                tokens = self.call(texts)
        except Exception as e:  # noqa: BLE001 - the caller's function: its failure, named, in one line
            raise ConfigError(f"the tokenizer raised {type(e).__name__} on the batch from sample {first}: "
                              f"{one_line(e)}") from None
        if len(tokens) != len(texts):
            raise ConfigError(f"the tokenizer gave {len(tokens)} rows for {len(texts)} captions (the batch "
                              f"from sample {first}): it must give one row a caption")
        return tokens


def pick(texts: Mapping[str, np.ndarray], text: TextChoice, seed: int, epoch: int, rows: np.ndarray,
         positions: np.ndarray) -> list[str]:
    """Each sample's caption (``rows``: its row of ``texts``): the first name not empty in its
    weighted order, drawn from (seed, epoch, position) (module docstring)."""
    count = len(text.names)
    found = np.stack([texts[n][rows] for n in text.names], axis=1) if len(rows) else np.empty((0, count), "T")
    if count == 1:
        return [str(s) for s in found[:, 0]]
    if text.weights is None:  # the order given, for every sample
        order = np.broadcast_to(np.arange(count), found.shape)
    else:
        # a weighted random order (Efraimidis and Spirakis): sorting u ** (1 / w) downwards puts
        # name k first with probability w_k / sum(w), then the rest by the same rule; a weight
        # of 0 sorts after every other, in the order given (open_clip's fallbacks)
        u = uniforms(stream_seed(seed, TEXT_STREAM), epoch, np.asarray(positions, dtype=np.int64), count)
        with np.errstate(divide="ignore"):
            keys = np.log(np.maximum(u, 1e-300)) / np.asarray(text.weights)
        order = np.argsort(-keys, axis=1, kind="stable")
    chosen = np.take_along_axis(found, order[:, :1], axis=1)[:, 0]
    for rank in range(1, len(text.names)):
        empty = chosen == ""
        if not empty.any():
            break
        nxt = np.take_along_axis(found, order[:, rank : rank + 1], axis=1)[:, 0]
        chosen = np.where(empty, nxt, chosen)
    return [str(s) for s in chosen]


def _field(values: np.ndarray) -> Any:
    if values.dtype.kind in "iuf":
        return torch.from_numpy(np.ascontiguousarray(values))
    return [str(v) for v in values]
