"""Two loaders measured side by side over interleaved rounds: the Loader and the DataLoader its
users swap from (``tilefeed bench recipe``, ``tilefeed bench detection``). One figure a side is
a list of rounds, reported as the median and the range; the result keeps every run."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

LOADER, DATALOADER = "tilefeed Loader", "DataLoader + torchvision v2"


@dataclass
class Figure:
    """One figure's rounds: its median and range."""

    rounds: list[float]

    @property
    def median(self) -> float:
        """The median of the rounds."""
        return statistics.median(self.rounds)

    def text(self, fmt: str) -> str:
        """``median (low-high)`` in ``fmt``."""
        return f"{self.median:{fmt}} ({min(self.rounds):{fmt}}-{max(self.rounds):{fmt}})"


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
