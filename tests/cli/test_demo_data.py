"""The cache's generated stores: reused when complete, made again when another tilefeed version or
other settings made them (the cache is tilefeed's own, so no --overwrite is asked for)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tilefeed.bench.fixtures.generated import make_image_folder
from tilefeed.cli.demo_data import cached
from tilefeed.preprocess import TileSettings, preprocess
from tilefeed.pipeline import StoreReader


def test_a_cached_store_of_other_settings_is_made_again(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    images = make_image_folder(tmp_path / "images", classes=2, per_class=2, sizes=((40, 30),))
    store = tmp_path / "store"
    first = cached(store, partial(preprocess, images, store, TileSettings(tile=16), workers=1))
    again = cached(store, partial(preprocess, images, store, TileSettings(tile=16), workers=1))
    assert not first.up_to_date and again.up_to_date
    assert "making it again" not in capsys.readouterr().out
    other = cached(store, partial(preprocess, images, store, TileSettings(tile=24), workers=1))
    assert not other.up_to_date and "making it again" in capsys.readouterr().out
    with StoreReader(store) as reader:
        assert reader.tile == 24
