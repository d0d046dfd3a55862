"""The reader under faults: flipped bytes are always detected, vanished shards are named."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import CorruptChunkError, Loader, StoreReader
from tilefeed.store import format as fmt
from tests.helpers import make_store


@pytest.mark.parametrize("codec", ["lz4", "none"])  # none: copied into the batch, then checked
def test_random_byte_flips_are_always_detected(codec: str, tmp_path: Path) -> None:
    store = make_store(tmp_path / "source", codec)
    clean = StoreReader(store)
    expected = [clean.read(i) for i in range(len(clean))]
    shards = clean.meta.shards
    rng = random.Random(7)
    for trial in range(40):
        copy = tmp_path / f"t{trial}"
        shutil.copytree(store, copy)
        shard = rng.randrange(shards)
        path = fmt.shard_path(copy, shard)
        raw = bytearray(path.read_bytes())
        pos = rng.randrange(len(raw))
        raw[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(raw))
        reader = StoreReader(copy)
        errors = 0
        for i in range(len(reader)):
            try:
                pixels = reader.read_batch_into([i], np.empty((1, *reader.codec.shape), np.uint8))[0]
            except CorruptChunkError as e:
                errors += 1
                assert str(path) in str(e)
                continue
            np.testing.assert_array_equal(pixels, expected[i])  # never garbage pixels
        assert errors >= 1, f"flip at byte {pos} of shard {shard} went unnoticed"
        reader.close()


def test_a_shard_that_vanishes_mid_epoch_is_a_clear_error(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    last = fmt.shard_path(copy, 6)
    with Loader(copy, 4, shuffle="none", train=False, dtype=torch.uint8, workers=1) as loader:
        with pytest.raises(CorruptChunkError, match=f"{last}.*cannot map shard.*No such file"):
            for n, _ in enumerate(loader):
                if n == 0:
                    last.unlink()
