"""Offline conversion of an image dataset into pre-tiled, sharded Zarr v3 stores.

The writer (and with it multiprocessing and zarr) loads on first use of ``preprocess``.
"""

from __future__ import annotations

if __name__ != "tilefeed.preprocess":  # the repository's folder imported as itself, from a checkout's root
    raise ImportError(f"import tilefeed.preprocess, not {__name__}: the same module under two names would be "
                      "two modules (two graph pools, two caches)")

from typing import TYPE_CHECKING, Any

from tilefeed.preprocess.settings import Fit, Icc, Mode, Resample, StoreSettings, TargetOptions, TileSettings

if TYPE_CHECKING:
    from tilefeed.preprocess.writer import Summary, preprocess

__all__ = ["Fit", "Icc", "Mode", "Resample", "StoreSettings", "Summary", "TargetOptions", "TileSettings",
           "preprocess"]


def __getattr__(name: str) -> Any:
    if name in ("preprocess", "Summary"):
        from tilefeed.preprocess import writer

        return getattr(writer, name)
    raise AttributeError(f"module 'tilefeed.preprocess' has no attribute {name!r}")
