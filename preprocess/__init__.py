"""Offline conversion of an image dataset into pre-tiled, sharded Zarr v3 stores."""

from preprocess.settings import StoreSettings, TileSettings
from preprocess.writer import Summary, preprocess

__all__ = ["StoreSettings", "Summary", "TileSettings", "preprocess"]
