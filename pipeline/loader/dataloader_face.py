"""What scripts written for torch's DataLoader reach for besides the batches: ``loader.dataset``,
``loader.sampler`` and ``loader.batch_sampler`` (each with its ``set_epoch``), built over the
Loader's public methods, and a one-line refusal for the DataLoader attributes that mean nothing
here.

Who reaches for what (read from their source): timm's ``train.py`` calls
``_set_loader_epoch``, which looks at ``loader.dataset.set_epoch``, then
``loader.batch_sampler.set_epoch``, else ``loader.sampler.set_epoch``; it reads ``len(loader)``
and ``loader.mixup_enabled`` (only with mixup under its prefetcher). Lightning's loops call
``set_epoch`` on ``loader.sampler`` and on ``loader.batch_sampler.sampler`` (one call per
distinct object), read ``len()``, ``loader.dataset`` (is it an ``IterableDataset``?) and, in
validation, ``loader.sampler`` (is it shuffled?). accelerate's ``prepare`` hands back any object
that is not a ``DataLoader`` unchanged; its ``register_for_checkpointing`` needs
``state_dict``/``load_state_dict``; its ``skip_first_batches`` builds a plain DataLoader over
``loader.dataset`` with ``loader.batch_sampler``, whose items would be raw stored tiles: the
dataset's items are refused (``LoaderDataset``), and the Loader resumes itself
(``register_for_checkpointing``, ``load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from tilefeed.pipeline.planning.order import samples_per_rank
from tilefeed.pipeline.reading.protocol import Reader
from tilefeed.pipeline.reading.reader import StoreReader
from tilefeed.store.errors import ConfigAttributeError, ConfigError

if TYPE_CHECKING:
    from tilefeed.pipeline.loader.loader import Loader


def dataset_of(reader: Reader, subset: np.ndarray | None) -> LoaderDataset:
    """A store's samples as a map-style Dataset (``TileDataset``, or its ``Subset``), its items
    refused (``LoaderDataset``)."""
    from torch.utils.data import Subset

    from tilefeed.pipeline.reading.dataset import TileDataset

    if not isinstance(reader, StoreReader):
        raise ConfigAttributeError("a Loader over a Mix has no single Dataset: len(loader) and loader.samples "
                          "count its epoch, loader.source_of names a sample's store")
    full = TileDataset(reader)
    return LoaderDataset(full if subset is None else Subset(full, subset.tolist()))


ITEMS_REFUSED = ("loader.dataset's items would be raw stored tiles, not what the Loader yields, and a "
                 "DataLoader built over it (accelerate's skip_first_batches) would train on them: the "
                 "Loader resumes itself mid-epoch (accelerator.register_for_checkpointing(loader) with "
                 "save_state/load_state, or loader.load_state_dict), so iterate it without skipping; "
                 "raw tiles: TileDataset(store)")


class LoaderDataset(Dataset[Any]):
    """What ``loader.dataset`` is: the samples an epoch covers, for what training scripts ask of
    a DataLoader's dataset (``len()``, whether it is an ``IterableDataset``, a ``set_epoch`` to
    look for, the store's ``classes``), with its items refused in one line (``ITEMS_REFUSED``):
    a stored tile is not what the Loader yields, and a DataLoader built over this dataset
    (accelerate's ``skip_first_batches``) would otherwise train on raw tiles without a word.

    Parameters
    ----------
    samples : Dataset
        The store's ``TileDataset``, or its ``Subset`` (the Loader's ``indices``).
    """

    def __init__(self, samples: Dataset[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        raise ConfigError(ITEMS_REFUSED)

    def __getitems__(self, indices: list[int]) -> Any:
        raise ConfigError(ITEMS_REFUSED)

    def __getattr__(self, name: str) -> Any:
        if name == "samples":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.samples, name)


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


class EpochBatchSampler:
    """What ``loader.batch_sampler`` is: torch's ``BatchSampler`` face over the Loader's order.

    ``sampler`` is ``loader.sampler``; ``len()`` is the batches this rank yields (``len(loader)``);
    iterating gives, per batch of the epoch the next ``iter()`` begins, the list of this rank's
    sample indices (a ``Mix``'s ids, as ``with_index``). ``set_epoch`` reaches the Loader, as
    timm's and Lightning's epoch hooks expect.

    Parameters
    ----------
    loader : Loader
        The Loader whose epochs it sets and whose batches it lists.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    @property
    def sampler(self) -> EpochSampler:
        """The Loader's ``sampler`` (the same object)."""
        return self.loader.sampler

    @property
    def batch_size(self) -> int:
        """Samples per batch on each rank."""
        return self.loader.batch_size

    @property
    def drop_last(self) -> bool:
        """Whether the epoch's incomplete tail is dropped (else the order is padded)."""
        return self.loader.drop_last

    def set_epoch(self, epoch: int) -> None:
        """The epoch the Loader's next ``iter()`` begins (``Loader.set_epoch``)."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[list[int]]:
        indices = self.loader.epoch_indices(self.loader.epoch).tolist()
        size = self.batch_size
        return iter([indices[i : i + size] for i in range(0, len(indices), size)])
