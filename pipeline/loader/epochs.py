"""Which samples one rank hands over in an epoch, at which size: its share of the epoch's order
(``Shares``, kept for the epochs around the one being read), the plan of an epoch that may
continue a loaded state (``plan_epoch``), and where an epoch stands for a saved state."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tilefeed.pipeline.mixing.mix import Mixture
from tilefeed.pipeline.settings import LoaderSettings
from tilefeed.pipeline.planning.order import EpochOrder, Segment, epoch_order, rank_indices
from tilefeed.pipeline.loader.resume import Loaded
from tilefeed.pipeline.planning.sizes import Schedule, check_size


@dataclass
class OpenEpoch:
    """The epoch being iterated: where it started and how far this rank has handed over."""

    epoch: int
    size: int  # the output side of every batch of this epoch
    prior: list[Segment]  # earlier stretches of this epoch (other runs, other settings)
    indices: np.ndarray  # this rank's samples in this stretch, in order
    batches: int  # handed over so far in this stretch (counting those before a same-settings resume)
    first: int  # the batch this run started at: what the ledger records begins there
    keys: np.ndarray | None = None  # a mixture's positions of ``indices`` (see Shares.keys)


class Shares:
    """This rank's samples of an epoch (of what earlier stretches left of it), kept for this
    epoch and its neighbours: each is asked for when the Loader is made or iterated and when
    the next epoch is read ahead. Memory in proportion to the share, never to the store."""

    def __init__(self, settings: LoaderSettings, samples: int, shard_size: int,
                 subset: np.ndarray | None, mixture: Mixture | None = None) -> None:
        self.settings, self.shard_size, self.subset, self.mixture = settings, shard_size, subset, mixture
        # what an epoch's order permutes: the store's samples, or a mixture's positions
        self.positions = samples if mixture is None else len(mixture.plan)
        self._kept: dict[tuple[int, tuple[Segment, ...], bool], np.ndarray] = {}
        self._lock = threading.RLock()  # the feeding thread asks for the next epoch's

    def order(self, epoch: int) -> EpochOrder:
        """The epoch's order as a function of position: only its shard order is held."""
        s = self.settings
        return epoch_order(self.positions, shuffle=s.shuffle, seed=s.seed, epoch=epoch,
                           shard_size=self.shard_size, window=s.shuffle_window, subset=self.subset)

    def get(self, epoch: int, after: tuple[Segment, ...] = ()) -> np.ndarray:
        """This rank's samples of what ``after`` left of ``epoch``, in order (read-only): a
        mixture's are its positions' samples (global ids), located by its plan."""
        return self._share(epoch, after, located=self.mixture is not None)

    def keys(self, epoch: int, after: tuple[Segment, ...] = ()) -> np.ndarray | None:
        """A mixture's positions of the same share, or None (one store's samples are their own
        keys): what the ledger records (one entry of the epoch's planned multiset of samples
        each, so exactly-once is checked per entry) and what crops and flips are drawn from (a
        sample repeated in an epoch is cut anew each time)."""
        return None if self.mixture is None else self._share(epoch, after, located=False)

    def _share(self, epoch: int, after: tuple[Segment, ...], located: bool) -> np.ndarray:
        key = (epoch, after, located)
        with self._lock:
            share = self._kept.get(key)
            if share is None:
                if located:
                    assert self.mixture is not None
                    share = self.mixture.locate(epoch, self._share(epoch, after, located=False))
                else:
                    s = self.settings
                    share = rank_indices(self.order(epoch), rank=s.rank, world_size=s.world_size,
                                         batch_size=s.batch_size, drop_last=s.drop_last, after=after)
                share.flags.writeable = False
                self._kept = {k: v for k, v in self._kept.items() if k[0] in (epoch - 1, epoch, epoch + 1)}
                self._kept[key] = share
            return share


def plan_epoch(shares: Shares, epoch: int, size: int, resume: list[Segment] | None) -> OpenEpoch:
    """This rank's part of ``epoch`` at ``size``: fresh, or continuing the loaded state whose
    stretches of this epoch are ``resume``."""
    s = shares.settings
    last = resume[-1] if resume else None
    prior, batches = resume or [], 0
    if last is not None and (last.world_size, last.batch_size, last.drop_last) == (
            s.world_size, s.batch_size, s.drop_last):
        # same settings: continue the very split the saved run was in, batch for batch
        prior, batches = prior[:-1], last.batches
    after = tuple(prior)
    return OpenEpoch(epoch, size, prior, shares.get(epoch, after), batches, batches, shares.keys(epoch, after))


def starting_size(schedule: int | Schedule, fixed: int | None, resume: Loaded | None, epoch: int) -> int:
    """The size ``epoch`` takes when it starts (or resumes) now: a loaded state's begun epoch
    keeps its own; any other takes set_size()'s (``fixed``), else the schedule's."""
    if resume is not None and resume.epoch == epoch and resume.size is not None:
        return resume.size
    if fixed is not None:
        return fixed
    return check_size(schedule(epoch), f"size({epoch})") if callable(schedule) else schedule


def progress(settings: LoaderSettings, open_epoch: OpenEpoch | None, resume: Loaded | None,
             epoch: int) -> tuple[int, list[Segment]]:
    """The epoch a state saved now is in, and its stretches so far: the one being iterated,
    else a loaded state's not yet iterated, else the next ``epoch`` with nothing handed over."""
    if open_epoch is not None:
        return open_epoch.epoch, [*open_epoch.prior, Segment(settings.world_size, settings.batch_size,
                                                             settings.drop_last, open_epoch.batches)]
    if resume is not None:
        return resume.epoch, resume.segments
    return epoch, []
