"""Measure data-loader wait against step time: ``bench.watch(loader)`` or ``bench.measure``.

The harness (and torch with it) loads on first use of a name."""

from __future__ import annotations

if __name__ != "tilefeed.bench":  # the repository's folder imported as itself, from a checkout's root
    raise ImportError(f"import tilefeed.bench, not {__name__}: the same module under two names would be "
                      "two modules (two graph pools, two caches)")

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tilefeed.bench.harness.watch import RunResult, measure, watch

__all__ = ["RunResult", "measure", "watch"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tilefeed.bench' has no attribute {name!r}")
    return getattr(import_module("tilefeed.bench.harness.watch"), name)
