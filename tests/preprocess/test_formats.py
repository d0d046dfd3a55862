"""Every image format Pillow writes, intact and broken; and a decoder that crashes its process."""

from __future__ import annotations

import faulthandler
import io
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr
from PIL import Image, ImageCms, ImageFile

from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
from tilefeed.preprocess.images import Rejected, load_tiles
from tests.helpers import photo, psnr, tree_bytes
from tests.preprocess.corpus import SIDE, Sample, build, damaged

CORPUS = build()
EXACT = TileSettings(tile=SIDE, fit="stretch")  # same size: no resampling, the decoded pixels


@pytest.mark.parametrize("sample", CORPUS, ids=[s.name for s in CORPUS])
def test_every_intact_file_decodes_to_its_pixels(tmp_path: Path, sample: Sample) -> None:
    path = tmp_path / sample.name
    path.write_bytes(sample.data)
    tile = load_tiles(str(path), EXACT).pixels[0]
    if sample.lossy:
        assert psnr(tile, sample.expected) > 30, sample.name
    else:
        np.testing.assert_array_equal(tile, sample.expected)


@pytest.mark.parametrize("sample", CORPUS, ids=[s.name for s in CORPUS])
def test_every_broken_file_is_accepted_or_rejected_with_one_line(tmp_path: Path, sample: Sample) -> None:
    for kind, data in damaged(sample.data).items():
        path = tmp_path / f"{sample.name}-{kind}"
        path.write_bytes(data)
        try:
            tiles = load_tiles(str(path), TileSettings(tile=16))
        except Rejected as e:
            assert str(e) and "\n" not in str(e), (kind, str(e))
        else:
            assert tiles.pixels.shape == (1, 16, 16, 3)


def test_a_folder_of_every_format_and_its_damage_preprocesses_to_a_store(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "intact").mkdir(parents=True)
    (src / "broken").mkdir()
    for sample in CORPUS:
        (src / "intact" / sample.name).write_bytes(sample.data)
        for kind, data in damaged(sample.data).items():
            (src / "broken" / f"{sample.name}-{kind}").write_bytes(data)
    summary = preprocess(src, tmp_path / "out", TileSettings(tile=32), StoreSettings(shard_size=64),
                         workers=2)
    assert summary.accepted + summary.rejected == summary.sources == len(CORPUS) * 4
    attrs = zarr.open_group(str(tmp_path / "out"), mode="r").attrs["tilefeed"]
    assert not [r for r in attrs["rejects"] if "/intact/" in r["path"]]
    assert summary.rejected > 0  # most truncated files cannot be read


def test_lab_converts_through_littlecms(tmp_path: Path) -> None:
    im = photo(4, SIDE, SIDE)
    transform = ImageCms.buildTransform(ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB"),
                                        "RGB", "LAB")
    lab = ImageCms.applyTransform(im, transform)
    assert lab is not None
    lab.save(tmp_path / "lab.tif")
    assert psnr(load_tiles(str(tmp_path / "lab.tif"), EXACT).pixels[0], np.asarray(im)) > 35


def test_icc_srgb_converts_embedded_profiles_and_ignore_matches_convert(tmp_path: Path) -> None:
    im = photo(5, SIDE, SIDE)
    # A profile that is not sRGB: pixels tagged with it look different once colour-managed.
    rgb_profile = ImageCms.getOpenProfile(io.BytesIO(_adobe_like_profile()))
    im.save(tmp_path / "tagged.png", icc_profile=rgb_profile.tobytes())
    ignored = load_tiles(str(tmp_path / "tagged.png"), EXACT).pixels[0]
    np.testing.assert_array_equal(ignored, np.asarray(im))  # what Image.convert("RGB") gives
    managed = load_tiles(str(tmp_path / "tagged.png"), TileSettings(tile=SIDE, fit="stretch", icc="srgb"))
    expected = ImageCms.profileToProfile(im, rgb_profile, ImageCms.createProfile("sRGB"), outputMode="RGB")
    assert expected is not None
    np.testing.assert_allclose(managed.pixels[0], np.asarray(expected), atol=1)
    assert np.abs(managed.pixels[0].astype(int) - ignored).max() > 5


def _adobe_like_profile() -> bytes:
    """An RGB profile that is not sRGB: littlecms's sRGB with its red primary moved."""
    data = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    # rXYZ/gXYZ/bXYZ tags: scale red's X up so the profile differs from sRGB
    tag_count = int.from_bytes(data[128:132], "big")
    for t in range(tag_count):
        entry = 132 + 12 * t
        sig, offset = data[entry : entry + 4], int.from_bytes(data[entry + 4 : entry + 8], "big")
        if sig == b"rXYZ":
            x = int.from_bytes(data[offset + 8 : offset + 12], "big", signed=True)
            data[offset + 8 : offset + 12] = int(x * 0.8).to_bytes(4, "big", signed=True)
    data[84:100] = b"\0" * 16  # the profile ID (an MD5) no longer holds
    return bytes(data)


# -- a decoder that kills its own process, as a segfaulting C codec would -----------------------
CRASH_MAGIC = b"TFCRASH!"


class _CrashingImageFile(ImageFile.ImageFile):
    format = "TFCRASH"
    format_description = "test-only: kills its process when opened"

    def _open(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


Image.register_open(_CrashingImageFile.format, _CrashingImageFile,
                    lambda prefix: prefix[: len(CRASH_MAGIC)] == CRASH_MAGIC)


@pytest.mark.slow
def test_a_decoder_that_kills_its_process_rejects_only_that_image(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the crashing decoder is registered in this process: its workers are forked from it even
    # when an earlier test's bucket client would have the pool start them from a forkserver
    monkeypatch.setattr("tilefeed.preprocess.worker_pool.client_started", lambda: False)
    faulthandler.disable()  # the dying workers would print pytest's fault traceback
    src = tmp_path / "src"
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(70):  # two parts per class: the crash is in the middle of a run
            photo(c * 100 + i, 40, 30).save(src / f"c{c}" / f"{i:03d}.png")
    (src / "c1" / "050-crash.png").write_bytes(CRASH_MAGIC + b"\0" * 64)
    stores = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        summary = preprocess(src, out, TileSettings(tile=16), StoreSettings(shard_size=50),
                             workers=workers)
        assert (summary.sources, summary.accepted, summary.rejected) == (141, 140, 1)
        rejects = zarr.open_group(str(out), mode="r").attrs["tilefeed"]["rejects"]
        assert rejects == [{"path": str(src / "c1" / "050-crash.png"),
                            "reason": f"crashed the decoder (signal {int(signal.SIGSEGV)})"}]
        stores[workers] = tree_bytes(out)
    assert stores[1] == stores[2]
    faulthandler.enable()
