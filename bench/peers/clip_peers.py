"""The image-text loaders ``tilefeed bench clip`` runs beside the Loader, each built as its users
build it: open_clip's WebDataset pipeline (``open_clip_train.data.get_wds_dataset``) and LitData's
streaming dataset over an ``optimize``\\d copy of the same shards.

Every side hands over open_clip's training batch: ``(images, tokens)``, images through
``open_clip.image_transform(size, is_train=True)`` (a random-resized crop of 90-100 % of the
picture, bicubic, CLIP's normalisation, float32 NCHW) and captions through the ViT-B-32
tokenizer, ``(B, 77)`` int64. ``Batches`` wraps any of them to note what each batch held, so the
suite can refuse a comparison whose sides delivered different batches.
"""

from __future__ import annotations

import argparse
import io
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

# the extensions open_clip's pipeline takes as a sample's image (wds.rename(image=...)), in its order
IMAGE_EXTENSIONS = ("jpg", "png", "jpeg", "webp")
CONTEXT_LENGTH = 77  # the ViT-B-32 tokenizer's


def clip_tokenizer() -> tuple[Callable[[Any], torch.Tensor], str]:
    """open_clip's ViT-B-32 tokenizer, and how it was made.

    Returns
    -------
    tokenizer : callable
        str or list of str -> ``(B, 77)`` int64 tokens.
    source : str
        ``"get_tokenizer('ViT-B-32')"``, or ``"SimpleTokenizer()"`` where the model's tokenizer
        could not be built (its BPE vocabulary ships in the wheel, so this one needs no network).
    """
    import open_clip

    try:
        return open_clip.get_tokenizer("ViT-B-32"), "get_tokenizer('ViT-B-32')"
    except Exception:  # noqa: BLE001 - a hub lookup that fails offline: the same tokenizer, built directly
        return open_clip.tokenizer.SimpleTokenizer(), "SimpleTokenizer()"


def clip_preprocess(size: int) -> Any:
    """open_clip's training transform at ``size``: what its trainer passes ``get_wds_dataset``."""
    import open_clip

    return open_clip.image_transform(size, is_train=True)


def tar_paths(shards: Path) -> list[Path]:
    """The ``.tar`` shards of a folder, in name order."""
    paths = sorted(p for p in shards.glob("*.tar") if p.is_file())
    if not paths:
        from tilefeed.store.errors import ConfigError

        raise ConfigError(f"no .tar shards in {shards}")
    return paths


def tar_pairs(path: str | Path) -> Iterator[dict[str, Any]]:
    """The (image bytes, caption) pairs of one tar, grouped by key as WebDataset groups them: the
    image is the first member with one of ``IMAGE_EXTENSIONS``, the caption the ``.txt`` member;
    a key without both is skipped, as open_clip's ``filter_no_caption_or_no_image`` skips it."""
    with tarfile.open(path) as tar:
        members: dict[str, dict[str, bytes]] = {}
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.rpartition(".")
            data = tar.extractfile(member)
            if data is not None:
                members.setdefault(key, {})[ext.lower()] = data.read()
    for parts in members.values():
        image = next((parts[ext] for ext in IMAGE_EXTENSIONS if ext in parts), None)
        if image is not None and "txt" in parts:
            yield {"image": image, "caption": parts["txt"].decode("utf-8")}


def wds_args(shards: list[Path], *, batch_size: int, workers: int, samples: int,
             seed: int = 0) -> argparse.Namespace:
    """The namespace open_clip's trainer would hold for one process training on ``shards``
    (``--train-data a.tar::b.tar --train-num-samples N``, not resampled)."""
    return argparse.Namespace(
        train_data="::".join(str(p) for p in shards), val_data=None, batch_size=batch_size,
        workers=workers, seed=seed, train_num_samples=samples, dataset_resampled=False, world_size=1,
        train_data_upsampling_factors=None, distributed=False, rank=0)


def wds_loader(shards: list[Path], *, batch_size: int, workers: int, size: int, samples: int,
               tokenizer: Callable[[Any], torch.Tensor], seed: int = 0) -> Batches:
    """open_clip's WebDataset training pipeline over ``shards``, epoch after epoch.

    Parameters
    ----------
    shards : list of Path
        The tars; open_clip needs at least ``workers`` of them.
    batch_size, workers, size : int
        ``--batch-size``, ``--workers`` and the model's image size.
    samples : int
        ``--train-num-samples``: the samples of an epoch.
    tokenizer : callable
        The model's tokenizer.
    seed : int, default 0
        ``--seed``: the shard shuffle's.

    Returns
    -------
    Batches
        Its ``DataInfo.dataloader``, the epoch set on each new pass as its training loop sets it.
    """
    from open_clip_train.data import get_wds_dataset

    info = get_wds_dataset(wds_args(shards, batch_size=batch_size, workers=workers, samples=samples,
                                    seed=seed), clip_preprocess(size), True, epoch=0, tokenizer=tokenizer)
    return Batches(info.dataloader, on_epoch=info.set_epoch)


def litdata_optimize(shards: list[Path], out: Path, *, workers: int) -> None:
    """LitData's copy of the shards' pairs: ``litdata.optimize`` of each tar's (image bytes,
    caption) pairs into chunks under ``out``, ``workers`` processes."""
    import multiprocessing

    import litdata

    # optimize sets the process's start method to spawn for good: every DataLoader started after it
    # would then pickle its dataset, which open_clip's pipeline (lambdas) cannot be
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=tar_pairs, inputs=[str(p) for p in shards], output_dir=str(out),
                         num_workers=max(1, workers), chunk_bytes="64MB", mode="overwrite")
    finally:
        multiprocessing.set_start_method(before, force=True)


class PairTransform:
    """LitData's per-item transform: decode, open_clip's training transform, tokenise; a class so
    the dataset's worker processes can pickle it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._made: tuple[Any, Callable[[Any], torch.Tensor]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self.size, "_made": None}  # each process builds its own

    def __call__(self, item: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        if self._made is None:
            self._made = clip_preprocess(self.size), clip_tokenizer()[0]
        preprocess, tokenizer = self._made
        with Image.open(io.BytesIO(item["image"])) as picture:
            image = picture.convert("RGB")
        return preprocess(image), tokenizer(item["caption"])[0]


def litdata_loader(chunks: Path, *, batch_size: int, workers: int, size: int, seed: int = 0) -> Batches:
    """LitData's ``StreamingDataset`` (shuffled, incomplete batches dropped) of an ``optimize``\\d
    folder, decoded, transformed and tokenised in a ``StreamingDataLoader``'s ``workers``."""
    import litdata

    dataset = litdata.StreamingDataset(str(chunks), shuffle=True, drop_last=True, seed=seed,
                                       transform=PairTransform(size))
    return Batches(litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers))


class Batches:
    """A loader whose batches are noted as they pass: the distinct ``(images shape, images dtype,
    tokens shape, tokens dtype)`` seen. The last pass's iterator lives until ``release``. Other
    attributes (a Loader's ``stats``, ``close``) are the loader's own.

    Parameters
    ----------
    loader : iterable
        Yields ``(images, tokens, ...)``.
    on_epoch : callable, optional
        Called with the epoch's number before each pass (open_clip's ``DataInfo.set_epoch``).
    """

    def __init__(self, loader: Iterable[Any], on_epoch: Callable[[int], Any] | None = None) -> None:
        self.loader = loader
        self.on_epoch = on_epoch
        self.epoch = 0
        self.kinds: set[tuple[tuple[int, ...], str, tuple[int, ...], str]] = set()
        self.live: Iterator[Any] | None = None

    def release(self) -> None:
        """Drop the iterator of the last pass (its workers end with it)."""
        self.live = None

    def __iter__(self) -> Iterator[Any]:
        if self.on_epoch is not None:
            self.on_epoch(self.epoch)
        self.epoch += 1
        # held here, not by this generator alone: a loop left with ``break`` closes the generator
        # before its figures are read, and a DataLoader iterator dropped then shuts its workers
        # down (seconds, for LitData's) inside the last measured step
        self.live = iter(self.loader)
        for batch in self.live:
            images, tokens = batch[0], batch[1]
            self.kinds.add((tuple(images.shape), str(images.dtype).replace("torch.", ""),
                            tuple(tokens.shape), str(tokens.dtype).replace("torch.", "")))
            yield batch

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "live"):  # not set yet: no loader to ask
            raise AttributeError(name)
        return getattr(self.loader, name)
