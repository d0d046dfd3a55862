"""Auto-augment policies (TrivialAugmentWide, RandAugment, AutoAugment) as host-side draws.

Which operations a sample gets, their magnitudes and signs are drawn on the host from
(seed, epoch, sample key) with the counter-based generator of ``pipeline.engine.crops``, in a
counter space of their own (the seed is mixed with a fixed constant), so the crop windows and
flips stay what they were and a resumed run sees the same operations. The graph
(``policy_ops.apply_policy``) then only applies what it is told: per sample and per op slot, an
op index, one scalar parameter and, for geometric ops, a 2x3 inverse affine matrix.

Two families share the op set but not the arithmetic from magnitude to parameter:

- torchvision v2 (``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment(IMAGENET)``): magnitude
  bins over linspace tables, a fair sign, nearest interpolation and fill 0 by default.
- timm (``rand-...`` strings, ``original``/``originalr``/``v0``/``v0r``): magnitude levels out of
  10 with optional Gaussian (``mstd``) or uniform (``mstd`` > 100) noise clipped to
  ``[0, mmax]``, per-op probability, PIL's op semantics (enhance factors, relative translation,
  solarize-add, posterize bit counts), fill ``img_mean`` (128 by default).

The op set, the families' tables and their magnitude arithmetic are ``policy_tables``'; reading
torchvision's names and timm's strings into an ``AutoAugment`` is ``policy_strings``'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from tilefeed.pipeline.planning.counters import stream_seed, uniforms
from tilefeed.pipeline.recipe.policy_strings import policy_settings
from tilefeed.pipeline.recipe.policy_tables import (_LEVEL_DENOM, _TIMM_NAMES, _TIMM_RAND, _TIMM_RAND_INC,
                                                    _TIMM_TABLES, _TIMM_WEIGHTS, _TV_IMAGENET, _TV_NAMES,
                                                    _TV_RAND_OPS, GEOMETRIC, OPS, RANDOM_FILTERS, Family, Op,
                                                    Policy, PolicyInterpolation, Table, _matrix, _timm_param,
                                                    _tv_param)
from tilefeed.store.choices import choice
from tilefeed.store.errors import ConfigError

# Mixed into the seed so the policy's draws never share a counter with the crops' draws.
STREAM = "tilefeed.recipe.policies"  # the policies' draw stream (planning.counters.stream_seed)
# Uniforms per op slot: op choice, probability, magnitude bin or noise (two for Box-Muller), sign.
_PER_SLOT = 5
# The geometric ops' filter under ``PolicyInterpolation.RANDOM``: a stream of its own, one uniform per
# slot, so the op, magnitude and sign draws above keep their counters and values.
FILTER_STREAM = "tilefeed.recipe.policies.filter"
# Every per-sample input a policy may send, with its dtype (``AutoAugment.input_names`` picks its own).
INPUTS: Mapping[str, np.dtype] = MappingProxyType({
    "aa_op": np.dtype(np.int32), "aa_param": np.dtype(np.float32), "aa_matrix": np.dtype(np.float32),
    "aa_filter": np.dtype(np.int32)})
INPUT_NAMES: tuple[str, ...] = tuple(INPUTS)
# The inputs only the host kernels read: DALI's warp has no cubic filter, so the graph warps every
# slot bilinear and is not sent the drawn filter (an unread input would still be fed to DALI).
HOST_ONLY_INPUTS: tuple[str, ...] = ("aa_filter",)


@dataclass(frozen=True)
class AutoAugment:
    """An automatic augmentation policy, drawn on the host and applied by the graph.

    Parameters
    ----------
    policy : Policy
        TrivialAugmentWide (one op per sample), RandAugment (``num_ops`` ops) or AutoAugment's
        ImageNet sub-policies (two ops, each with its probability).
    family : Family
        torchvision v2's op tables and magnitude arithmetic, or timm's.
    num_ops : int
        RandAugment: ops per sample (torchvision's ``num_ops``, timm's ``n``).
    magnitude : float
        RandAugment: torchvision's magnitude bin (an int below ``num_magnitude_bins``), or timm's
        level out of 10 (``m``).
    num_magnitude_bins : int
        torchvision: bins of each magnitude linspace (31 for TrivialAugmentWide and
        RandAugment; AutoAugment's table uses 10).
    mstd : float
        timm: standard deviation of Gaussian noise on the level; ``inf`` draws the level
        uniformly in ``[0, magnitude]`` (timm's ``mstd`` over 100).
    mmax : float
        timm: the level is clipped to ``[0, mmax]``.
    increasing : bool
        timm ``inc1``: the op variants whose strength grows with the level.
    prob : float
        timm RandAugment: probability each chosen op is applied (``p``, default 0.5).
    weighted : bool
        timm ``tweights``: op choice by timm's weights, without replacement.
    table : Table
        AutoAugment: the sub-policy table.
    fill : tuple of int
        RGB fill of geometric ops' uncovered pixels (torchvision ``fill``, timm ``img_mean``).
    interpolation : PolicyInterpolation
        Interpolation of the geometric ops (``bicubic``: bilinear in the GPU graph, whose warp has
        no cubic filter); ``random`` draws bilinear or bicubic per slot.
    translate_pct : float
        timm: relative translation range at level 10 (``translate_pct``).
    translate_const : float
        timm: absolute translation range in pixels at level 10 (``translate_const``; only
        timm's absolute translate ops use it, which none of the supported strings choose).
    """

    policy: Policy
    family: Family = Family.TORCHVISION
    num_ops: int = 2
    magnitude: float = 9
    num_magnitude_bins: int = 31
    mstd: float = 0.0
    mmax: float = _LEVEL_DENOM
    increasing: bool = False
    prob: float = 1.0
    weighted: bool = False
    table: Table = Table.IMAGENET
    fill: tuple[int, int, int] = (0, 0, 0)
    interpolation: PolicyInterpolation = PolicyInterpolation.NEAREST
    translate_pct: float = 0.45
    translate_const: float = 250.0
    _choices: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # strings become the enums, which the draws and kernels compare by identity
        for name, kind in (("policy", Policy), ("family", Family), ("table", Table),
                           ("interpolation", PolicyInterpolation)):
            object.__setattr__(self, name, choice(kind, getattr(self, name), f"auto-augment {name}"))
        tv = self.family is Family.TORCHVISION
        if self.policy is Policy.AUTO_IMAGENET and tv != (self.table is Table.IMAGENET):
            raise ConfigError(f"auto-augment table {self.table} does not belong to {self.family}")
        if self.policy is Policy.RAND and self.num_ops < 0:
            raise ConfigError(f"auto-augment num_ops must be >= 0, got {self.num_ops}")
        if tv and self.policy is Policy.RAND and not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ConfigError(f"auto-augment magnitude {self.magnitude} is not a bin below "
                              f"num_magnitude_bins {self.num_magnitude_bins}")
        if not 0.0 <= self.prob <= 1.0:
            raise ConfigError(f"auto-augment prob must be in [0, 1], got {self.prob}")
        if len(self.fill) != 3 or not all(0 <= f <= 255 for f in self.fill):
            raise ConfigError(f"auto-augment fill must be three values in 0..255, got {self.fill}")
        choices: tuple[str, ...]
        if self.policy is Policy.TRIVIAL_WIDE:
            choices = _TV_RAND_OPS
        elif self.policy is Policy.RAND:
            choices = (_TV_RAND_OPS if tv else tuple(_TIMM_WEIGHTS) if self.weighted
                       else _TIMM_RAND_INC if self.increasing else _TIMM_RAND)
        else:
            choices = ()
        object.__setattr__(self, "_choices", choices)

    # -- parsing ---------------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, hparams: Mapping[str, Any] | None = None) -> AutoAugment:
        """A policy from torchvision's names or timm's config strings.

        Parameters
        ----------
        text : str
            torchvision: ``ta_wide`` (TrivialAugmentWide), ``ra`` (RandAugment, num_ops 2,
            magnitude 9), ``imagenet`` (AutoAugment's ImageNet policy). timm: ``rand-...``
            with sections ``m``, ``n``, ``p``, ``mstd``, ``mmax``, ``inc``, ``tweights``;
            ``original``, ``originalr``, ``v0``, ``v0r`` with an optional ``mstd`` section.
        hparams : mapping, optional
            timm's hparams: ``img_mean`` (fill), ``translate_pct``, ``translate_const``,
            ``interpolation`` (``nearest``, ``bilinear``, ``bicubic`` or ``random``), ``magnitude_std``,
            ``magnitude_max``. Without ``interpolation`` timm strings take timm's own default,
            ``random``: bilinear or bicubic per op slot and sample.

        Returns
        -------
        AutoAugment

        Raises
        ------
        ConfigError
            For AugMix, timm's ``3a`` sets, the removed ``w`` section, lanczos interpolation,
            and anything else that is not supported, naming it.
        """
        return cls(**policy_settings(text, hparams))

    # -- what the graph takes --------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Op slots per sample, applied one after another."""
        return {Policy.TRIVIAL_WIDE: 1, Policy.RAND: self.num_ops, Policy.AUTO_IMAGENET: 2}[self.policy]

    def ops(self) -> tuple[Op, ...]:
        """The ops this policy can apply, identity included (a skipped op is the identity)."""
        if self.policy is Policy.AUTO_IMAGENET:
            names = {name for sub in self._table() for name, _, _ in sub}
        else:
            names = set(self._choices)
        used = {self._op_of(name) for name in names} | {Op.IDENTITY}
        return tuple(op for op in OPS if op in used)

    def input_names(self) -> tuple[str, ...]:
        """Names of the per-sample inputs ``draw`` returns, in the graph's order: ``aa_filter``
        only under ``PolicyInterpolation.RANDOM`` (a fixed filter needs no per-sample input)."""
        return INPUT_NAMES if self.interpolation is PolicyInterpolation.RANDOM else INPUT_NAMES[:3]

    # -- draws -----------------------------------------------------------------------------------

    def draw(self, seed: int, epoch: int, keys: np.ndarray,
             size: int | tuple[int, int] | np.ndarray = 224) -> dict[str, np.ndarray]:
        """Per sample: which op each slot applies, its parameter and its affine matrix.

        Parameters
        ----------
        seed, epoch : int
            The run's seed and the epoch.
        keys : ndarray
            One key per sample (the same keys the crops are drawn from); a sample's draws depend
            on (seed, epoch, key) alone, whatever batch it is in.
        size : int, (h, w) or ndarray (n, 2)
            The size of the images the ops see (after crop and resize): translations scale
            with it and rotations turn about its centre.

        Returns
        -------
        dict of str to ndarray
            ``aa_op`` (n, slots) int32 index into ``OPS``; ``aa_param`` (n, slots) float32:
            the enhance factor (brightness, color, contrast, sharpness), the posterize bit mask,
            the solarize threshold (pixels at or above it are inverted), the solarize-add
            amount, else 0; ``aa_matrix`` (n, slots, 2, 3) float32: for geometric ops the map
            from output to input pixel coordinates (origin at the first pixel's corner), else
            the identity; under ``PolicyInterpolation.RANDOM`` also ``aa_filter`` (n, slots) int32:
            index into ``RANDOM_FILTERS`` of each slot's filter (drawn for every slot, as timm
            draws one per op call; only the geometric ops use it).
        """
        keys = np.asarray(keys)
        n, slots = len(keys), self.slots
        hw = np.broadcast_to(np.asarray(size, dtype=np.float64), (n, 2)) if np.ndim(size) != 0 \
            else np.full((n, 2), float(np.asarray(size)))
        u = uniforms(stream_seed(seed, STREAM), epoch, keys, 1 + _PER_SLOT * max(slots, 1))
        chosen, strength, sign = self._choose(u, n)
        ops = np.zeros((n, slots), np.int32)
        params = np.zeros((n, slots), np.float32)
        matrices = np.broadcast_to(np.eye(2, 3, dtype=np.float32), (n, slots, 2, 3)).copy()
        for i in range(n):
            for k in range(slots):
                name = chosen[i][k]
                if name is None:
                    continue
                op, param, shift = self._param(name, strength[i, k], sign[i, k], hw[i])
                ops[i, k] = OPS.index(op)
                params[i, k] = param
                if op in GEOMETRIC:
                    matrices[i, k] = _matrix(op, shift, hw[i], self.family)
        made = {"aa_op": ops, "aa_param": params, "aa_matrix": matrices}
        if self.interpolation is PolicyInterpolation.RANDOM:
            made["aa_filter"] = self.filters(seed, epoch, keys)
        return made

    def filters(self, seed: int, epoch: int, keys: np.ndarray) -> np.ndarray:
        """Per sample and slot, the index into ``RANDOM_FILTERS`` of the geometric ops' filter
        (timm's ``random.choice``: even odds), from (seed, epoch, key) on ``FILTER_STREAM``.

        Parameters
        ----------
        seed, epoch : int
            The run's seed and the epoch.
        keys : ndarray
            One key per sample.

        Returns
        -------
        ndarray
            (n, slots) int32.
        """
        keys = np.asarray(keys)
        u = uniforms(stream_seed(seed, FILTER_STREAM), epoch, keys, max(self.slots, 1))[:, :self.slots]
        n = len(RANDOM_FILTERS)
        return np.minimum((u * n).astype(np.int64), n - 1).astype(np.int32)

    def _choose(self, u: np.ndarray, n: int) -> tuple[list[list[str | None]], np.ndarray, np.ndarray]:
        """Op names per slot (None: skipped), the level or magnitude bin, and the sign (+1/-1)."""
        slots = self.slots
        per = u[:, 1:1 + _PER_SLOT * max(slots, 1)].reshape(n, max(slots, 1), _PER_SLOT)[:, :slots]
        pick, p_apply, m1, m2, s = (per[..., j] for j in range(_PER_SLOT))
        # torchvision negates when rand <= 0.5; timm when random() > 0.5: both a fair coin
        sign = np.where(s < 0.5, -1.0, 1.0)
        chosen: list[list[str | None]] = [[None] * slots for _ in range(n)]
        strength = np.zeros((n, slots))
        tv = self.family is Family.TORCHVISION
        if self.policy is Policy.AUTO_IMAGENET:
            table = self._table()
            sub = np.minimum((u[:, 0] * len(table)).astype(np.int64), len(table) - 1)
            for i in range(n):
                for k, (name, p, m) in enumerate(table[sub[i]]):
                    if p_apply[i, k] <= p:  # torchvision: rand <= p; timm skips when random() > p
                        chosen[i][k] = name
                        strength[i, k] = (m if m is not None else 0) if tv else \
                            self._noisy(m, m1[i, k], m2[i, k])
            return chosen, strength, sign
        names = self._choices
        if self.weighted:
            weights = np.array([_TIMM_WEIGHTS[c] for c in names], dtype=np.float64)
            for i in range(n):
                left = weights.copy()
                for k in range(slots):  # without replacement, as numpy's choice(replace=False)
                    cdf = np.cumsum(left) / left.sum()
                    j = min(int(np.searchsorted(cdf, pick[i, k], side="right")), len(names) - 1)
                    left[j] = 0.0
                    chosen[i][k] = names[j]
        else:
            idx = np.minimum((pick * len(names)).astype(np.int64), len(names) - 1)
            for i in range(n):
                chosen[i] = [names[j] for j in idx[i]]
        if tv:
            if self.policy is Policy.TRIVIAL_WIDE:  # magnitude bin uniform over the bins
                strength = np.minimum((m1 * self.num_magnitude_bins).astype(np.int64),
                                      self.num_magnitude_bins - 1).astype(np.float64)
            else:
                strength[:] = self.magnitude
        else:
            for i in range(n):
                for k in range(slots):
                    if self.prob < 1.0 and p_apply[i, k] > self.prob:  # timm: skip when random() > p
                        chosen[i][k] = None
                    else:
                        strength[i, k] = self._noisy(self.magnitude, m1[i, k], m2[i, k])
        return chosen, strength, sign

    def _noisy(self, level: float, u1: float, u2: float) -> float:
        """timm's magnitude noise: Gaussian (Box-Muller of two uniforms) or uniform, then clipped."""
        if self.mstd == math.inf:
            level = u1 * level
        elif self.mstd > 0:
            level = level + self.mstd * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
        return max(0.0, min(level, self.mmax or _LEVEL_DENOM))

    def _table(self) -> tuple[tuple[tuple[str, float, int | None], ...], ...]:
        return _TV_IMAGENET if self.table is Table.IMAGENET else _TIMM_TABLES[self.table]

    def _op_of(self, name: str) -> Op:
        return _TV_NAMES[name] if self.family is Family.TORCHVISION else _TIMM_NAMES[name][0]

    def _param(self, name: str, strength: float, sign: float, hw: np.ndarray) -> tuple[Op, float, float]:
        """(op, scalar parameter, geometric amount) for one applied op."""
        if self.family is Family.TORCHVISION:
            return _tv_param(name, strength, sign, hw, self.policy is Policy.TRIVIAL_WIDE, self._bins())
        return _timm_param(name, strength, sign, hw, self.translate_pct, self.translate_const)

    def _bins(self) -> int:
        return 10 if self.policy is Policy.AUTO_IMAGENET else self.num_magnitude_bins
