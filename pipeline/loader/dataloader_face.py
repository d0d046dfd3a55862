"""What scripts written for torch's DataLoader reach for besides the batches: ``loader.dataset``
and ``loader.sampler`` (with its ``set_epoch``), built over the Loader's public methods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tilefeed.pipeline.planning.order import samples_per_rank
from tilefeed.pipeline.reading.mixed import AnyReader
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.store.errors import ConfigError

if TYPE_CHECKING:
    from tilefeed.pipeline.loader.loader import Loader


def dataset_of(reader: AnyReader, subset: np.ndarray | None) -> Any:
    """A store's samples as a map-style Dataset (``TileDataset``, or its ``Subset``)."""
    from torch.utils.data import Subset

    from tilefeed.pipeline.reading.dataset import TileDataset

    if not isinstance(reader, StoreReader):
        raise ConfigError("a Loader over a Mix has no single Dataset: len(loader) and loader.samples "
                          "count its epoch, loader.source_of names a sample's store")
    full = TileDataset(reader)
    return full if subset is None else Subset(full, subset.tolist())


class EpochSampler:
    """What ``loader.sampler`` is: scripts call ``sampler.set_epoch(epoch)`` on it each epoch.

    Parameters
    ----------
    loader : Loader
        The Loader whose epochs it sets and whose samples it lists.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """The epoch the Loader's next ``iter()`` begins (``Loader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return samples_per_rank(self.loader.samples, self.loader.world_size, self.loader.batch_size,
                                self.loader.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self.loader.epoch_indices(self.loader.epoch).tolist())
