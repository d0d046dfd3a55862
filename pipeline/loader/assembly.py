"""What a Loader's checked settings make on an open store: the graph's ``Augment`` and the
``Advice`` its ``stats()`` weighs, kept out of ``pipeline.settings`` so the settings stay values."""

from __future__ import annotations

import torch

from tilefeed.pipeline.engine.augment import Augment
from tilefeed.pipeline.options import Layout, Shuffle
from tilefeed.pipeline.reading.protocol import Reader
from tilefeed.pipeline.settings import LoaderSettings
from tilefeed.pipeline.stats import Advice
from tilefeed.store.host import usable_cores


def augment(settings: LoaderSettings, tile: int, padded: bool) -> Augment:
    """What the graph does to each tile of a store of ``tile``-sided tiles.

    Parameters
    ----------
    settings : LoaderSettings
        The Loader's checked options.
    tile : int
        The store's tile side.
    padded : bool
        Some tile holds padding around its picture, so even evaluation cuts per-sample windows.

    Returns
    -------
    Augment
        The graph's per-tile settings.
    """
    s = settings
    return Augment(
        train=s.train, tile=tile, normalize=s.dtype != torch.uint8, half=s.dtype == torch.float16,
        channels_first=s.layout is Layout.NCHW, crop_pct=s.crop_pct, scale=s.scale, ratio=s.ratio,
        mean=s.mean, std=s.std,
        # with targets, evaluation frames whole tiles, padding included: the letterbox as stored
        windows=s.train or (padded and not s.targets), fast_idct=s.fast_idct,
        scaled_decode=s.scaled_decode, recipe=s.recipe)


def advice(settings: LoaderSettings, reader: Reader) -> Advice:
    """What ``stats()`` weighs its advice against: threads and cores, the store, the settings.

    Parameters
    ----------
    settings : LoaderSettings
        The Loader's checked options.
    reader : Reader
        The store (or mixture) the Loader reads.

    Returns
    -------
    Advice
        The facts the advice is chosen from.
    """
    s = settings
    return Advice(workers=s.workers, cores=usable_cores(), jpeg=reader.is_image_coded,
                  bucket=reader.remote is not None, global_shuffle=s.shuffle is Shuffle.GLOBAL,
                  transposes=s.layout is Layout.NCHW, gpu=s.device.type == "cuda")
