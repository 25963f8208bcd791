"""MoE kernel times: monotone in tokens at every query, and balanced-routing tables for a GPU whose measured
MoE rows use power-law routing only (A100, Arc Pro B60).

Monotone queries. A table's own rows are repaired (``tables.monotone_in_tokens``), but a query between grid
points, or at a model shape the grid lacks, blends neighbouring rows' departures from the roofline, and a
transfer blends several GPUs': either can dip as tokens grow (up to 30 % where the set of grid corners
changes).
``TokenCurve`` takes, for one GPU and model shape, the time at every token grid value, repairs it the same way
and interpolates log-log between neighbours, so the answer never falls as tokens grow.

Routing.
 AIConfigurator times each MoE shape (tokens, hidden, inter, topk, experts) under balanced routing and under
power-law routing (exponent 1.2). How much faster or slower the power-law rows run depends on the shape's
routing (how many tokens each expert gets, how many experts are hit), not on the GPU: predicting each of the
eight GPUs that have both from its own power-law rows times the other seven's mean log ratio errs 2-5 %
median (``aic_validate.validate_routing``; bench/results/cost_aic.md). So a GPU with power-law rows only gets,
at every shape some other GPU measured both ways,

    balanced(s) = power_law(s) * exp(mean over those GPUs of log(balanced_h(s) / power_law_h(s))),

and shapes no GPU measured both ways are left out of its table (interpolated there like any grid point a
table lacks). Both inputs are monotone-repaired tables (``tables.monotone_in_tokens``), and so is the result.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.cost.tables import MeasuredTable, monotone_in_tokens

Shape = tuple[int, ...]


def routing_log_ratios(pairs: Sequence[tuple[MeasuredTable, MeasuredTable]]) -> dict[Shape, float]:
    """Per shape, the mean of log(balanced / power-law) over the (balanced, power-law) table pairs, one pair
    per GPU, at the shapes both tables of a pair hold."""
    logs: dict[Shape, list[float]] = defaultdict(list)
    for balanced, power_law in pairs:
        bal = {tuple(int(v) for v in p): t for p, t in zip(balanced.points, balanced.time_s, strict=True)}
        for p, t in zip(power_law.points, power_law.time_s, strict=True):
            key = tuple(int(v) for v in p)
            if key in bal:
                logs[key].append(float(np.log(bal[key] / t)))
    return {k: float(np.mean(v)) for k, v in logs.items()}


def balanced_from_power_law(power_law: MeasuredTable, log_ratios: dict[Shape, float]) -> MeasuredTable:
    """``power_law``'s rows at the shapes ``log_ratios`` covers, carried to balanced routing (module doc)."""
    keys = [tuple(int(v) for v in p) for p in power_law.points]
    keep = np.array([k in log_ratios for k in keys], dtype=bool)
    if not keep.any():
        raise ValueError(f"{power_law.gpu.name}: no power-law MoE shape was also measured balanced elsewhere")
    points = power_law.points[keep]
    ratio = np.exp([log_ratios[k] for k, kept in zip(keys, keep, strict=True) if kept])
    time_s = monotone_in_tokens(points, power_law.time_s[keep] * ratio)
    return MeasuredTable(name="moe", gpu=power_law.gpu, points=points, time_s=time_s, cache=power_law.cache)


@dataclass(frozen=True, kw_only=True)
class TokenCurve:
    """One GPU's MoE time against tokens at one model shape: ``time_s`` at the ascending ``tokens`` grid,
    repaired to be non-decreasing (the running minimum from above)."""

    tokens: np.ndarray = field(hash=False)
    time_s: np.ndarray = field(hash=False)

    @classmethod
    def of(cls, tokens: np.ndarray, raw: Callable[[int], float]) -> TokenCurve:
        """The curve through ``raw`` (seconds at a token count) at the grid ``tokens``, repaired."""
        grid = np.unique(np.asarray(tokens, dtype=np.int64))
        times = np.array([raw(int(t)) for t in grid])
        return cls(tokens=grid, time_s=np.minimum.accumulate(times[::-1])[::-1])

    def at(self, tokens: int, raw: Callable[[int], float]) -> float:
        """Seconds at ``tokens``: log-log between the neighbouring grid values; past the grid's ends ``raw``
        (the table's roofline scaling), held at or above the last value and at or below the first."""
        t, grid = float(tokens), self.tokens
        if t >= grid[-1]:
            return max(raw(tokens), float(self.time_s[-1]))
        if t <= grid[0]:
            return min(raw(tokens), float(self.time_s[0]))
        j = int(np.searchsorted(grid, t))  # grid[j-1] < t <= grid[j]
        lo, hi = float(grid[j - 1]), float(grid[j])
        w = (math.log(t) - math.log(lo)) / (math.log(hi) - math.log(lo))
        a, b = float(self.time_s[j - 1]), float(self.time_s[j])
        return min(b, max(a, a * (b / a) ** w))  # exactly a where a == b: no rounding dip
