"""How sure a measured speed-up is: two schedules served back to back several times, their throughput ratio
as the geometric mean of the per-repeat pairs with a one-sided lower confidence bound.

A shared machine drifts by ±10% between runs a minute apart, so one pair of runs says little. Each repeat
runs both schedules back to back (ABBA order), which pairs runs that met the same load; the log of a pair's
ratio is then treated as one sample of a normal variable, and the bound is Student's t on their mean
(n − 1 degrees of freedom). A ratio clears a threshold when its lower bound does, not its median.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def _t_cdf_above_zero(t: float, df: int, steps: int = 2000) -> float:
    """P(0 ≤ T ≤ t) for Student's t with ``df`` degrees of freedom, by Simpson's rule over its density
    (smooth and unimodal: 2000 steps reproduce printed tables' 3 decimals up to p = 0.999, t = 318.309)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = lambda x: math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))  # noqa: E731
    h = t / steps
    odd = sum(pdf((2 * i - 1) * h) for i in range(1, steps // 2 + 1))
    even = sum(pdf(2 * i * h) for i in range(1, steps // 2))
    return h / 3 * (pdf(0.0) + 4 * odd + 2 * even + pdf(t))


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom, for 0.5 ≤ p ≤ 0.999 (bisection on the
    CDF; 1.533 for p = 0.9, df = 4 as printed tables give)."""
    if not 0.5 <= p <= 0.999 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p <= 0.999 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while 0.5 + _t_cdf_above_zero(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 + _t_cdf_above_zero(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True, kw_only=True)
class PairedRatio:
    """``a`` over ``b`` from paired runs: each pair's ratio, their geometric mean and its one-sided lower
    bound at ``confidence`` (None with a single pair: nothing to estimate the spread from)."""

    pairs: tuple[float, ...]
    geomean: float
    lower: float | None
    confidence: float

    def __post_init__(self) -> None:
        if not self.pairs or not all(r > 0 for r in self.pairs):  # `not >` also catches NaN
            raise ValueError(f"PairedRatio needs positive pair ratios, got {self.pairs}")
        if (self.lower is None) != (len(self.pairs) == 1) or (self.lower or 0) > self.geomean * (1 + 1e-12):
            raise ValueError(f"PairedRatio's bound {self.lower} must be None for one pair and at most the "
                             f"geometric mean {self.geomean} otherwise ({len(self.pairs)} pairs)")
        if not 0.5 <= self.confidence <= 0.999:
            raise ValueError(f"confidence must be in [0.5, 0.999], got {self.confidence}")


def paired_ratio(a: list[float], b: list[float], confidence: float = 0.9) -> PairedRatio:
    """The ratio a/b of two schedules' throughputs, run i of each paired (they ran back to back)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio needs as many runs of each, at least one; got {len(a)} and {len(b)}")
    if not 0.5 <= confidence <= 0.999:
        raise ValueError(f"confidence must be in [0.5, 0.999], got {confidence}")
    if not all(x > 0 for x in (*a, *b)):  # `not >` also catches NaN
        raise ValueError(f"paired_ratio needs positive throughputs, got {a} and {b}")
    pairs = tuple(x / y for x, y in zip(a, b, strict=True))
    logs = [math.log(r) for r in pairs]
    mean = statistics.fmean(logs)
    lower = None
    if len(logs) > 1:
        se = statistics.stdev(logs) / math.sqrt(len(logs))
        lower = math.exp(mean - t_quantile(confidence, len(logs) - 1) * se)
    return PairedRatio(pairs=pairs, geomean=math.exp(mean), lower=lower, confidence=confidence)


__all__ = ["PairedRatio", "paired_ratio", "t_quantile"]
