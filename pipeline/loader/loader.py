"""``Loader``: the drop-in for a torch DataLoader over a tilefeed store, built on DALI.

The class's docstring documents every parameter with its trade-off (as FFCV's Loader does). The
options are checked in ``pipeline.settings``, where the epochs stand is ``loader.epochs``'s
``EpochState``, the resume state is written and read in ``loader.resume``, a batch's boxes and
masks and the store's targets checked in ``loader.targets``; the order, crops, the graph and its
pool live in their own rooms.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilefeed.pipeline.engine import graph_pool as pool
from tilefeed.pipeline.engine.graph import Graph, GraphSettings
from tilefeed.pipeline.loader.assembly import advice, augment
from tilefeed.pipeline.loader.dataloader_face import EpochBatchSampler, EpochSampler, dataset_of
from tilefeed.pipeline.engine.crops import window_inputs
from tilefeed.pipeline.engine.operations import graph_inputs
from tilefeed.pipeline.recipe.batch_ops import BatchOps
from tilefeed.pipeline.loader.targets import (TARGETS, BatchTargets, check_store_targets, source_boxes,
                                              store_objects)
from tilefeed.pipeline.recipe.recipe import Recipe
from tilefeed.pipeline.loader.epochs import EpochState, OpenEpoch, Shares
from tilefeed.pipeline.engine.feed import Feed, Following
from tilefeed.pipeline.audit.ledger import Ledger
from tilefeed.pipeline.mixing.mix import Mix, Sources, open_sources
from tilefeed.pipeline.loader.pairs import FIELDS, TEXTS, BatchPairs, PairColumns, Tokenizer, gather_columns
from tilefeed.pipeline.reading.mixed import MixedReader
from tilefeed.pipeline.options import (DATALOADER_ONLY, IMAGENET_MEAN, IMAGENET_STD, Layout, Shuffle,
                                      TargetsLayout)
from tilefeed.pipeline.settings import LoaderSettings, check_alone, check_int, read_back, require_dali
from tilefeed.pipeline.planning.order import batches_per_rank
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.pipeline.loader.resume import identity, load, saved
from tilefeed.pipeline.planning.sizes import Schedule
from tilefeed.pipeline.engine.batch_source import Epoch
from tilefeed.pipeline.device import dali_device_id, device_graph
from tilefeed.pipeline.stats import LoaderStats, Recorder
from tilefeed.store.errors import ConfigError


@read_back
class Loader:
    """Batches of ``(images, labels)`` torch tensors on the training device, epoch after epoch.

    Swaps in for ``torch.utils.data.DataLoader(dataset, batch_size, shuffle=..., num_workers=...,
    pin_memory=..., drop_last=...)``: the same keyword arguments work, ``len()``, ``dataset``,
    ``sampler`` and ``batch_sampler`` (each with ``set_epoch``), ``batch_size``, ``drop_last``,
    ``num_workers`` and ``prefetch_factor`` are there, and each ``iter()`` is a new epoch.
    ``collate_fn``, ``worker_init_fn``, ``generator``, ``timeout`` and
    ``multiprocessing_context`` are absent: reading one is an ``AttributeError`` saying why.

    Parameters
    ----------
    store : str, Path, StoreReader or Mix
        A tilefeed store. A ``StoreReader`` the caller passes stays the caller's: ``close()``
        does not close it. A ``Mix`` (``tilefeed.Mix``) reads several stores by weight.
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
        Default: from ``torch.distributed`` when initialised, else 0 and 1. A Loader built with
        neither and no process group refuses to be iterated once a group of several processes
        exists (or a launcher's ``WORLD_SIZE`` says several): build it after
        ``init_process_group()``/``Accelerator()``, or pass both.
    device : str or torch.device, optional
        Default ``cuda:LOCAL_RANK`` when there is a GPU, else ``cpu``.
    train : bool, default False
        ``True``: random-resized crop (``scale``, ``ratio``, torchvision's rule, drawn from the
        sample), horizontal flip, normalisation. ``False``: deterministic evaluation framing.
    size : int or callable, optional
        Output side. Default: the tile side. In evaluation, a ``size`` other than the tile side
        resizes the tile to ``size / crop_pct`` and centre-crops ``size``, as torchvision's presets.
        A callable ``epoch -> int`` is a schedule (progressive resizing; ``tilefeed.ramp``
        is FFCV's), asked once per epoch: the size is fixed for a whole epoch and reaches the
        graph per sample, so changing it never rebuilds the graph. ``set_size`` overrides it.
    crop_pct : float, optional
        Evaluation centre-crop fraction (224 of 256); 1.0 resizes straight to ``size``. Default
        0.875, and 1.0 with ``targets`` (detection evaluates the whole picture).
    dtype : torch.dtype, default torch.float32
        float32, float16, bfloat16 or uint8 (uint8 skips normalisation: pixels as stored).
    layout : {"NCHW", "NHWC", "channels_last"}, default "NCHW"
        ``channels_last``: NCHW shape in ``torch.channels_last`` memory format (a view of DALI's
        HWC output, no transpose): what torch recommends for convolution nets under autocast,
        and the cheapest float output on the CPU. ``NCHW`` is contiguous (DALI transposes);
        ``NHWC`` is the HWC tensor itself.
    with_index : bool, default False
        Yield ``(images, labels, indices)``: the store indices of the batch's samples (of a
        ``Mix``: ids that ``source_of`` names).
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
        Only these samples of the store; order, exactly-once, resume and ``len()`` hold over them.
    ledger : str or Path, optional
        A folder where each rank records which samples it handed over, per epoch, for
        ``tilefeed audit`` (see ``pipeline.audit.ledger``). Call ``state_dict()`` on every rank.
    scale, ratio : tuple of float
        Random-resized-crop area fraction and aspect range (torchvision's defaults).
    mean, std : tuple of float
        Normalisation, ImageNet's by default, in either unit the scripts use: every ``std`` value
        <= 1 is read as 0..1 units (timm's ``data_config``, torchvision's ``Normalize``: mean in
        [0, 1], both scaled by 255); every ``std`` value > 1 as 0..255 pixel units (mean in
        [0, 255], all zero or some value > 1). Anything else (std on both sides of 1, a 0..1 mean
        beside a 0..255 std, negative or zero values, not 3 values) is a ``ConfigError`` naming
        the rule. Kept and applied in 0..255 units (``settings.mean``); the resume state and its
        identity hold neither.
    shuffle_window : int, default 4
        Shards mixed at a time under ``shuffle="shard"``.
    storage_options : dict, optional
        For a store in object storage (``"s3://bucket/prefix"``, ``gs://``, ``az://``): settings
        added to the cloud's standard configuration (environment, profiles), such as
        ``{"endpoint": "http://minio:9000", "region": "us-east-1"}``.
    cache_dir : str or Path, optional
        Local folder the bucket's shards are fetched into, ahead of the epoch, in the order it
        reads them; shared by a node's ranks. Default ``$TILEFEED_CACHE`` or ``~/.cache/tilefeed``.
    cache_limit : int, optional
        Bytes of shards the cache folder may hold at any moment (least recently used go first);
        default no limit. Under ``shuffle="global"`` a limit below the store's size reads tiles by
        ranged requests instead of whole shards; otherwise it must hold ``shuffle_window + 1``
        shards (one shard read and the next under ``shuffle=False``; a smaller one is refused,
        naming the least that works), and the read-ahead shrinks to the shards it holds beyond.
    fast_idct : bool, default False
        JPEG stores decoded on the CPU: libjpeg-turbo's fast integer IDCT (as FFCV), faster
        (``tilefeed bench parts``), pixels a few levels off; nvJPEG on a GPU is not affected.
    scaled_decode : bool, default True
        JPEG stores cut and resized on the CPU: a tile is decoded at 1/2, 1/4 or 1/8 scale (in
        the DCT) when its crop window still spans the output size there, so low resolutions
        decode less (``tilefeed bench loader --sizes``). False always decodes at full size.
    stats : bool, default True
        Time each stage of every batch for ``stats()`` (``tilefeed bench stats``); False: no clocks.
    targets : str or sequence of str, optional
        What a batch holds besides its images, from a store made with targets (``tilefeed
        preprocess --annotations``, ``--yolo`` or ``--masks``): ``"boxes"`` (each image's boxes,
        category ids and crowd flags), ``"masks"`` (a semantic store's class-id masks), or both
        (an instance store's per-object masks with their boxes). They follow each sample's crop,
        resize and flips (``pipeline.targets``: torchvision v2's geometry, boxes clamped and
        sanitised as ``ClampBoundingBoxes`` + ``SanitizeBoundingBoxes``, masks by nearest
        sampling) and take the labels' place in the batch, on the images' device (a GPU Loader
        makes the masks there, on its side stream). In evaluation the whole tile is
        framed (the letterbox as stored), and ``boxes_to_source`` maps boxes back to the source
        image. Of a ``Mix``, each sample's from its own store (``Mix(background=)`` names the
        stores without targets whose images hold no objects). Part of the resume state's identity.
    targets_layout : {"dicts", "padded"}, default "dicts"
        ``"dicts"``: torchvision's detection targets, a list of per-image dicts (``boxes`` float32
        XYXY, ``labels``, ``iscrowd``, ``masks``). ``"padded"``: one dict of padded tensors with
        ``counts`` (labels -1 past each count), for fixed shapes.
    max_objects : int, optional
        The padded layout's slots per image; default the batch's largest count. An image with
        more is an error, never cut.
    text : str, list of str or dict of str to float, optional
        From an image-text store (``tilefeed preprocess`` of WebDataset shards, parquet or a
        caption table): each batch carries its samples' captions, a list of str, right after
        the images: ``images, texts = batch`` as open_clip unpacks it. A list of caption names
        takes each sample's first that is not empty (open_clip's ``--json-text-key a;b``). A
        dict of names to weights puts each sample's names in a weighted random order, drawn
        from (seed, epoch, position) alone, and takes the first that is not empty; a weight of
        0 is a fallback after the others (open_clip's ``--json-text-key-probs``). Part of the
        resume state's identity.
    tokenizer : callable, optional
        With ``text``: called with each batch's list of captions on a reader thread, never on
        the training loop's (``open_clip.get_tokenizer(name)``, a Hugging Face tokenizer's
        call returning a tensor); the batch then carries its result, a ``(B, L)`` tensor, in
        the captions' place. Texts, tokens and fields stay on the host.
    fields : str or sequence of str, optional
        Metadata fields the store holds (``tilefeed preprocess --fields``): each batch appends
        a dict of field name to a tensor (numbers) or a list of str, after the texts and labels.
    labels : bool, optional
        Whether a batch carries class labels. Default: yes, unless ``text`` is given or the
        store holds no class labels; True on a store without them is an error.
    where : str or callable, optional
        Read only the samples whose metadata fields pass this test, decided once when the
        Loader opens, before anything is decoded: an expression (``"width >= 256 and uid in
        file('subset.txt')"``: comparisons of fields with values, ``in`` a list or a file of
        ids one a line, ``and``, ``or``, ``not``) or a callable given a dict of field arrays
        (one value a sample) returning a boolean array. The samples that pass are the store's
        subset (of each store, in a ``Mix``), as ``indices`` makes one: ``len()`` counts them,
        and order, sharding, the ledger and resume hold over them (a state saved under another
        filter is refused).
    recipe : Recipe, optional
        A training recipe (``tilefeed.Recipe``): the resize filter, horizontal and vertical
        flip probabilities, auto-augment policy, colour jitter, random grayscale and random
        erasing, with torchvision v2's and timm's meanings, each drawn per sample from the seed
        as the crops are; and mixup/cutmix per batch, drawn from the batch's position in the
        epoch (a batch then yields float32 soft targets in place of its labels). Evaluation
        takes only its filter. Default: bilinear, horizontal flip at 0.5, nothing else (the
        crops and flips are then those of a recipe ``Recipe()`` too). Part of the resume
        state's identity.
    """

    # options read back from the settings (``settings.read_back``): read-only, typed as the table types them
    batch_size: int
    shuffle: Shuffle
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    device: torch.device
    dtype: torch.dtype
    layout: Layout
    with_index: bool
    workers: int
    prefetch: int
    shuffle_window: int
    pin_memory: bool
    persistent_workers: bool
    recipe: Recipe | None

    def __init__(  # one keyword a line: DataLoader's options, then tilefeed's
        self,
        store: str | Path | StoreReader | Mix,
        batch_size: int,
        *,
        shuffle: bool | Shuffle | str = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        train: bool = False,
        size: int | Schedule | None = None,
        crop_pct: float | None = None,
        dtype: torch.dtype = torch.float32,
        layout: Layout | str = "NCHW",
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
        recipe: Recipe | None = None,
        targets: str | Iterable[str] | None = None,
        targets_layout: TargetsLayout | str = "dicts",
        max_objects: int | None = None,
        text: str | Sequence[str] | Mapping[str, float] | None = None,
        tokenizer: Callable[[list[str]], Any] | None = None,
        fields: str | Sequence[str] | None = None,
        labels: bool | None = None,
        where: str | Callable[[Mapping[str, np.ndarray]], Any] | None = None,
        **dataloader_options: Any,
    ) -> None:
        # every option as given, by name: the settings check them (their one table). First, while
        # locals() holds the parameters alone (no super() here: it would add __class__)
        given = {name: value for name, value in locals().items()
                 if name not in ("self", "store", "dataloader_options")}
        require_dali()
        self._mixing_off = False  # mixup_enabled = False: timm's --mixup-off-epoch
        s = self.settings = LoaderSettings.check(given, dataloader_options)
        self._owns_reader = not isinstance(store, StoreReader)
        # one store is a mixture of one under the identity plan: one contract, no special case
        self.sources: Sources = open_sources(store, s)
        self.reader = self.sources.reader
        try:
            self._assemble(s)
        except BaseException:
            if self._owns_reader:
                self.reader.close()  # ends the downloads just started
            raise

    def _assemble(self, s: LoaderSettings) -> None:
        """Everything on the open store: order, crops, ledger, the first reads, the graph."""
        schedule: int | Schedule = int(self.reader.tile) if s.size is None else s.size
        self.augment = augment(s, self.reader.tile, self.reader.padded)
        self._pairs = self._pair_columns(s)
        if s.targets:
            check_store_targets(self.reader, s.targets)
        _ = self._store_objects  # a crop="iou" without boxes fails here, not at the first batch
        # the stored tiles, handed out with no graph, while nothing can ask for another size
        self._device_graph = self.device.type == "cpu" and device_graph()
        self._direct = (not callable(schedule) and self.device.type == "cpu" and not self._device_graph
                        and self.augment.stored_tiles(schedule))
        self.timed = s.stats
        self._stats: Recorder | None = None  # made with the graph: it knows the reader threads
        self.epochs = EpochState(Shares(s, self.reader.shard_size, self.sources), schedule)
        self.ledger = (Ledger(s.ledger, rank=s.rank, population=self.subset, samples=self.sources.positions,
                              sources=self.sources.describe())
                       if s.ledger is not None else None)
        self._graph: Graph | None = None  # the DALI graph, taken from the pool when made
        self._graph_key: Any = None
        # a bucket store starts fetching the first epoch's shards now, while the graph is built
        self.reader.will_read(self.next_epoch_indices().numpy())
        self._take_graph()

    def _pair_columns(self, s: LoaderSettings) -> PairColumns | None:
        """The captions and fields of every sample read (None: none asked); settles whether
        batches carry class labels (``labels``)."""
        reader = self.reader
        stores = (list(zip(reader.names, reader.sources, strict=True)) if isinstance(reader, MixedReader)
                  else [(reader.location, reader)])
        labelled = all(r.meta.labelled for _, r in stores)
        self.labels = s.labels if s.labels is not None else s.text is None and (labelled or bool(s.targets))
        self._tokenizer = None if s.tokenizer is None else Tokenizer(s.tokenizer)
        if s.text is None and not s.fields and not (s.labels and not labelled):
            return None
        return gather_columns(stores, s.text, s.fields, bool(s.labels))

    @cached_property
    def _store_objects(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The store's object offsets and rows, which a recipe's ``crop="iou"`` or ``"zoom_iou"``
        draws against (None: no such crop). A store without boxes, or a mixture, is refused for it here."""
        return store_objects(self.reader, self.recipe, self.settings.train)

    # -- the output size ----------------------------------------------------------------------
    def size_of(self, epoch: int) -> int:
        """The output side of ``epoch``: the epoch in progress keeps the size it began with (a
        loaded state's too); any other takes ``set_size``'s, else the schedule's."""
        return self.epochs.size_of(check_int("epoch", epoch, 0))

    @property
    def size(self) -> int:
        """The output side of the epoch in progress, or of the next ``iter()``."""
        return self.epochs.size_of(self.epochs.current)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` begins (``set_epoch``'s, or the one after the last begun)."""
        return self.epochs.next

    def set_size(self, size: int | None) -> None:
        """The output side from the next epoch on (an epoch in progress keeps its own): one
        graph serves every size, so nothing is rebuilt. ``None`` returns to the schedule (or
        the size) the Loader was made with. Saved in ``state_dict``."""
        self.epochs.set_size(size)

    @property
    def samples(self) -> int:
        """Samples an epoch covers: the store's, the subset's, or a mixture's epoch_samples."""
        return self.sources.per_epoch

    @property
    def subset(self) -> np.ndarray | None:
        """The store's samples the Loader reads (``indices``, sorted); None: all of them."""
        return self.sources.subset

    def source_of(self, ids: Any) -> tuple[list[str], np.ndarray]:
        """The store names (one store: its location) and sample indices of ``with_index`` ids."""
        return self.sources.source_of(ids)

    # -- the DataLoader contract --------------------------------------------------------------
    @cached_property
    def dataset(self) -> Any:
        """The samples as a map-style Dataset: ``len()`` is the number of samples an epoch
        covers, as scripts that count processed samples expect; its items are refused in one
        line (they would be raw stored tiles: ``dataloader_face.LoaderDataset``)."""
        return dataset_of(self.reader, self.subset)

    @cached_property
    def sampler(self) -> EpochSampler:
        """DistributedSampler's face: ``set_epoch`` reaches this Loader. One object per Loader,
        so hooks that call ``set_epoch`` once per distinct sampler call it once."""
        return EpochSampler(self)

    @cached_property
    def batch_sampler(self) -> EpochBatchSampler:
        """BatchSampler's face: ``sampler``, ``batch_size``, ``drop_last``, ``len()`` (batches of
        this rank), the epoch's batches of sample indices, and ``set_epoch``, which reaches this
        Loader (timm's ``train.py`` sets epochs through it)."""
        return EpochBatchSampler(self)

    @property
    def num_workers(self) -> int:
        """DataLoader's name for ``workers``: DALI's CPU threads."""
        return self.workers

    @property
    def prefetch_factor(self) -> int:
        """DataLoader's name for ``prefetch``: batches prepared ahead."""
        return self.prefetch

    @property
    def mixup_enabled(self) -> bool:
        """The recipe's mixup/cutmix is applied to the batches of the iterations started from now
        on (timm's prefetcher's attribute: its ``train.py`` sets it False from
        ``--mixup-off-epoch`` on, at the start of an epoch; an iteration under way keeps the
        setting it began with). False without one. Not part of the resume state: a script
        sets it again, from the epoch, when it resumes."""
        return self.recipe is not None and self.recipe.batch_mix is not None and not self._mixing_off

    @mixup_enabled.setter
    def mixup_enabled(self, enabled: bool) -> None:
        if enabled and (self.recipe is None or self.recipe.batch_mix is None):
            raise ConfigError("mixup_enabled=True needs a recipe with mixup or cutmix (Recipe(batch_mix=...))")
        self._mixing_off = not enabled

    def __getattr__(self, name: str) -> Any:
        # only names found nowhere else arrive here: DataLoader's that mean nothing to a Loader
        # fail in one line saying why, the rest as Python's own AttributeError
        face = getattr(type(self), name, None)
        if isinstance(face, (property, cached_property)):
            # a property of ours raised an AttributeError (a ConfigAttributeError: ``dataset``
            # over a Mix) and Python came here instead, dropping its message: asked again, it
            # raises that error itself, so the caller reads why
            return face.__get__(self, type(self))
        if name in DATALOADER_ONLY:  # sampler and batch_sampler are faces: they never come here
            raise AttributeError(f"'Loader' has no {name}: {DATALOADER_ONLY[name]}")
        raise AttributeError(f"'Loader' object has no attribute {name!r}")

    def __len__(self) -> int:
        return batches_per_rank(self.samples, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """The number of the next epoch. The epoch a loaded state is in keeps its position; any
        other starts fresh (as DistributedSampler users call it every epoch)."""
        self.epochs.set_epoch(check_int("epoch", epoch, 0))

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """The samples this rank yields in a fresh ``epoch``, in order (without running the pipeline)."""
        return torch.from_numpy(self.epochs.shares.get(epoch).copy())  # the share is kept: yours to change

    def epoch_positions(self, epoch: int) -> torch.Tensor:
        """What ``windows`` takes for a fresh ``epoch``'s samples: the positions behind
        ``epoch_indices`` (of one store, the samples themselves)."""
        return torch.from_numpy(self.epochs.shares.positions_of(epoch).copy())

    def next_epoch_indices(self) -> torch.Tensor:
        """The samples the next ``iter()`` will yield on this rank, in order: a fresh epoch's, or
        the rest of a loaded state's epoch (without running the pipeline)."""
        return torch.from_numpy(self.epochs.next_indices().copy())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self.settings.alone:
            check_alone(self.rank, self.world_size)
        plan = self.epochs.begin()
        if plan.batches * self.batch_size < len(plan.indices):
            feed, generation = self._arm(plan, plan.epoch)
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
        self.epochs.end()

    def windows(self, epoch: int, samples: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per sample: crop window (start, end as float32 [y, x] in tile pixels) inside its
        picture box, and a flip: what the graph cuts and resizes, a function of the sample
        (training windows are the same at every size; evaluation framing follows the size).
        Crops are drawn from positions: ``samples`` are those (``epoch_positions``; of one store,
        the samples themselves)."""
        positions = np.asarray(samples, dtype=np.int64)
        located = self.sources.locate(epoch, positions)
        a, boxes, size, objects = self.augment, self.reader.boxes, self.size_of(epoch), self._store_objects
        if a.windows:  # what the graph is sent (a recipe's hflip other than 0.5 draws its own flip)
            sent = graph_inputs(boxes, a, self.seed, epoch, size, located, positions, objects)
            return sent["start"], sent["end"], sent["flip"]
        return window_inputs(boxes, a, self.seed, epoch, located, positions, size, objects)

    def boxes_to_source(self, boxes: Sequence[Any], indices: Any, epoch: int | None = None) -> list[np.ndarray]:
        """Boxes on a batch's images (XYXY, output pixels: a detection model's predictions) in
        the pixels of each sample's source image, for scoring against the source's annotations.

        Parameters
        ----------
        boxes : sequence of array-like
            Per sample of the batch, (k, 4) boxes (numpy arrays or tensors, on any device).
        indices : array-like
            The batch's store indices (``with_index=True``).
        epoch : int, optional
            The epoch the batch came from; default the epoch in progress (evaluation framing is
            the same in every epoch; training crops are the epoch's).

        Returns
        -------
        list of numpy.ndarray
            Per sample, (k, 4) float64 XYXY in source-image pixels.
        """
        epoch = self.epochs.current if epoch is None else check_int("epoch", epoch, 0)
        return source_boxes(self.reader, self.augment, self.sources.ids_name_positions, self.seed, epoch,
                            self.size_of(epoch), boxes, indices, self._store_objects)

    def _take_graph(self) -> None:
        """The DALI graph for these settings: built (or taken from the pool) when the Loader is
        made, so a bad configuration fails here and the first step does not pay for it."""
        settings = GraphSettings(self.batch_size, self.workers, self.prefetch,
                                      dali_device_id(self.device), self._device_graph)
        self._graph_key = pool.key(self.reader, self.augment, settings, self._direct)
        self._graph = pool.take(self.reader, self.augment, settings, self._direct)
        self._graph.source.reserve = self.epochs.largest

    def _arm(self, plan: OpenEpoch, epoch: int) -> tuple[Feed, int]:
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
        """Where the time of the last ``last`` batches (at most 1,000) and of the epoch went, per
        stage (``pipeline.stats``); the stage that binds, and the change most likely to help."""
        if self._stats is None:
            raise ConfigError("no figures yet: stats() needs Loader(stats=True) and a batch handed over")
        window = check_int("last", last, 1)
        remote = self.reader.remote
        report = self._stats.report(advice(self.settings, self.reader), window,
                                    remote.cache.counts if remote is not None else None)
        if self.settings.where is None:
            return report
        return replace(report, selected=(self.sources.selected, len(self.reader)))

    def _following(self, epoch: int, lookahead: int) -> list[Epoch]:
        """The fresh epochs expected after ``epoch`` (set_epoch or a loaded state may still
        change them: the feed then drops what it prepared), as many as keep ``lookahead``
        batches coming past the epoch's end: one, but for small epochs."""
        following: list[Epoch] = []
        batches = 0
        while batches < lookahead and len(following) < 16:
            plan = self.epochs.plan(epoch + 1 + len(following))
            if plan.batches:  # a loaded state's epoch: resumed when it is reached, not before
                break
            if self._direct and plan.size != self.reader.tile:  # needs a graph: armed when reached
                break
            following.append(self._epoch_of(plan))
            batches += -(-len(plan.indices) // self.batch_size)
        return following

    def _epoch_of(self, plan: OpenEpoch) -> Epoch:
        # the extras are a plain function of the settings, not a bound method: the graph, which
        # may outlive this Loader in the pool, must not keep it alive (or form a cycle with it)
        extras = partial(graph_inputs, self.reader.boxes, self.augment, self.seed, plan.epoch, plan.size,
                         objects=self._store_objects)
        per_batch = tuple(op for op in (self._batch_ops(plan), self._batch_targets(plan)) if op is not None)
        s = self.settings
        carry = (None if self._pairs is None
                 else BatchPairs(self._pairs, s.text, self._tokenizer, self.seed, plan.epoch))
        return Epoch(plan.epoch, plan.indices, plan.positions, extras, plan.size,
                     self.sources.epoch_labels(plan.indices), per_batch, carry)

    def _batch_targets(self, plan: OpenEpoch) -> BatchTargets | None:
        """The boxes and masks of ``plan``'s batches (None: none asked), made as each batch is
        handed over from the same draws as its crops (``loader.targets``)."""
        s = self.settings
        if not s.targets:
            return None
        return BatchTargets(s.targets, s.targets_layout, self.augment, self.seed, plan.epoch, plan.size,
                            self.batch_size, max_objects=s.max_objects, reader=self.reader,
                            positions=plan.positions)

    def _batch_ops(self, plan: OpenEpoch) -> BatchOps | None:
        """The recipe's per-batch operations for ``plan``'s stretch (None: it has none, or this
        is evaluation): random erasing of each sample, keyed as the crops are (the sample, or a
        mixture's position), then mixup/cutmix keyed by the batch's global position in the
        epoch (``batch_mix``'s rule for resume). The feed applies them as it hands a batch over."""
        recipe = self.recipe
        if recipe is None or not recipe.per_batch or not self.settings.train:
            return None
        # in place: the handed-over batch is fresh and the caller's
        erasing = None if recipe.erasing is None else replace(recipe.erasing, inplace=True)
        batch_mix = recipe.batch_mix if self.mixup_enabled else None  # mixup/cutmix, not the mixing of stores
        if erasing is None and batch_mix is None:
            return None
        return BatchOps(erasing, batch_mix, self.seed, plan.epoch, self.batch_size, self.rank, self.world_size,
                        before=sum(s.world_size * s.batches for s in plan.prior),
                        layout=self.layout.memory, positions=plan.positions)

    def _convert(self, out: dict[str, Any]) -> tuple[Any, ...]:
        images = out["images"]  # cast, erased and mixed by the feed, off this thread
        if self.layout is Layout.CHANNELS_LAST:  # HWC from DALI, seen as NCHW: no copy, no transpose
            images = images.permute(0, 3, 1, 2)
        batch: list[Any] = [images]
        if TEXTS in out:  # open_clip's order: images, texts
            batch.append(out[TEXTS])
        if self.labels:
            labels = out.get(TARGETS)  # boxes and masks, where asked, in place of the image labels
            if labels is None:
                labels = out["labels"]
                if not labels.is_floating_point():  # class indices, one a sample (mixing gives soft targets)
                    labels = labels.reshape(-1)
            batch.append(labels)
        if FIELDS in out:
            batch.append(out[FIELDS])
        if self.with_index:
            batch.append(out["indices"].reshape(-1))
        return tuple(batch)

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands, over all ranks: a small JSON-able dict for a checkpoint.
        Loaded into a new Loader (any world size or batch size), it delivers exactly what no rank
        delivered yet. With a ledger, records what this rank handed over: call it on every rank."""
        epoch, segments = self.epochs.progress()
        self._record(complete=False)  # records only while an epoch is being iterated
        return saved(self.settings, self._identity, epoch, segments, self.epochs.size_of(epoch),
                     self.epochs.fixed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` (or a ``set_epoch`` of the same epoch,
        then ``iter()``) delivers the rest of that epoch, split over this Loader's ranks."""
        self.epochs.load(load(state, self._identity))

    @cached_property
    def _identity(self) -> dict[str, Any]:  # fixed once the Loader is made: subsets hashed once
        return identity(self.settings, self.sources)

    def _record(self, *, complete: bool) -> None:
        plan = self.epochs.open
        if self.ledger is None or plan is None:
            return
        handed = plan.positions[plan.first * self.batch_size : plan.batches * self.batch_size]
        self.ledger.record(plan.epoch, handed, world_size=self.world_size,
                           batch_size=self.batch_size, drop_last=self.drop_last, complete=complete)

    # -- lifetime -------------------------------------------------------------------------------
    def _release(self, keep: bool = True) -> None:
        """Hand the DALI graph back to the pool (``keep``) or close it; its threads go either way
        but DALI's own, which stay parked with an idle graph (see ``pipeline.engine.graph_pool``)."""
        graph, self._graph = self._graph, None
        if graph is not None and keep:
            pool.give(self._graph_key, graph)
        elif graph is not None:
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
        graph, self._graph = getattr(self, "_graph", None), None
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn modules down
            if graph is not None:
                pool.orphan(self._graph_key, graph)  # nothing that waits: see pool.orphan


def _following(loader: weakref.ref[Loader], epoch: int, lookahead: int) -> list[Epoch]:
    """``Loader._following``, asked for on the feeding thread: the graph, which may outlive the
    Loader in the pool, holds it only weakly."""
    alive = loader()
    return alive._following(epoch, lookahead) if alive is not None else []
