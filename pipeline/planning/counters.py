"""Random draws keyed by (seed, epoch, sample): the one source of every random parameter the
Loader applies, per sample (crop windows, flips, the recipe's operations) or per batch (mixup and
cutmix, keyed by the batch's position).

A counter-based generator (splitmix64's finaliser of a per-draw counter): draw k of key s is a
function of (seed, epoch, s, k) alone, so a run resumed mid-epoch, or on another world size or
batch size, sees exactly the draws an uninterrupted run would, whatever batch a sample lands in.
Each operation draws on a stream of its own (``stream_seed``), so adding one never moves another's
draws.
"""

from __future__ import annotations

import hashlib

import numpy as np

_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised over uint64 (wrapping arithmetic is the point)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _key(seed: int, epoch: int) -> np.uint64:
    k = np.array([(seed * 0x9E3779B97F4A7C15 + epoch * 0xD1B54A32D192ED03 + 0x5851F42D4C957F2D) & _MASK],
                 dtype=np.uint64)
    return np.uint64(_mix(k)[0])


def uniforms(seed: int, epoch: int, samples: np.ndarray, count: int) -> np.ndarray:
    """(len(samples), count) floats in [0, 1): draw k of sample s depends on (seed, epoch, s, k) only."""
    counter = samples.astype(np.uint64)[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _mix(counter * np.uint64(0x9E3779B97F4A7C15) + _key(seed, epoch))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def stream_seed(seed: int, stream: str) -> int:
    """The seed of the named draw stream for the Loader's ``seed``: the seed mixed with a constant
    derived from ``stream`` (the crops and flips use the seed itself)."""
    constant = int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=8).digest(), "little")
    return (seed ^ constant) & _MASK
