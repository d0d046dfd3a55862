"""Two-sample tests with fixed significance for the recipe's distribution checks (numpy only).

Each returns True when the two samples are consistent at significance 0.001: the asymptotic
Kolmogorov-Smirnov bound ``1.949 * sqrt((n + m) / (n m))`` and the chi-square 0.999 quantiles.
"""

from __future__ import annotations

import numpy as np

KS_C = 1.949  # c(alpha) of the two-sample KS test at alpha = 0.001
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}  # chi-square 0.999 quantiles by dof


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between the two empirical distribution functions."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    gap = np.searchsorted(a, grid, side="right") / len(a) - np.searchsorted(b, grid, side="right") / len(b)
    return float(np.abs(gap).max())


def ks_same(a: np.ndarray, b: np.ndarray) -> bool:
    """Two-sample KS at alpha 0.001 (conservative for discrete values)."""
    n, m = len(a), len(b)
    return ks_statistic(a, b) <= KS_C * np.sqrt((n + m) / (n * m))


def chi2_same(a: np.ndarray, b: np.ndarray) -> bool:
    """Chi-square test of homogeneity of two samples of categories at alpha 0.001."""
    categories = np.union1d(a, b)
    table = np.array([[np.sum(a == c) for c in categories], [np.sum(b == c) for c in categories]], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    return statistic <= CHI2_999[len(categories) - 1]
