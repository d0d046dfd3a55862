"""``tilefeed show``: the sheet holds what the model receives, captioned, laid out in a grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.engine.crops import window_inputs
from tests.sheet_stores import ASPECTS, BACKGROUND, PER_CLASS
from tilefeed.cli.show import main
from tilefeed.pipeline.sheet import BOX_COLOUR, Sheet, contact_sheet



def tile_area(sheet: Sheet, k: int) -> np.ndarray:
    x, y = sheet.cells[k]
    return np.asarray(sheet.image)[y : y + sheet.side, x : x + sheet.side]


def enlarged(tile: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)


def test_training_crops_are_the_loaders_and_hold_no_padding(pad_store: tuple[Path, Path],
                                                             train_sheet: Sheet) -> None:
    with StoreReader(pad_store[1]) as reader:
        with Loader(reader, 16, shuffle=True, train=True, device="cpu") as epoch_loader:
            assert train_sheet.indices == epoch_loader.epoch_indices(0)[:16].tolist()
            shown = np.asarray(train_sheet.indices)
            start, end, _ = window_inputs(reader.boxes, epoch_loader.augment, 0, 0, shown, shown)
        top, left, height, width = reader.boxes[shown].T
        assert reader.padded and ((height < 32) | (width < 32)).all()
        assert (start[:, 0] >= top).all() and (start[:, 1] >= left).all()
        assert (end[:, 0] <= top + height).all() and (end[:, 1] <= left + width).all()
        # the model's uint8 view of the same samples: normalisation undone gives it back
        with Loader(reader, 16, shuffle=False, train=True, device="cpu", dtype=torch.uint8,
                    layout="NHWC", with_index=True, indices=shown) as loader:
            images, _, order = next(iter(loader))
    model = dict(zip(order.tolist(), images.numpy(), strict=True))
    for k, index in enumerate(train_sheet.indices):
        area = tile_area(train_sheet, k)
        np.testing.assert_array_equal(area, enlarged(model[index], train_sheet.scale), str(index))
        pad = (np.abs(area.astype(int) - BACKGROUND) <= 12).all(axis=2)
        assert not np.all(pad, axis=1).any() and not np.all(pad, axis=0).any(), f"padding in crop {index}"


def test_captions_name_class_index_and_source(pad_store: tuple[Path, Path], train_sheet: Sheet) -> None:
    src, store = pad_store
    with StoreReader(store) as reader:
        classes, labels = reader.classes, reader.labels
    assert sorted(classes) == sorted(ASPECTS)
    for index, caption in zip(train_sheet.indices, train_sheet.captions, strict=True):
        name, number, source = caption
        assert name == classes[labels[index]] and number == f"#{index}"
        assert Path(source).parent == src / name and Path(source).is_file()


def test_stored_tiles_show_the_picture_box(pad_store: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with StoreReader(pad_store[1]) as reader:
        sheet = contact_sheet(reader, show_stored=True, samples=[0, PER_CLASS])  # one of each aspect
        boxes = reader.boxes[sheet.indices]
        tiles = [reader.read(i) for i in sheet.indices]
    s = sheet.scale
    for k, ((top, left, height, width), tile) in enumerate(zip(boxes, tiles, strict=True)):
        area = tile_area(sheet, k)
        assert (height, width) != (32, 32)
        assert tuple(area[top * s, left * s]) == BOX_COLOUR  # the box's corners
        assert tuple(area[(top + height) * s - 1, (left + width) * s - 1]) == BOX_COLOUR
        assert tuple(area[0, 0]) == BACKGROUND  # the padding, as stored
        inner = enlarged(tile, s)[top * s + 1 : (top + height) * s - 1, left * s + 1 : (left + width) * s - 1]
        np.testing.assert_array_equal(area[top * s + 1 : (top + height) * s - 1,
                                           left * s + 1 : (left + width) * s - 1], inner)
    out = tmp_path / "stored.png"
    assert main([str(pad_store[1]), "--stored", "--count", "4", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: 4 stored tiles, 32 px, picture boxes drawn"


def test_evaluation_sheet_of_a_lossless_store_is_its_pixels(store: Path) -> None:
    wanted = [7, 2, 30, 0]  # not in store order: shown as given
    with StoreReader(store) as reader:
        assert not reader.padded
        sheet = contact_sheet(reader, samples=wanted)
        assert sheet.indices == wanted
        assert [c[1] for c in sheet.captions] == [f"#{i}" for i in wanted]
        for k, index in enumerate(wanted):
            np.testing.assert_array_equal(tile_area(sheet, k), enlarged(reader.read(index), sheet.scale))
