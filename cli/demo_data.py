"""The images and stores a bench or the demo runs on when none is given: an ImageNet-like
image set generated into the cache folder, and the store made from it, each made once and
reused by every later run."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tilefeed.preprocess.settings import Fit
from tilefeed.store.format import Codec

if TYPE_CHECKING:
    from tilefeed.preprocess.writer import Summary


def cache_dir() -> Path:
    from tilefeed.store.cache_dir import default_cache_dir

    return default_cache_dir()


def demo_images(count: int, classes: int = 8) -> Path:
    from tilefeed.bench.fixtures.generated import make_image_folder
    from tilefeed.store.format import ceil_div

    per_class = ceil_div(count, classes)
    folder = cache_dir() / f"images-{classes}x{per_class}"
    print(f"images: {folder} ({classes} classes x {per_class}, generated once, then reused)",
          flush=True)
    return make_image_folder(folder, classes=classes, per_class=per_class)


def demo_store(images: Path, size: int = 224, codec: Codec = Codec.LZ4, fit: Fit = Fit.PAD,
               shard_size: int = 1024) -> Path:
    """The store made from ``images`` in the cache; preprocessing is skipped when it is complete."""
    from tilefeed.preprocess import StoreSettings, TileSettings, preprocess
    from tilefeed.cli.progress import progress_bar

    shards = "" if shard_size == 1024 else f"-s{shard_size}"
    # named by the folder's full path too: two folders of one name make two stores
    where = hashlib.sha256(str(images.resolve()).encode()).hexdigest()[:8]
    store = cache_dir() / f"{images.name}-{where}-{size}-{codec}-{fit}{shards}"
    s = cached(store, partial(preprocess, images, store, TileSettings(tile=size, fit=fit),
                              StoreSettings(codec=codec, shard_size=shard_size),
                              progress=progress_bar(sys.stderr.isatty())))
    print(f"store: {store} ({'reused' if s.up_to_date else f'made in {s.seconds:.1f} s'})",
          flush=True)
    return store


def cached(store: Path, make: Callable[..., Summary]) -> Summary:
    """``make()``: a store in the cache, reused when complete; one made by another tilefeed
    version or from other settings (the cache is tilefeed's own) is made again, with a note."""
    from tilefeed.store.errors import StoreExistsError

    try:
        return make()
    except StoreExistsError:
        print(f"store: {store} was made by another tilefeed version or from other settings: making it "
              "again", flush=True)
        return make(overwrite=True)


def demo_coco(count: int) -> tuple[Path, Path]:
    """A generated COCO-format set of ``count`` images in the cache: (images folder, instances JSON)."""
    from tilefeed.bench.fixtures.coco import make_coco_folder

    folder = cache_dir() / f"coco-{count}"
    print(f"images: {folder} (COCO format, {count} images, generated once, then reused)", flush=True)
    return make_coco_folder(folder, count=count)


def demo_coco_store(images: Path, annotations: Path, size: int, masks: bool) -> Path:
    """The store made from a COCO-format set with its boxes (and instance masks) in the cache;
    preprocessing is skipped when it is complete."""
    from tilefeed.cli.progress import progress_bar
    from tilefeed.preprocess import TileSettings, preprocess
    from tilefeed.preprocess.settings import TargetOptions

    where = hashlib.sha256(str(images.resolve()).encode()).hexdigest()[:8]
    store = cache_dir() / f"{images.parent.name}-{where}-{size}-lz4-pad{'-masks' if masks else ''}"
    s = cached(store, partial(preprocess, images, store, TileSettings(tile=size, fit=Fit.PAD),
                              targets=TargetOptions(annotations=str(annotations), instance_masks=masks),
                              progress=progress_bar(sys.stderr.isatty())))
    print(f"store: {store} ({'reused' if s.up_to_date else f'made in {s.seconds:.1f} s'})", flush=True)
    return store
