"""``tilefeed show``: the sheet holds what the model receives, captioned, laid out in a grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.engine.crops import window_inputs
from tilefeed.pipeline.reading.reader import source_paths
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


# -- a store with captions -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pairs_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers import make_pairs_store

    return make_pairs_store(tmp_path_factory.mktemp("sheet-pairs"), 12)


def line_height() -> int:
    from PIL import ImageFont

    return int(ImageFont.load_default().getbbox("Ag")[3]) + 2


def test_a_store_with_captions_draws_each_samples_caption_under_it(pairs_store: Path) -> None:
    from tests.helpers import caption_of
    from tilefeed.pipeline.sheet import GAP, SHEET_COLOUR, draw_sheet

    with StoreReader(pairs_store) as reader:
        for sheet, name in ((contact_sheet(reader, count=9), "caption"),
                            (contact_sheet(reader, samples=[1, 2, 4], show_stored=True, text="synthetic"),
                             "synthetic")):
            keys = [Path(p).name for p in source_paths(reader, np.asarray(sheet.indices))]
            tiles = [tile_area(sheet, k)[:: sheet.scale, :: sheet.scale] for k in range(len(sheet.cells))]
            assert sheet.text == name
            # the lines drawn are the caption, broken at spaces; an empty caption draws none
            assert [" ".join(lines) for lines in sheet.texts] == [caption_of(k, name) for k in keys]
            assert all(len(lines) <= 3 for lines in sheet.texts)
            plain = draw_sheet(tiles, sheet.captions, scale=sheet.scale)  # the same cells, no captions
            rows = len({y for _, y in sheet.cells})
            band = max(len(lines) for lines in sheet.texts)
            assert band > 0 and sheet.image.width == plain.image.width
            assert sheet.image.height == plain.image.height + rows * band * line_height()
            for k in range(len(tiles)):  # the pictures as they were, the captions' band under them
                np.testing.assert_array_equal(tile_area(sheet, k), tile_area(plain, k))
            top = sheet.cells[0][1] + sheet.side + GAP // 2 + len(sheet.captions[0]) * line_height()
            drawn = np.asarray(sheet.image)[top : top + band * line_height()] != SHEET_COLOUR
            assert drawn.any()  # some caption of the first row is written there


def test_a_classification_store_sheet_has_no_caption_band(store: Path) -> None:
    from tilefeed.pipeline.sheet import GAP
    from tilefeed.store.errors import ConfigError

    with StoreReader(store) as reader:
        sheet = contact_sheet(reader, samples=[0, 1, 2, 3, 4])
        assert sheet.text == "" and sheet.texts == []
        # three lines under each cell (class, index, source), as before captions were drawn
        assert sheet.image.size == (GAP + 3 * (sheet.side + GAP),
                                    GAP + 2 * (sheet.side + 3 * line_height() + GAP + GAP))
        with pytest.raises(ConfigError, match=r"text: the store holds no caption named 'caption' \(it holds"):
            contact_sheet(reader, samples=[0], text="caption")


def test_a_long_caption_is_wrapped_and_shortened_to_the_cell() -> None:
    import time

    from PIL import Image, ImageDraw, ImageFont
    from tilefeed.pipeline.sheet import wrap

    draw, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), ImageFont.load_default()
    words = " ".join(f"word{i}" for i in range(6000))  # 32 KiB or so
    started = time.perf_counter()
    lines = wrap(draw, words, 96, font)
    assert time.perf_counter() - started < 1  # searched, not scanned character by character
    assert len(lines) == 3 and lines[-1].endswith("...")
    assert all(draw.textlength(x, font=font) <= 96 for x in lines)
    assert lines[0].startswith("word0 word1") and not lines[0].endswith(" ")
    assert wrap(draw, "x" * 500, 96, font)[0].startswith("xxx")  # a word wider than the cell is cut
    assert wrap(draw, "", 96, font) == () and wrap(draw, "short", 96, font) == ("short",)


def test_show_draws_the_first_caption_of_a_store_with_captions(pairs_store: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from tilefeed.pipeline.sheet import GAP

    out = tmp_path / "pairs.png"
    assert main([str(pairs_store), "--count", "4", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (f"wrote {out}: 4 evaluation framings, 32 px, "
                                               "captions 'caption' drawn")
    with StoreReader(pairs_store) as reader:
        sheet = contact_sheet(reader, count=4)
    band = max(len(lines) for lines in sheet.texts)
    with Image.open(out) as image:  # two rows of cells, each with its three lines and the caption's
        assert image.size == sheet.image.size == (
            GAP + 2 * (sheet.side + GAP), GAP + 2 * (sheet.side + (3 + band) * line_height() + GAP + GAP))
    assert main([str(pairs_store), "--stored", "--count", "4", "--out", str(out)]) == 0
    assert "captions 'caption' drawn" in capsys.readouterr().out
