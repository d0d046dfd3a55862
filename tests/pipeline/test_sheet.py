"""``tilefeed show``: the sheet holds what the model receives, captioned, laid out in a grid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import photo
from tilefeed.pipeline import Loader, StoreReader
from tilefeed.pipeline.engine.crops import window_inputs
from tilefeed.pipeline.sheet import BOX_COLOUR, Sheet, contact_sheet, main
from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.store.inspection import info

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


def tile_area(sheet: Sheet, k: int) -> np.ndarray:
    x, y = sheet.cells[k]
    return np.asarray(sheet.image)[y : y + sheet.side, x : x + sheet.side]


def enlarged(tile: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)


def test_cli_writes_the_training_sheet_in_a_square_grid(pad_store: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        train_sheet: Sheet) -> None:
    out = tmp_path / "sheet.png"
    assert main([str(pad_store[1]), "--train", "--count", "16", "--out", str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert said == [f"wrote {out}: 16 training crops of epoch 0, seed 0, 32 px"]
    with Image.open(out) as png:
        written = np.asarray(png.convert("RGB"))
    np.testing.assert_array_equal(written, np.asarray(train_sheet.image))  # the same crops, drawn alike
    assert len(train_sheet.cells) == 16
    xs, ys = sorted({x for x, _ in train_sheet.cells}), sorted({y for _, y in train_sheet.cells})
    assert len(xs) == 4 and len(ys) == 4  # ceil(sqrt(16)) columns
    assert train_sheet.side == 96 and train_sheet.scale == 3  # 32 px tiles enlarged to at least 96
    height, width = written.shape[:2]
    assert xs[-1] + train_sheet.side <= width < xs[-1] + 2 * train_sheet.side
    assert ys[-1] + train_sheet.side < height  # a caption strip under the last row


def test_training_crops_are_the_loaders_and_hold_no_padding(pad_store: tuple[Path, Path],
                                                             train_sheet: Sheet) -> None:
    with StoreReader(pad_store[1]) as reader:
        with Loader(reader, 16, shuffle=True, train=True, device="cpu") as epoch_loader:
            assert train_sheet.indices == epoch_loader.epoch_indices(0)[:16].tolist()
            shown = np.asarray(train_sheet.indices)
            start, end, _ = window_inputs(reader.boxes, epoch_loader.augment, 0, 0, shown)
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


def test_rejects_are_listed_with_their_reasons(pad_store: tuple[Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    src, store = pad_store
    rejects = {r["path"]: r["reason"] for r in info(store).rejects}
    cut, words = str(src / "wide" / "cut.jpg"), str(src / "tall" / "words.jpg")
    assert set(rejects) == {cut, words}
    out = tmp_path / "rejects.png"
    assert main([str(store), "--rejects", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"rejected   {cut}: {rejects[cut]}" in lines  # partly decodes: drawn
    assert any(line.startswith(f"rejected   {words}: {rejects[words]}  (not drawn: ") for line in lines)
    assert lines[-1] == f"wrote {out}: 1 of 2 rejected inputs"
    with Image.open(out) as png:
        assert png.width >= 128 and png.height > 128  # one thumbnail and its caption


@pytest.mark.parametrize("args", [
    ["{missing}"],
    ["{store}", "--count", "0"],
    ["{store}", "--samples", "1,99"],
    ["{store}", "--samples", "1,1"],
    ["{store}", "--samples", "1,x"],
    ["{store}", "--train", "--eval"],
    ["{store}", "--count", "3", "--samples", "1"],
    ["{store}", "--stored", "--size", "40"],
    ["{store}", "--out", "{missing}/sheet.png"],
    ["{store}", "--bogus"],
])
def test_bad_options_are_one_line_and_exit_2(pad_store: tuple[Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    names = {"store": str(pad_store[1]), "missing": str(tmp_path / "missing")}
    assert main([a.format(**names) for a in args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilefeed show: error: ")
    assert not list(tmp_path.glob("*.png"))


def test_a_bad_store_is_one_line_in_a_real_process(tmp_path: Path) -> None:
    (tmp_path / "zarr.json").write_text("{not json")
    code = f"from tilefeed.pipeline.sheet import main; raise SystemExit(main([{str(tmp_path)!r}]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("tilefeed show: error: ")
    assert "Traceback" not in done.stderr and not (tmp_path / "show.png").exists()
