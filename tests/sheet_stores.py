"""The stores the contact-sheet tests draw from (library and command)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import photo
from tilefeed.pipeline import StoreReader
from tilefeed.pipeline.sheet import Sheet, contact_sheet
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess

BACKGROUND = (0, 255, 0)  # the pad colour: pure green, which the smooth test photos never fill a row with
ASPECTS = {"wide": (64, 32), "tall": (32, 56)}  # width, height: both leave padding in a square tile
PER_CLASS = 10


@pytest.fixture(scope="module")
def pad_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source folder, store): 20 pictures of two aspects in 32 px pad-fit lz4 tiles, and two
    rejected inputs: a JPEG cut in half (partly decodes) and a text file (does not)."""
    root = tmp_path_factory.mktemp("show")
    src = root / "src"
    for c, (name, (w, h)) in enumerate(ASPECTS.items()):
        (src / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            photo(100 * c + i, w, h).save(src / name / f"{i:03d}.jpg", quality=92)
    whole = root / "whole.jpg"
    photo(7, 400, 300).save(whole, quality=92)
    data = whole.read_bytes()
    (src / "wide" / "cut.jpg").write_bytes(data[: len(data) // 2])
    (src / "tall" / "words.jpg").write_text("not an image")
    store = root / "store"
    preprocess(src, store, TileSettings(tile=32, fit="pad", background=BACKGROUND),
               StoreSettings(codec="lz4", shard_size=8), workers=1)
    return src, store


@pytest.fixture(scope="module")
def train_sheet(pad_store: tuple[Path, Path]) -> Sheet:
    with StoreReader(pad_store[1]) as reader:
        return contact_sheet(reader, train=True, count=16)
