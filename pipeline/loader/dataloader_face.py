"""What scripts written for torch's DataLoader reach for besides the batches: ``loader.dataset``
and ``loader.sampler`` (with its ``set_epoch``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefeed.pipeline.planning.order import samples_per_rank
from tilefeed.pipeline.reading.mixed import AnyReader
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.store.errors import ConfigError

if TYPE_CHECKING:
    from tilefeed.pipeline.loader.loader import Loader


class DataLoaderFace:
    """The Loader's ``dataset`` and ``sampler``, as DataLoader scripts reach for them."""

    reader: AnyReader
    subset: np.ndarray | None

    @cached_property
    def dataset(self) -> Any:
        """The samples as a map-style Dataset (``TileDataset``, or its ``Subset``): ``len()`` is
        the number of samples an epoch covers, as scripts that count processed samples expect."""
        from torch.utils.data import Subset

        from tilefeed.pipeline.reading.dataset import TileDataset

        if not isinstance(self.reader, StoreReader):
            raise ConfigError("a Loader over a Mix has no single Dataset: len(loader) and loader.samples "
                              "count its epoch, loader.source_of names a sample's store")
        full = TileDataset(self.reader)
        return full if self.subset is None else Subset(full, self.subset.tolist())

    @property
    def sampler(self) -> EpochSampler:
        """DistributedSampler's face: ``set_epoch`` reaches this Loader."""
        return EpochSampler(self)  # type: ignore[arg-type]  # only the Loader derives from this


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
