"""``Loader``: the drop-in for a torch DataLoader over a tilefeed store, built on DALI.

Longer than the other modules on purpose: the class's docstring documents every parameter with
its trade-off (as FFCV's Loader does), and the DataLoader contract, resume state and lifetime
of one object read best in one place. Order, crops, the DALI graph and its pool live apart.
"""

from __future__ import annotations

import hashlib
import operator
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.crops import graph_inputs, window_inputs
from tilefeed.pipeline.device import default_device
from tilefeed.pipeline import pool
from tilefeed.pipeline.augment import IMAGENET_MEAN, IMAGENET_STD, Augment
from tilefeed.pipeline.ledger import Ledger
from tilefeed.pipeline.order import (
    SHUFFLES,
    EpochOrder,
    Segment,
    batches_per_rank,
    epoch_order,
    rank_indices,
    samples_per_rank,
)
from tilefeed.pipeline.reader import StoreReader
from tilefeed.pipeline.feed import Feed, Following
from tilefeed.pipeline.sizes import Schedule, check_size
from tilefeed.pipeline.source import Epoch
from tilefeed.pipeline.stats import Advice, LoaderStats, Recorder
from tilefeed.store.errors import ConfigError, DaliMissingError
from tilefeed.store.host import usable_cores

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)
LAYOUTS = ("NCHW", "NHWC", "channels_last")
# 3: the order became a keyed bijection of positions (pipeline.order), so every seed's batches
# changed and a state saved before cannot say which samples its epoch has left
# 4: the output size may change between epochs: the state carries the size of the epoch in
# progress and any set_size(), without which a resumed epoch could come out at another size
STATE_VERSION = 4
# DataLoader options that mean nothing here: accepted so a swap runs, warned about once.
NO_EFFECT = ("collate_fn", "sampler", "batch_sampler", "worker_init_fn", "generator", "timeout",
             "multiprocessing_context")
_warned: set[str] = set()


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def require_dali() -> None:
    """A one-line error naming the extra to install, before anything else fails without DALI."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        raise DaliMissingError(
            "the Loader runs on NVIDIA DALI, which is not installed: pip install 'tilefeed[cuda12]' "
            "(CUDA 12 drivers, or CPU only) or 'tilefeed[cuda13]' (CUDA 13)") from None


def _int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int (numpy integers included), at least ``minimum``; else a ConfigError."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return number


def _alias(new: str, new_value: Any, old: str, old_value: Any) -> Any:
    if new_value is not None and old_value is not None:
        raise ConfigError(f"give {new} or {old}, not both (they are the same setting)")
    return new_value if new_value is not None else old_value


def _segment(value: Any) -> Segment:
    """A saved stretch of an epoch, checked: a ConfigError rather than a division by zero."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ConfigError("state_dict segment must be [world_size, batch_size, drop_last, batches], "
                          f"got {value!r}")
    world, batch, drop_last, batches = value
    return Segment(_int("state_dict world_size", world, 1), _int("state_dict batch_size", batch, 1),
                   bool(drop_last), _int("state_dict batches", batches, 0))


@dataclass
class _OpenEpoch:
    """The epoch being iterated: where it started and how far this rank has handed over."""

    epoch: int
    size: int  # the output side of every batch of this epoch
    prior: list[Segment]  # earlier stretches of this epoch (other runs, other settings)
    indices: np.ndarray  # this rank's samples in this stretch, in order
    batches: int  # handed over so far in this stretch (counting those before a same-settings resume)
    first: int  # the batch this run started at: what the ledger records begins there


class Loader:
    """Batches of ``(images, labels)`` torch tensors on the training device, epoch after epoch.

    Swaps in for ``torch.utils.data.DataLoader(dataset, batch_size, shuffle=..., num_workers=...,
    pin_memory=..., drop_last=...)``: the same keyword arguments work, ``len()``, ``dataset``,
    ``sampler.set_epoch`` and ``batch_size`` are there, and each ``iter()`` is a new epoch.

    Parameters
    ----------
    store : str, Path or StoreReader
        A tilefeed store. A ``StoreReader`` the caller passes stays the caller's: ``close()``
        does not close it.
    batch_size : int
        Samples per batch on each rank.
    shuffle : bool or {"global", "shard", "none"}, default True
        ``True`` is ``"global"`` (a fresh permutation of all samples each epoch), ``False`` is
        ``"none"`` (store order). ``"shard"`` visits shards in random order and mixes
        ``shuffle_window`` of them at a time: sequential reads (object storage, cold disks) at the
        cost of batches drawn from a few shards.
    seed : int, default 0
        With the epoch number, decides the order and every crop and flip.
    drop_last : bool, default False
        As DataLoader and DistributedSampler: drop the incomplete tail (``True``) or pad the order
        with its own first samples so every rank gets the same number of batches (``False``).
    rank, world_size : int, optional
        Default: from ``torch.distributed`` when initialised, else 0 and 1.
    device : str or torch.device, optional
        Default ``cuda:LOCAL_RANK`` when there is a GPU, else ``cpu``.
    train : bool, default False
        ``True``: random-resized crop (``scale``, ``ratio``, torchvision's rule, drawn from the
        sample), horizontal flip, normalisation. ``False``: deterministic evaluation framing.
    size : int or callable, optional
        Output side. Default: the tile side. In evaluation, a ``size`` other than the tile side
        resizes the tile to ``size / crop_pct`` and centre-crops ``size``, as torchvision's presets.
        A callable ``epoch -> int`` is a schedule (progressive resizing; ``pipeline.sizes.ramp``
        is FFCV's), asked once per epoch: the size is fixed for a whole epoch and reaches the
        graph per sample, so changing it never rebuilds the graph. ``set_size`` overrides it.
    crop_pct : float, default 0.875
        Evaluation centre-crop fraction (224 of 256); 1.0 resizes straight to ``size``.
    dtype : torch.dtype, default torch.float32
        float32, float16, bfloat16 or uint8 (uint8 skips normalisation: pixels as stored).
    layout : {"NCHW", "NHWC", "channels_last"}, default "NCHW"
        ``channels_last``: NCHW shape in ``torch.channels_last`` memory format (a view of DALI's
        HWC output, no transpose): what torch recommends for convolution nets under autocast,
        and the cheapest float output on the CPU. ``NCHW`` is contiguous (DALI transposes);
        ``NHWC`` is the HWC tensor itself.
    with_index : bool, default False
        Yield ``(images, labels, indices)``: the store indices of the batch's samples.
    num_workers : int, optional
        DALI's CPU threads (threads, not processes: nothing is pickled or copied between
        processes); default min(4, cores). Reader threads are half as many. ``workers`` is the
        same setting under its older name.
    prefetch_factor : int, default 2
        DALI's queue depth: batches prepared ahead of the one being trained on. More hides more
        jitter at the cost of device memory. ``prefetch`` is the same setting.
    pin_memory, persistent_workers : bool
        Accepted for the swap; batches already land on the device and threads persist anyway.
    indices : sequence of int, optional
        Load only these samples of the store (a train/validation split of one store); order,
        exactly-once, resume and ``len()`` all hold over the subset.
    ledger : str or Path, optional
        A folder where each rank records which samples it handed over, per epoch, for
        ``tilefeed audit`` (see ``pipeline.ledger``). Call ``state_dict()`` on every rank.
    scale, ratio : tuple of float
        Random-resized-crop area fraction and aspect range (torchvision's defaults).
    mean, std : tuple of float
        Normalisation, in 0..255 pixel units (ImageNet's by default).
    shuffle_window : int, default 4
        Shards mixed at a time under ``shuffle="shard"``.
    storage_options : dict, optional
        For a store in object storage (``"s3://bucket/prefix"``, ``gs://``, ``az://``): settings
        added to the cloud's standard configuration (environment, profiles), such as
        ``{"endpoint": "http://minio:9000", "region": "us-east-1"}``.
    cache_dir : str or Path, optional
        Local folder the bucket's shards are fetched into, ahead of the epoch, in the order it
        reads them; ranks and processes on one node may share it. Default
        ``$TILEFEED_CACHE`` or ``~/.cache/tilefeed``.
    cache_limit : int, optional
        Bytes of shards the cache folder may hold (least recently used go first); default no
        limit. Under ``shuffle="global"`` a limit below the store's size reads tiles by ranged
        requests instead of whole shards; otherwise it must hold ``shuffle_window + 2`` shards.
    fast_idct : bool, default False
        JPEG stores decoded on the CPU: libjpeg-turbo's fast integer IDCT, as FFCV always uses,
        in place of the accurate one. Decoding gets faster (``tilefeed bench parts``); pixels
        move by a few levels (on the bench's q90 tiles: at most 5, 1.0 on average). nvJPEG on
        a GPU is not affected.
    scaled_decode : bool, default True
        JPEG stores cut and resized on the CPU: each tile is decoded at 1/2, 1/4 or 1/8 scale
        (libjpeg-turbo scales in the DCT) when its crop window still spans the output size
        there, so low resolutions decode less (``tilefeed bench loader --sizes``); pixels stay
        above 35 dB PSNR against a full decode resized. False always decodes at full size.
    stats : bool, default True
        Time each stage of every batch for ``stats()`` (measured under 1% of the throughput:
        ``tilefeed bench stats``). False leaves every clock out.
    """

    def __init__(
        self,
        store: str | Path | StoreReader,
        batch_size: int,
        *,
        shuffle: bool | str = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        train: bool = False,
        size: int | Schedule | None = None,
        crop_pct: float = 0.875,
        dtype: torch.dtype = torch.float32,
        layout: str = "NCHW",
        with_index: bool = False,
        num_workers: int | None = None,
        workers: int | None = None,
        prefetch_factor: int | None = None,
        prefetch: int | None = None,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        indices: Any = None,
        ledger: str | Path | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        shuffle_window: int = 4,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | Path | None = None,
        cache_limit: int | None = None,
        fast_idct: bool = False,
        scaled_decode: bool = True,
        stats: bool = True,
        **dataloader_options: Any,
    ) -> None:
        require_dali()
        unknown = set(dataloader_options) - set(NO_EFFECT)
        if unknown:
            raise TypeError(f"Loader() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        for name, value in dataloader_options.items():
            if value not in (None, 0) and name not in _warned:
                _warned.add(name)
                warnings.warn(f"Loader ignores DataLoader's {name}=: order, batching and augmentation "
                              "happen in its DALI graph (see the Loader docstring)", stacklevel=2)
        batch_size = _int("batch_size", batch_size, 1)
        if isinstance(shuffle, bool):
            shuffle = "global" if shuffle else "none"
        if shuffle not in SHUFFLES:
            raise ConfigError(f"shuffle must be True, False or one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(map(str, DTYPES))}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'NCHW', 'NHWC' or 'channels_last', got {layout!r}")
        threads = _alias("num_workers", num_workers, "workers", workers)
        threads = None if threads is None else _int("num_workers", threads, 1)
        depth = _alias("prefetch_factor", prefetch_factor, "prefetch", prefetch)
        depth = _int("prefetch_factor", 2 if depth is None else depth, 1)
        if not 0 < crop_pct <= 1:
            raise ConfigError(f"crop_pct must be in (0, 1], got {crop_pct!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ConfigError(f"ratio must satisfy 0 < min <= max, got {ratio!r}")
        shuffle_window = _int("shuffle_window", shuffle_window, 1)
        if (rank is None) != (world_size is None):
            raise ConfigError("give both rank and world_size, or neither (torch.distributed is used)")
        if rank is None or world_size is None:
            rank, world_size = _distributed_rank()
        rank, world_size = _int("rank", rank, 0), _int("world_size", world_size, 1)
        if rank >= world_size:
            raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        try:
            self.device = torch.device(device) if device is not None else default_device()
        except (RuntimeError, TypeError) as e:  # torch's own words for a string it cannot parse
            raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}") from e
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {self.device} was asked for, but CUDA is not available")
        if self.device.type not in ("cuda", "cpu"):
            raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {self.device}")

        self._owns_reader = not isinstance(store, StoreReader)
        if isinstance(store, StoreReader):
            self.reader = store
        else:
            limit = None if cache_limit is None else _int("cache_limit", cache_limit, 1)
            self.reader = StoreReader(store, storage_options=storage_options, cache_dir=cache_dir,
                                      cache_limit=limit)
        self.reader.stream(random_order=shuffle == "global",
                           window=shuffle_window if shuffle == "shard" else 1)
        self._schedule = self._check_schedule(size)
        self._fixed: int | None = None  # set_size(): every epoch not yet begun, schedule or not
        self.subset = None if indices is None else self._check_subset(indices)
        self.batch_size = batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, _int("seed", seed, 0), bool(drop_last)
        self.rank, self.world_size = rank, world_size
        self.dtype, self.layout, self.with_index = dtype, layout, with_index
        self.workers = threads or min(4, usable_cores())
        self.prefetch = depth
        self.pin_memory, self.persistent_workers = pin_memory, persistent_workers
        self.shuffle_window = shuffle_window
        self.augment = Augment(
            train=bool(train), tile=self.reader.tile, normalize=dtype != torch.uint8,
            half=dtype == torch.float16, channels_first=layout == "NCHW", crop_pct=float(crop_pct),
            scale=tuple(scale), ratio=tuple(ratio), mean=tuple(mean), std=tuple(std),  # type: ignore[arg-type]
            windows=bool(train) or self.reader.padded, fast_idct=bool(fast_idct),
            scaled_decode=bool(scaled_decode),
        )
        # the stored tiles, handed out with no graph, while nothing can ask for another size
        self._direct = (not callable(self._schedule) and self.device.type == "cpu"
                        and self.augment.stored_tiles(self._schedule))
        self.timed = bool(stats)
        self._stats: Recorder | None = None  # made with the graph: it knows the reader threads
        self.ledger = (Ledger(ledger, rank=rank, population=self.subset, samples=len(self.reader))
                       if ledger is not None else None)
        self._epoch = 0
        self._shares: dict[tuple[int, tuple[Segment, ...]], np.ndarray] = {}  # see _share
        self._shares_lock = threading.RLock()
        self._resume: tuple[int, list[Segment]] | None = None  # loaded state not yet iterated
        self._resume_size: int | None = None  # the size a loaded, begun epoch was at
        self._open: _OpenEpoch | None = None
        self._graph: pool.Graph | None = None  # the DALI graph, taken from the pool when made
        self._graph_key: Any = None
        self._dataset: Any = None
        # a bucket store starts fetching the first epoch's shards now, while the graph is built
        # and the caller sets up
        self.reader.will_read(self.next_epoch_indices().numpy())
        try:
            self._take_graph()
        except BaseException:
            if self._owns_reader:
                self.reader.close()  # ends the downloads just started
            raise

    def _check_schedule(self, size: Any) -> int | Schedule:
        """The tile side, a checked size, or a schedule (checked each time it is asked)."""
        if size is None:
            return int(self.reader.tile)
        if callable(size):
            check_size(size(0), "size(0)")  # a schedule that cannot answer fails here, not mid-run
            return size  # type: ignore[no-any-return]
        return check_size(size)

    # -- the output size ----------------------------------------------------------------------
    def size_of(self, epoch: int) -> int:
        """The output side of ``epoch``: the epoch in progress keeps the size it began with (a
        loaded state's too); any other takes ``set_size``'s, else the schedule's."""
        epoch = _int("epoch", epoch, 0)
        if self._open is not None and self._open.epoch == epoch:
            return self._open.size
        return self._starting_size(epoch)

    def _starting_size(self, epoch: int) -> int:
        """The size ``epoch`` takes when it starts (or resumes) now."""
        if self._resume_size is not None and self._resume is not None and self._resume[0] == epoch:
            return self._resume_size
        if self._fixed is not None:
            return self._fixed
        rule: Callable[[int], int] | int = self._schedule
        return check_size(rule(epoch), f"size({epoch})") if callable(rule) else rule

    @property
    def size(self) -> int:
        """The output side of the epoch in progress, or of the next ``iter()``."""
        return self.size_of(self._open.epoch if self._open is not None else self._epoch)

    def set_size(self, size: int | None) -> None:
        """The output side from the next epoch on (an epoch in progress keeps its own): one
        graph serves every size, so nothing is rebuilt. ``None`` returns to the schedule (or
        the size) the Loader was made with. Saved in ``state_dict``."""
        self._fixed = None if size is None else check_size(size)

    def _check_subset(self, indices: Any) -> np.ndarray:
        subset = np.asarray(indices)
        if subset.ndim != 1 or subset.size == 0 or not np.issubdtype(subset.dtype, np.integer):
            raise ConfigError("indices must be a non-empty 1-D sequence of ints")
        subset = subset.astype(np.int64)
        if subset.min() < 0 or subset.max() >= len(self.reader):
            raise ConfigError(f"indices must lie in 0..{len(self.reader) - 1}")
        if len(np.unique(subset)) != len(subset):
            raise ConfigError("indices must not repeat a sample")
        return np.sort(subset)

    @property
    def samples(self) -> int:
        """Samples an epoch covers: the store's, or the subset's."""
        return len(self.reader) if self.subset is None else len(self.subset)

    # -- the DataLoader contract --------------------------------------------------------------
    def __len__(self) -> int:
        return batches_per_rank(self.samples, self.world_size, self.batch_size, self.drop_last)

    @property
    def dataset(self) -> Any:
        """The samples as a map-style Dataset (``TileDataset``, or its ``Subset``): ``len()``
        is the number of samples an epoch covers, as scripts that count processed samples expect."""
        if self._dataset is None:
            from torch.utils.data import Subset

            from tilefeed.pipeline.dataset import TileDataset

            full = TileDataset(self.reader)
            self._dataset = full if self.subset is None else Subset(full, self.subset.tolist())
        return self._dataset

    @property
    def sampler(self) -> EpochSampler:
        """DistributedSampler's face: ``set_epoch`` reaches this Loader."""
        return EpochSampler(self)

    def set_epoch(self, epoch: int) -> None:
        """The number of the next epoch. The epoch a loaded state is in keeps its position; any
        other starts fresh (as DistributedSampler users call it every epoch)."""
        self._epoch = _int("epoch", epoch, 0)
        if self._resume is not None and self._resume[0] != self._epoch:
            self._resume, self._resume_size = None, None

    def _order(self, epoch: int) -> EpochOrder:
        """The epoch's order as a function of position: only its shard order is held."""
        return epoch_order(len(self.reader), shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                           shard_size=self.reader.shard_size, window=self.shuffle_window,
                           subset=self.subset)

    def _share(self, epoch: int, after: tuple[Segment, ...] = ()) -> np.ndarray:
        """This rank's samples of what ``after`` left of ``epoch``, kept for this epoch and its
        neighbours: each is asked for when the Loader is made or iterated and when the next
        epoch is read ahead. Memory in proportion to the share, never to the store."""
        key = (epoch, after)
        with self._shares_lock:  # the feeding thread asks for the next epoch's (see _following)
            share = self._shares.get(key)
            if share is None:
                share = rank_indices(self._order(epoch), rank=self.rank, world_size=self.world_size,
                                     batch_size=self.batch_size, drop_last=self.drop_last, after=after)
                share.flags.writeable = False
                self._shares = {k: v for k, v in self._shares.items()
                                if k[0] in (epoch - 1, epoch, epoch + 1)}
                self._shares[key] = share
            return share

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """The samples this rank yields in a fresh ``epoch``, in order (without running the pipeline)."""
        return torch.from_numpy(self._share(epoch).copy())  # the share is kept: yours to change

    def next_epoch_indices(self) -> torch.Tensor:
        """The samples the next ``iter()`` will yield on this rank, in order: a fresh epoch's, or
        the rest of a loaded state's epoch (without running the pipeline)."""
        plan = self._plan(self._epoch)
        return torch.from_numpy(plan.indices[plan.batches * self.batch_size :].copy())

    def _plan(self, epoch: int) -> _OpenEpoch:
        """This rank's part of ``epoch``, continuing a loaded state when it is in this epoch."""
        resume = self._resume if self._resume is not None and self._resume[0] == epoch else None
        size = self._starting_size(epoch)
        if resume is None:
            return _OpenEpoch(epoch, size, [], self._share(epoch), 0, 0)
        segments = resume[1]
        mine = (self.world_size, self.batch_size, self.drop_last)
        last = segments[-1] if segments else None
        if last is not None and (last.world_size, last.batch_size, last.drop_last) == mine:
            # same settings: continue the very split the saved run was in, batch for batch
            return _OpenEpoch(epoch, size, segments[:-1], self._share(epoch, tuple(segments[:-1])),
                              last.batches, last.batches)
        return _OpenEpoch(epoch, size, segments, self._share(epoch, tuple(segments)), 0, 0)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._epoch
        plan = self._open = self._plan(epoch)
        self._epoch, self._resume, self._resume_size = epoch + 1, None, None
        if plan.batches * self.batch_size < len(plan.indices):
            feed, generation = self._arm(plan, epoch)
            recorder = self._stats
            if recorder is not None:
                recorder.epoch_begins()
            last = False
            while not last:
                began = time.perf_counter()
                tag, out = feed.next(generation)
                if recorder is not None:
                    recorder.handed(tag.timing, time.perf_counter() - began, feed.ready())
                last = tag.last
                plan.batches += 1  # counted once handed over: a state_dict() taken while
                yield self._convert(out)  # the batch is trained on resumes after it
        self._record(complete=True)
        self._open = None

    def windows(self, epoch: int, samples: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per sample: crop window (start, end as float32 [y, x] in tile pixels) inside its
        picture box, and a flip: what the graph cuts and resizes, a function of the sample
        (training windows are the same at every size; evaluation framing follows the size)."""
        return window_inputs(self.reader.boxes, self.augment, self.seed, epoch, samples,
                             self.size_of(epoch))

    def _take_graph(self) -> None:
        """The DALI graph for these settings: built (or taken from the pool) when the Loader is
        made, so a bad configuration fails here and the first step does not pay for it."""
        device_id = self.device.index if self.device.type == "cuda" else None
        if device_id is None and self.device.type == "cuda":
            device_id = torch.cuda.current_device()
        settings = pool.Settings(self.batch_size, self.workers, self.prefetch, device_id)
        self._graph_key = pool.key(self.reader, self.augment, settings, self._direct)
        self._graph = pool.take(self.reader, self.augment, settings, self._direct)
        largest = getattr(self._schedule, "largest", self._schedule)  # ramp(): its max_res
        self._graph.source.reserve = largest if isinstance(largest, int) else 0

    def _arm(self, plan: _OpenEpoch, epoch: int) -> tuple[Feed, int]:
        if self._graph is not None and not self._graph.alive:
            self._release(keep=False)
        if self._direct and plan.size != self.reader.tile:
            # set_size() left the stored tiles: from now on a DALI graph, which serves every size
            self._release()
            self._direct = False
        if self._graph is None:
            self._take_graph()
        assert self._graph is not None
        cast = torch.bfloat16 if self.dtype == torch.bfloat16 else None
        lookahead = self._graph.lookahead
        later = partial(_following, weakref.ref(self), epoch, lookahead)
        # a short epoch may end before the feeding thread got to them: those are worked out now
        short = -(-len(plan.indices) // self.batch_size) - plan.batches <= 2 * lookahead
        following: Following = later() if short else later
        generation = self._graph.arm(self.reader, self._epoch_of(plan), plan.batches, following,
                                     cast, self.timed)
        if self.timed and self._stats is None:
            self._stats = Recorder(self._graph.source.threads, self.reader.stored_nbytes)
        return self._graph.feed, generation

    def stats(self, last: int = 50) -> LoaderStats:
        """Where the time of the last ``last`` batches (at most 1,000) and of the epoch so far
        went, per stage (``pipeline.stats``); the stage that binds, and the one change most
        likely to help."""
        if self._stats is None:
            raise ConfigError("no figures yet: stats() needs Loader(stats=True) and a batch "
                              "handed over")
        window = _int("last", last, 1)
        advice = Advice(workers=self.workers, cores=usable_cores(), jpeg=self.reader.is_image_coded,
                        bucket=self.reader.remote is not None, shuffle=self.shuffle,
                        layout=self.layout, gpu=self.device.type == "cuda")
        remote = self.reader.remote
        return self._stats.report(advice, window, remote.cache.counts if remote is not None else None)

    def _following(self, epoch: int, lookahead: int) -> list[Epoch]:
        """The fresh epochs expected after ``epoch`` (set_epoch or a loaded state may still
        change them: the feed then drops what it prepared), as many as keep ``lookahead``
        batches coming past the epoch's end: one, but for small epochs."""
        following: list[Epoch] = []
        batches = 0
        while batches < lookahead and len(following) < 16:
            plan = self._plan(epoch + 1 + len(following))
            if plan.batches:  # a loaded state's epoch: resumed when it is reached, not before
                break
            if self._direct and plan.size != self.reader.tile:  # needs a graph: armed when reached
                break
            following.append(self._epoch_of(plan))
            batches += -(-len(plan.indices) // self.batch_size)
        return following

    def _epoch_of(self, plan: _OpenEpoch) -> Epoch:
        # the extras are a plain function of the settings, not a bound method: the graph, which
        # may outlive this Loader in the pool, must not keep it alive (or form a cycle with it)
        extras = partial(graph_inputs, self.reader.boxes, self.augment, self.seed, plan.epoch, plan.size)
        return Epoch(plan.epoch, plan.indices, extras, plan.size)

    def _convert(self, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        images = out["images"]  # already bfloat16 where asked: cast by the feed, off this thread
        if self.layout == "channels_last":  # HWC from DALI, seen as NCHW: no copy, no transpose
            images = images.permute(0, 3, 1, 2)
        labels = out["labels"].reshape(-1)
        if self.with_index:
            return images, labels, out["indices"].reshape(-1)
        return images, labels

    # -- resume ---------------------------------------------------------------------------------
    def _subset_digest(self) -> str | None:
        if self.subset is None:
            return None
        return hashlib.sha256(self.subset.tobytes()).hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands, over all ranks: a small JSON-able dict for a checkpoint.

        Load it into a new Loader (any world size or batch size) to deliver exactly the samples
        of the epoch not yet delivered by any rank. With a ledger, also records what this rank
        handed over so far: call it on every rank.
        """
        if self._open is not None:
            epoch = self._open.epoch
            segments = [*self._open.prior,
                        Segment(self.world_size, self.batch_size, self.drop_last, self._open.batches)]
            self._record(complete=False)
        elif self._resume is not None:
            epoch, segments = self._resume
        else:
            epoch, segments = self._epoch, []
        return {"version": STATE_VERSION, "epoch": epoch, "segments": [s.to_list() for s in segments],
                "size": self.size_of(epoch), "set_size": self._fixed,
                "seed": self.seed, "shuffle": self.shuffle, "samples": len(self.reader),
                "subset": self._subset_digest(), "batch": segments[-1].batches if segments else 0,
                "world_size": self.world_size, "batch_size": self.batch_size, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` (or a ``set_epoch`` of the same epoch,
        then ``iter()``) delivers the rest of that epoch, split over this Loader's ranks."""
        version = state.get("version")
        if version != STATE_VERSION:
            # another version orders the epoch otherwise: its count of delivered batches would
            # name other samples here, and exactly-once would silently break
            raise ConfigError(
                f"state_dict is version {version!r}, this Loader reads version {STATE_VERSION} (their "
                "epoch orders differ); start the epoch afresh (set_epoch without load_state_dict) or "
                "resume with the tilefeed that saved it")
        mine = {"seed": self.seed, "shuffle": self.shuffle, "samples": len(self.reader),
                "subset": self._subset_digest()}
        for key, value in mine.items():
            if state.get(key) != value:
                raise ConfigError(
                    f"state_dict was saved with {key}={state.get(key)!r}, this Loader has {value!r}; "
                    "resume with the same store, seed, shuffle and indices (world size and batch "
                    "size may differ)")
        segments = [_segment(s) for s in state.get("segments", [])]
        size = check_size(state.get("size"), "state_dict size")
        fixed = state.get("set_size")
        self._fixed = None if fixed is None else check_size(fixed, "state_dict set_size")
        self._epoch = _int("state_dict epoch", state.get("epoch"), 0)
        self._resume = (self._epoch, [s for s in segments if s.batches > 0])
        # an epoch begun goes on at the size it began with, whatever the schedule says now
        self._resume_size = size if self._resume[1] else None
        self._open = None

    def _record(self, *, complete: bool) -> None:
        plan = self._open
        if self.ledger is None or plan is None:
            return
        handed = plan.indices[plan.first * self.batch_size : plan.batches * self.batch_size]
        self.ledger.record(plan.epoch, handed, world_size=self.world_size,
                           batch_size=self.batch_size, drop_last=self.drop_last, complete=complete)

    # -- lifetime -------------------------------------------------------------------------------
    def _release(self, keep: bool = True) -> None:
        """Hand the DALI graph back to the pool (``keep``) or close it; its threads go either way
        but DALI's own, which stay parked with an idle graph (see ``pipeline.pool``)."""
        graph, self._graph = self._graph, None
        if graph is not None:
            if keep:
                pool.give(self._graph_key, graph)
            else:
                graph.close()

    def close(self) -> None:
        """Stop every reader thread and release every map (of a store this Loader opened itself);
        the Loader can still be iterated again."""
        self._release()
        if self._owns_reader:
            self.reader.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass


def _following(loader: weakref.ref[Loader], epoch: int, lookahead: int) -> list[Epoch]:
    """``Loader._following``, asked for on the feeding thread: the graph, which may outlive the
    Loader in the pool, holds it only weakly."""
    alive = loader()
    return alive._following(epoch, lookahead) if alive is not None else []


class EpochSampler:
    """What ``loader.sampler`` is: scripts call ``sampler.set_epoch(epoch)`` on it each epoch."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return samples_per_rank(self.loader.samples, self.loader.world_size, self.loader.batch_size,
                                self.loader.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self.loader.epoch_indices(self.loader._epoch).tolist())
