"""``Objects``: a batch's boxes, ragged, as the store keeps them (offsets, then one row a box).

Sample ``i``'s boxes are rows ``offsets[i]:offsets[i + 1]``. Each row keeps its position among
its tile's objects (``ids``), which names its instance mask (``mask == ids + 1``) after boxes
are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefeed.store.errors import ConfigError

ROW_WIDTH = 6  # x0, y0, x1, y1, category id, iscrowd: the store's ``objects`` rows


@dataclass(frozen=True)
class Objects:
    """A batch's boxes, ragged over its samples.

    Attributes
    ----------
    offsets : numpy.ndarray
        (n + 1,) int64, non-decreasing from 0: sample ``i`` owns rows ``offsets[i]:offsets[i + 1]``.
    boxes : numpy.ndarray
        (M, 4) float64 XYXY, continuous pixel coordinates (a box over pixels 0..9 is 0..10).
    labels : numpy.ndarray
        (M,) int64 category ids, the source's own (COCO's 1..90).
    iscrowd : numpy.ndarray
        (M,) int64, 1 for a crowd region.
    ids : numpy.ndarray
        (M,) int64: the row's position among its tile's objects in the store, so its instance
        mask is ``mask == ids + 1``.
    """

    offsets: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    ids: np.ndarray

    def __post_init__(self) -> None:
        m = int(self.offsets[-1]) if len(self.offsets) else -1
        if (self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0
                or np.any(np.diff(self.offsets) < 0)):
            raise ConfigError("objects: offsets must be non-decreasing from 0, one more than the samples")
        if self.boxes.shape != (m, 4) or not (len(self.labels) == len(self.iscrowd) == len(self.ids) == m):
            raise ConfigError(f"objects: offsets end at {m} rows, boxes are {self.boxes.shape}, labels "
                              f"{len(self.labels)}, iscrowd {len(self.iscrowd)}, ids {len(self.ids)}")

    @classmethod
    def from_rows(cls, offsets: np.ndarray, rows: np.ndarray) -> Objects:
        """A batch from the store's layout: ``offsets`` (n + 1,) and ``rows`` (M, 6) of x0, y0,
        x1, y1, category id, iscrowd, each sample's rows in its tile's order.

        Parameters
        ----------
        offsets : numpy.ndarray
            (n + 1,) integer offsets, from 0.
        rows : numpy.ndarray
            (M, 6) float64 rows as the store's ``objects``.

        Returns
        -------
        Objects
            The batch, each row's ``ids`` its position within its sample.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, ROW_WIDTH)
        counts = np.diff(offsets)
        first = np.repeat(offsets[:-1], counts) if len(counts) else np.zeros(0, np.int64)
        return cls(offsets, rows[:, :4].copy(), rows[:, 4].astype(np.int64), rows[:, 5].astype(np.int64),
                   np.arange(len(rows), dtype=np.int64) - first)

    @classmethod
    def gather(cls, object_offsets: np.ndarray, objects: np.ndarray, tiles: np.ndarray) -> Objects:
        """The boxes of the batch's ``tiles`` from a whole store's ``object_offsets`` (N + 1,)
        and ``objects`` (rows, 6), in the order of ``tiles``.

        Parameters
        ----------
        object_offsets : numpy.ndarray
            (N + 1,) the store's offsets.
        objects : numpy.ndarray
            (rows, 6) the store's rows (any array numpy can index with an integer array).
        tiles : numpy.ndarray
            (n,) tile indices of the batch.

        Returns
        -------
        Objects
            The batch's boxes.
        """
        off = np.asarray(object_offsets, dtype=np.int64)
        tiles = np.asarray(tiles, dtype=np.int64)
        starts, counts = off[tiles], off[tiles + 1] - off[tiles]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        return cls.from_rows(offsets, np.asarray(objects[rows]) if len(rows) else np.zeros((0, ROW_WIDTH)))

    def __len__(self) -> int:
        """The number of samples."""
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        """(n,) int64: boxes per sample."""
        return np.diff(self.offsets)

    def samples(self) -> np.ndarray:
        """(M,) int64: the sample each row belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)

    def select(self, keep: np.ndarray) -> Objects:
        """The rows where ``keep`` (M,) is true, offsets recounted; ``ids`` kept as they were.

        Parameters
        ----------
        keep : numpy.ndarray
            (M,) bool.

        Returns
        -------
        Objects
            The kept rows.
        """
        kept_per_sample = np.bincount(self.samples()[keep], minlength=len(self))
        offsets = np.concatenate([[0], np.cumsum(kept_per_sample)]).astype(np.int64)
        return Objects(offsets, self.boxes[keep], self.labels[keep], self.iscrowd[keep], self.ids[keep])

    def with_boxes(self, boxes: np.ndarray) -> Objects:
        """The same rows with new coordinates ``boxes`` (M, 4).

        Parameters
        ----------
        boxes : numpy.ndarray
            (M, 4) float64.

        Returns
        -------
        Objects
            A copy holding ``boxes``.
        """
        return Objects(self.offsets, boxes, self.labels, self.iscrowd, self.ids)
