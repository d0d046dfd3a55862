"""The Loader's epochs, with one owner (``EpochState``): which epoch comes next, the one being
iterated, a loaded state not yet iterated, the output size each takes, and where an epoch stands
for a saved state. Beneath it, which samples one rank hands over in an epoch: its share of the
epoch's order (``Shares``, kept for the epochs around the one being read), and the plan of an
epoch that may continue a loaded state (``plan_epoch``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tilefeed.pipeline.mixing.mix import Sources
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
    positions: np.ndarray  # the epoch's positions of ``indices`` (see Shares.positions_of)


class Shares:
    """This rank's samples of an epoch (of what earlier stretches left of it), kept for this
    epoch and its neighbours: each is asked for when the Loader is made or iterated and when
    the next epoch is read ahead. Memory in proportion to the share, never to the store."""

    def __init__(self, settings: LoaderSettings, shard_size: int, sources: Sources) -> None:
        self.settings, self.shard_size, self.sources = settings, shard_size, sources
        self._kept: dict[tuple[int, tuple[Segment, ...], bool], np.ndarray] = {}
        self._lock = threading.RLock()  # the feeding thread asks for the next epoch's

    def order(self, epoch: int) -> EpochOrder:
        """The epoch's order as a function of position: only its shard order is held."""
        s = self.settings
        return epoch_order(self.sources.positions, shuffle=s.shuffle, seed=s.seed, epoch=epoch,
                           shard_size=self.shard_size, window=s.shuffle_window, subset=self.sources.subset)

    def get(self, epoch: int, after: tuple[Segment, ...] = ()) -> np.ndarray:
        """This rank's samples of what ``after`` left of ``epoch``, in order (read-only): its
        positions' samples (global ids of a mixture's stores), located by the plan."""
        return self._share(epoch, after, located=True)

    def positions_of(self, epoch: int, after: tuple[Segment, ...] = ()) -> np.ndarray:
        """The positions of the same share (of one store, its samples themselves): what the
        ledger records (one entry of the epoch's planned multiset of samples each, so
        exactly-once is checked per entry) and what crops and flips are drawn from (a sample
        repeated in an epoch is cut anew each time)."""
        return self._share(epoch, after, located=False)

    def _share(self, epoch: int, after: tuple[Segment, ...], located: bool) -> np.ndarray:
        key = (epoch, after, located)
        with self._lock:
            share = self._kept.get(key)
            if share is None:
                if located:
                    share = self.sources.locate(epoch, self._share(epoch, after, located=False))
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
    return OpenEpoch(epoch, size, prior, shares.get(epoch, after), batches, batches,
                     shares.positions_of(epoch, after))


class EpochState:
    """Where the Loader's epochs stand, and the size each takes.

    It holds the number of the epoch the next ``iter()`` begins (``next``), the epoch being
    iterated (``open``, until it ends), a loaded state not yet iterated (``resume``), the size
    schedule the Loader was made with and ``set_size``'s size (``fixed``). Every question about
    an epoch (its plan, its size, where a state saved now would stand) is asked here.

    Parameters
    ----------
    shares : Shares
        This rank's samples of each epoch.
    schedule : int or Schedule
        The output side of every epoch, or a function of the epoch giving it.
    """

    def __init__(self, shares: Shares, schedule: int | Schedule) -> None:
        self.shares, self.schedule = shares, schedule
        self.fixed: int | None = None  # set_size(): every epoch not yet begun, schedule or not
        self.next = 0  # the epoch the next iter() begins
        self.open: OpenEpoch | None = None  # the epoch being iterated
        self.resume: Loaded | None = None  # a loaded state not yet iterated

    @property
    def largest(self) -> int:
        """The largest size the schedule can ask for (0 where a plain function cannot say)."""
        largest = getattr(self.schedule, "largest", self.schedule)  # ramp(): its max_res
        return largest if isinstance(largest, int) else 0

    @property
    def current(self) -> int:
        """The epoch being iterated, else the one the next ``iter()`` begins."""
        return self.open.epoch if self.open is not None else self.next

    def size_of(self, epoch: int) -> int:
        """The output side of ``epoch``: the epoch being iterated keeps the size it began with (a
        loaded state's too); any other takes ``set_size``'s, else the schedule's."""
        if self.open is not None and self.open.epoch == epoch:
            return self.open.size
        return self._starting_size(epoch)

    def set_size(self, size: int | None) -> None:
        """``size`` for every epoch not yet begun; ``None`` returns to the schedule."""
        self.fixed = None if size is None else check_size(size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` begins: a loaded state's epoch keeps its position, any
        other starts fresh."""
        self.next = epoch
        if self.resume is not None and self.resume.epoch != epoch:
            self.resume = None

    def plan(self, epoch: int) -> OpenEpoch:
        """This rank's part of ``epoch`` as it would begin now: continuing a loaded state when it
        is in this epoch, else fresh."""
        resume = self.resume.segments if self.resume is not None and self.resume.epoch == epoch else None
        return plan_epoch(self.shares, epoch, self._starting_size(epoch), resume)

    def _starting_size(self, epoch: int) -> int:
        """The size ``epoch`` takes when it starts (or resumes) now: a loaded state's begun epoch
        keeps its own; any other takes set_size()'s, else the schedule's."""
        if self.resume is not None and self.resume.epoch == epoch and self.resume.size is not None:
            return self.resume.size
        if self.fixed is not None:
            return self.fixed
        return check_size(self.schedule(epoch), f"size({epoch})") if callable(self.schedule) else self.schedule

    def begin(self) -> OpenEpoch:
        """Open the next epoch for iterating; the one after it comes next."""
        plan = self.open = self.plan(self.next)
        self.next, self.resume = plan.epoch + 1, None
        return plan

    def end(self) -> None:
        """The open epoch was iterated to its end."""
        self.open = None

    def next_indices(self) -> np.ndarray:
        """The samples the next ``iter()`` yields on this rank, in order (read-only)."""
        plan = self.plan(self.next)
        return plan.indices[plan.batches * self.shares.settings.batch_size :]

    def progress(self) -> tuple[int, list[Segment]]:
        """The epoch a state saved now is in, and its stretches so far: the one being iterated,
        else a loaded state's not yet iterated, else the next epoch with nothing handed over."""
        s = self.shares.settings
        if self.open is not None:
            return self.open.epoch, [*self.open.prior, Segment(s.world_size, s.batch_size, s.drop_last,
                                                               self.open.batches)]
        if self.resume is not None:
            return self.resume.epoch, self.resume.segments
        return self.next, []

    def load(self, loaded: Loaded) -> None:
        """Continue from a loaded state: its epoch comes next, at its size."""
        self.resume, self.fixed, self.next, self.open = loaded, loaded.fixed, loaded.epoch, None
