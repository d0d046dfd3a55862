"""Figures measured over rounds, and two loaders measured side by side.

A figure measured over rounds is reported as its median and its range (``Figure``); every bench
suite that reports one writes it through here, so that "median (low-high)" reads alike in every
table. Two loaders measured side by side over interleaved rounds: the Loader and the DataLoader
its users swap from (``tilefeed bench recipe``, ``tilefeed bench detection``). One figure a side;
the result keeps every run."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

LOADER, DATALOADER = "tilefeed Loader", "DataLoader + torchvision v2"


def range_text(bounds: Sequence[float], fmt: str, to: str = "-") -> str:
    """A range as text: ``low-high``.

    Parameters
    ----------
    bounds : sequence of two floats
        The least and the most of the rounds (``Figure.bounds``, or the pair a JSON file kept).
    fmt : str
        The format of each number, as in an f-string (``".1f"``).
    to : str, default "-"
        What stands between them; ``" to "`` where the numbers carry a sign.

    Returns
    -------
    str
    """
    low, high = bounds
    return f"{low:{fmt}}{to}{high:{fmt}}"


def spread_text(spread: Mapping[str, float], fmt: str, to: str = "-") -> str:
    """A figure's median and range as text: ``median (low-high)``.

    Parameters
    ----------
    spread : mapping of str to float
        ``median``, ``min`` and ``max``: ``Figure.spread``, or what a JSON file kept of it.
    fmt : str
        The format of each number, as in an f-string (``",.0f"``).
    to : str, default "-"
        What stands between the least and the most (``range_text``).

    Returns
    -------
    str
    """
    return f"{spread['median']:{fmt}} ({range_text((spread['min'], spread['max']), fmt, to)})"


@dataclass
class Figure:
    """One figure's rounds, reported as their median and range.

    Attributes
    ----------
    rounds : list of float
        The figure in each round, in the order measured.
    """

    rounds: list[float]

    @property
    def median(self) -> float:
        """The median of the rounds."""
        return statistics.median(self.rounds)

    @property
    def bounds(self) -> tuple[float, float]:
        """The least and the most of the rounds."""
        return min(self.rounds), max(self.rounds)

    def spread(self) -> dict[str, float]:
        """The median and the range without the rounds: ``{"median", "min", "max"}``, the form
        the cloud and clients suites' JSON keeps."""
        low, high = self.bounds
        return {"median": self.median, "min": low, "max": high}

    def text(self, fmt: str, to: str = "-") -> str:
        """``median (low-high)`` in ``fmt`` (``spread_text``)."""
        return spread_text(self.spread(), fmt, to)

    def cells(self, fmt: str) -> str:
        """``median | low-high`` in ``fmt``: the two cells of a Markdown table whose median and
        range stand in columns of their own."""
        return f"{self.median:{fmt}} | {range_text(self.bounds, fmt)}"


def figures(sides: dict[str, Any]) -> dict[str, Figure]:
    """Each side's figure again from ``asdict``'s data (``{"rounds": [...]}``)."""
    return {side: Figure(**figure) for side, figure in sides.items()}


@dataclass
class SideBySide:
    """Both sides' images/s with no step and their stall at an emulated step.

    Attributes
    ----------
    step_ms : float
        The emulated step the stall is measured at.
    rate : dict of str to Figure
        Side -> images/s with no step.
    stall : dict of str to Figure
        Side -> the share of the run spent waiting for data at the step.
    settings : dict
        What the run was measured with (batch, workers, rounds, device, versions).
    runs : list of dict
        Every measured run's figures.
    """

    step_ms: float
    rate: dict[str, Figure]
    stall: dict[str, Figure]
    settings: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """The Loader's median images/s over the DataLoader's."""
        return self.rate[LOADER].median / self.rate[DATALOADER].median

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data (with ``speedup``)."""
        d = asdict(self)
        d["speedup"] = self.speedup
        return d

    def rows(self, title: str) -> list[str]:
        """``title``, then a table of both sides' images/s and stall, then the ratio."""
        lines = [title, f"| loader | img/s, no step | stall at a {self.step_ms:g} ms step |",
                 "| --- | ---: | ---: |"]
        for side in (LOADER, DATALOADER):
            lines.append(f"| {side} | {self.rate[side].text(',.0f')} | {self.stall[side].text('.1%')} |")
        lines.append(f"Loader / DataLoader: {self.speedup:.2f}x")
        return lines
