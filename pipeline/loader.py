"""``Loader``: the drop-in for a torch DataLoader over a tilefeed store, built on DALI."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.graph import IMAGENET_MEAN, IMAGENET_STD, Augment, build_pipeline
from pipeline.order import SHUFFLES, batches_per_rank, epoch_order, rank_indices
from pipeline.reader import StoreReader
from pipeline.source import BatchSource
from preprocess.errors import ConfigError

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
LAYOUTS = ("NCHW", "NHWC")


def default_device() -> torch.device:
    """``cuda:LOCAL_RANK`` (or the current CUDA device) when there is a GPU, else ``cpu``."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    return torch.device("cuda", int(local) if local is not None else torch.cuda.current_device())


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class Loader:
    """Batches of ``(images, labels)`` torch tensors on the training device, epoch after epoch.

    Each ``iter()`` is a new epoch (``set_epoch`` sets its number, as with DistributedSampler);
    the order comes from ``(seed, epoch)`` alone and the ranks split it as described in
    ``pipeline.order``. ``train=True`` applies random-resized crop, horizontal flip and
    normalisation; ``train=False`` only resizes (to ``size``) and normalises, so with ``size``
    equal to the tile side and ``dtype=torch.uint8`` the stored tiles come out unchanged.
    ``with_index=True`` adds a third element: the sample indices of the batch.
    """

    def __init__(
        self,
        store: str | Path | StoreReader,
        batch_size: int,
        *,
        shuffle: str = "global",
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        train: bool = True,
        size: int = 224,
        dtype: torch.dtype = torch.float32,
        layout: str = "NCHW",
        with_index: bool = False,
        workers: int | None = None,
        prefetch: int = 2,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        shuffle_window: int = 4,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if shuffle not in SHUFFLES:
            raise ConfigError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(map(str, DTYPES))}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if not isinstance(size, int) or not 8 <= size <= 8192:
            raise ConfigError(f"size must be an int in 8..8192, got {size!r}")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ConfigError(f"workers must be a positive int or None, got {workers!r}")
        if not isinstance(prefetch, int) or prefetch < 1:
            raise ConfigError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ConfigError(f"ratio must satisfy 0 < min <= max, got {ratio!r}")
        if shuffle_window < 1:
            raise ConfigError(f"shuffle_window must be >= 1, got {shuffle_window!r}")
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size, or neither (torch.distributed is used)")
        if rank is None or world_size is None:
            rank, world_size = _distributed_rank()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device} was asked for, but CUDA is not available")
        if self.device.type not in ("cuda", "cpu"):
            raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {self.device}")

        self.reader = store if isinstance(store, StoreReader) else StoreReader(store)
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.dtype, self.layout, self.with_index = dtype, layout, with_index
        self.workers = workers or min(4, len(os.sched_getaffinity(0)))
        self.prefetch = prefetch
        self.shuffle_window = shuffle_window
        self.augment = Augment(
            train=train, size=size, tile=self.reader.tile, normalize=dtype != torch.uint8,
            half=dtype == torch.float16, channels_first=layout == "NCHW",
            scale=tuple(scale), ratio=tuple(ratio), mean=tuple(mean), std=tuple(std),  # type: ignore[arg-type]
        )
        self._epoch = 0
        self._start_batch = 0
        self._position: list[int] | None = None  # [epoch, batches yielded] while one is open
        self._source: BatchSource | None = None
        self._pipe: Any = None
        self._dali_iter: Any = None
        self._clean = False  # the DALI iterator ended its last epoch and can be reset

    # -- the DataLoader contract --------------------------------------------------------------
    def __len__(self) -> int:
        return batches_per_rank(len(self.reader), self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        self._epoch, self._start_batch = int(epoch), 0

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """The samples this rank yields in ``epoch``, in order (without running the pipeline)."""
        order = epoch_order(len(self.reader), shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                            shard_size=self.reader.shard_size, window=self.shuffle_window)
        idx = rank_indices(order, rank=self.rank, world_size=self.world_size,
                           batch_size=self.batch_size, drop_last=self.drop_last)
        return torch.from_numpy(idx)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch, start = self._epoch, self._start_batch
        self._epoch, self._start_batch = epoch + 1, 0
        self._position = [epoch, start]
        if start >= len(self):
            return
        indices = self.epoch_indices(epoch).numpy()
        dali_iter = self._arm(indices, start)
        finished = False
        try:
            for out in dali_iter:
                self._position[1] += 1  # counted once handed over: a state_dict() taken while
                yield self._convert(out[0])  # the batch is trained on resumes after it
            finished = True
            self._position = None
        finally:
            if not finished:
                self._teardown()  # batches already read ahead belong to the abandoned epoch
            self._clean = finished

    def _arm(self, indices: Any, start: int) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        if self._pipe is None or not self._clean:
            self._teardown()
            device_id = self.device.index if self.device.type == "cuda" else None
            if device_id is None and self.device.type == "cuda":
                device_id = torch.cuda.current_device()
            readers = max(1, self.workers // 2)  # measured: more readers than this only contend
            self._source = BatchSource(self.reader, self.batch_size, readers,
                                       ahead=readers + 1, dali_depth=self.prefetch)
            self._pipe = build_pipeline(
                self._source, self.augment, batch_size=self.batch_size, threads=self.workers,
                device_id=device_id, prefetch=self.prefetch, seed=self._dali_seed(),
                jpeg=self.reader.is_image_coded)
            self._pipe.build()
            self._source.start(indices, start)
            self._dali_iter = DALIGenericIterator([self._pipe], ["images", "labels", "indices"],
                                                  size=-1, auto_reset=False)
        else:
            assert self._source is not None
            self._source.start(indices, start)
            self._dali_iter.reset()
        return self._dali_iter

    def _dali_seed(self) -> int:
        return (self.seed * 1_000_003 + self.rank * 7919 + 17) % (2**31 - 1)

    def _convert(self, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        images = out["images"]
        if self.dtype == torch.bfloat16:
            images = images.to(torch.bfloat16)
        labels = out["labels"].reshape(-1)
        if self.with_index:
            return images, labels, out["indices"].reshape(-1)
        return images, labels

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands: load it into a new Loader to yield exactly the samples left."""
        epoch, batch = self._position if self._position is not None else (self._epoch, self._start_batch)
        return {"epoch": epoch, "batch": batch, "seed": self.seed, "shuffle": self.shuffle,
                "samples": len(self.reader), "batch_size": self.batch_size,
                "world_size": self.world_size, "rank": self.rank, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "shuffle", "samples", "batch_size", "world_size", "rank", "drop_last"):
            mine = len(self.reader) if key == "samples" else getattr(self, key)
            if state.get(key) != mine:
                raise ConfigError(
                    f"state_dict was saved with {key}={state.get(key)!r}, this Loader has {mine!r}; "
                    "resume with the same store and options")
        self._epoch, self._start_batch = int(state["epoch"]), int(state["batch"])
        self._position = None

    # -- lifetime -------------------------------------------------------------------------------
    def _teardown(self) -> None:
        self._dali_iter = None
        self._pipe = None  # DALI joins its threads when the pipeline goes
        if self._source is not None:
            self._source.close()
            self._source = None
        self._clean = False

    def close(self) -> None:
        """Stop every thread and release every map; the Loader can still be iterated again."""
        self._teardown()
        self.reader.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._teardown()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass
