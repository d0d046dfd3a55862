from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tilefeed.preprocess.images import Rejected, grid_positions, load_tiles
from tilefeed.preprocess.settings import TileSettings
from tests.helpers import photo

WHITE = (255, 255, 255)


def tile_of(path: Path, **kw: object) -> np.ndarray:
    result = load_tiles(str(path), TileSettings(**kw))  # type: ignore[arg-type]
    assert result.pixels.dtype == np.uint8 and result.pixels.shape[1:] == (kw["tile"], kw["tile"], 3)
    return result.pixels[0]


@pytest.mark.parametrize(
    "mode,make",
    [
        ("L", lambda a: Image.fromarray(a[..., 0], "L")),
        ("1", lambda a: Image.fromarray(a[..., 0] > 127)),
        ("P", lambda a: Image.fromarray(a).convert("P")),
        ("CMYK", lambda a: Image.fromarray(a).convert("CMYK")),
        ("I;16", lambda a: Image.fromarray(a[..., 0].astype(np.uint16) * 257)),
        ("I", lambda a: Image.fromarray(a[..., 0].astype(np.int32) * 257)),
        ("F", lambda a: Image.fromarray(a[..., 0].astype(np.float32) / 255.0)),
    ],
)
def test_every_mode_becomes_rgb(tmp_path: Path, mode: str, make: object) -> None:
    a = np.asarray(photo(1, 40, 40))
    im = make(a)  # type: ignore[operator]
    path = tmp_path / ("x.tiff" if mode in ("I;16", "I", "F", "CMYK") else "x.png")
    im.save(path)
    out = tile_of(path, tile=40, fit="stretch")
    if mode in ("I;16", "I", "F", "L"):
        # wide greyscale is scaled to 8 bits, not clipped: the grey values come back
        np.testing.assert_allclose(out[..., 0], a[..., 0], atol=1)
        assert (out[..., 0] == out[..., 2]).all()
    else:  # 1, P, CMYK: exactly what PIL's own conversion of the stored image gives
        with Image.open(path) as stored:
            np.testing.assert_array_equal(out, np.asarray(stored.convert("RGB")))
        if mode == "1":
            assert set(np.unique(out)) == {0, 255}


def test_transparency_is_composited_over_the_background(tmp_path: Path) -> None:
    rgba = np.zeros((32, 32, 4), dtype=np.uint8)
    rgba[..., 0] = 200
    rgba[:16, :, 3] = 255  # top half opaque red, bottom half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = tile_of(tmp_path / "a.png", tile=32, fit="stretch", background=(0, 0, 255))
    assert tuple(out[4, 16]) == (200, 0, 0)
    assert tuple(out[28, 16]) == (0, 0, 255)
    Image.fromarray(rgba, "RGBA").convert("LA").save(tmp_path / "la.png")
    out = tile_of(tmp_path / "la.png", tile=32, fit="stretch")
    assert tuple(out[28, 16]) == WHITE
    p = Image.new("P", (32, 32), 1)
    p.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    p.info["transparency"] = 1
    p.save(tmp_path / "p.gif", transparency=1)
    assert tuple(tile_of(tmp_path / "p.gif", tile=32, fit="stretch")[5, 5]) == WHITE


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    a = np.zeros((40, 80, 3), dtype=np.uint8)  # wide: left half black, right half white
    a[:, 40:] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    Image.fromarray(a).save(tmp_path / "o.jpg", exif=exif, quality=95)
    out = tile_of(tmp_path / "o.jpg", tile=40, fit="pad", background=(0, 0, 0))
    # displayed image is tall: black on top, white at the bottom
    assert out[5, 20].mean() < 30 and out[35, 20].mean() > 220


def test_animation_takes_the_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (24, 24), c) for c in [(255, 0, 0), (0, 255, 0)]]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:])
    out = tile_of(tmp_path / "a.gif", tile=24, fit="stretch")
    assert out[..., 0].mean() > 200 and out[..., 1].mean() < 50


def test_large_jpeg_uses_draft_and_keeps_the_picture(tmp_path: Path) -> None:
    big = photo(3, 2400, 1600)
    big.save(tmp_path / "big.jpg", quality=90)
    out = tile_of(tmp_path / "big.jpg", tile=64, fit="stretch")
    expected = np.asarray(big.resize((64, 64), Image.Resampling.BICUBIC))
    assert np.abs(out.astype(int) - expected.astype(int)).mean() < 4


def test_fit_modes(tmp_path: Path) -> None:
    a = np.zeros((50, 100, 3), dtype=np.uint8)
    a[:, :25] = 255  # a white stripe on the far left
    Image.fromarray(a).save(tmp_path / "w.png")
    crop = tile_of(tmp_path / "w.png", tile=50, fit="crop")
    assert crop.max() == 0  # the centre square misses the stripe
    pad = tile_of(tmp_path / "w.png", tile=50, fit="pad", background=(9, 9, 9))
    assert tuple(pad[0, 25]) == (9, 9, 9) and pad[25, 40].max() == 0
    stretch = tile_of(tmp_path / "w.png", tile=50, fit="stretch")
    assert stretch[25, 2].min() == 255


def test_grid_covers_the_image_with_padded_edges(tmp_path: Path) -> None:
    a = np.asarray(photo(5, 100, 70))
    Image.fromarray(a).save(tmp_path / "g.png")
    result = load_tiles(str(tmp_path / "g.png"), TileSettings(tile=32, mode="grid", stride=32,
                                                           background=(1, 2, 3)))
    assert len(result.pixels) == 4 * 3
    assert list(result.rows) == [0] * 4 + [1] * 4 + [2] * 4
    assert list(result.cols) == [0, 1, 2, 3] * 3
    for tile, r, c in zip(result.pixels, result.rows, result.cols, strict=True):
        patch = a[r * 32 : r * 32 + 32, c * 32 : c * 32 + 32]
        np.testing.assert_array_equal(tile[: patch.shape[0], : patch.shape[1]], patch)
        assert (tile[patch.shape[0] :, :] == (1, 2, 3)).all()


@pytest.mark.parametrize("length,tile,stride,expected", [
    (10, 32, 32, [0]), (32, 32, 32, [0]), (33, 32, 32, [0, 32]), (100, 32, 24, [0, 24, 48, 72]),
    (100, 10, 95, [0, 95]), (100, 10, 150, [0]),
])
def test_grid_positions(length: int, tile: int, stride: int, expected: list[int]) -> None:
    assert grid_positions(length, tile, stride) == expected


def test_bad_inputs_are_rejected_with_a_reason(bad_folder: Path) -> None:
    settings = TileSettings(tile=32, max_pixels=100_000)
    bad = bad_folder / "c1"
    expected = {
        "zero.jpg": "empty file",
        "truncated.jpg": "corrupt or truncated",
        "text.jpg": "not an image",
        "garbled.png": "corrupt or truncated",
        "huge.png": "too large",
        "missing.jpg": "missing",
    }
    for name, reason in expected.items():
        with pytest.raises(Rejected, match=reason):
            load_tiles(str(bad / name), settings)


def test_a_png_whose_damaged_data_still_inflates_is_rejected(tmp_path: Path) -> None:
    """These 16 bytes, written over the middle of the PNG's image data, still inflate (Pillow
    then decodes other pixels without an error); the chunk's CRC no longer matches, and the
    picture is a reject, not a tile of wrong pixels."""
    photo(3, 64, 64).save(tmp_path / "good.png")
    png = bytearray((tmp_path / "good.png").read_bytes())
    png[len(png) // 2 : len(png) // 2 + 16] = bytes.fromhex("70e26268ff60676488dd817982f546f9")
    (tmp_path / "damaged.png").write_bytes(bytes(png))
    with pytest.raises(Rejected, match="corrupt or truncated: broken PNG file"):
        load_tiles(str(tmp_path / "damaged.png"), TileSettings(tile=32))
    assert load_tiles(str(tmp_path / "good.png"), TileSettings(tile=32)).pixels.shape[0] == 1
