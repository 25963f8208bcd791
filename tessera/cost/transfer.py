"""Kernel times on a GPU without measured tables, carried over from the GPUs that have them.

Per measured GPU h and table (gemm, context/generation attention, moe), a roofline is fitted:
``fit_h(s) = launch_h + max(compute_s(s) / ce_h, memory_s(s) / me_h)`` (``unit_terms`` at efficiency 1).
What that roofline misses at a given shape, ``rho_h(s) = measured_h(s) / fit_h(s)``, is mostly a property of
the shape (tile shapes, kernel choice, split-K) shared across GPUs. For a target GPU g,

    time_g(s) = fit_g(s) * exp(sum_h w_h log rho_h(s) / sum_h w_h),

where g's efficiencies and launch are the w-weighted geometric means of the measured GPUs', and
``w_h = exp(-distance(g, h) / SCALE)`` weighs GPUs that look alike on their datasheets (log dense bf16
peak, log memory bandwidth, the memory's family (HBM or GDDR), vendor) more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tessera.cost.tables import MeasuredTable, unit_terms
from tessera.hardware import GpuSpec

SCALE = 0.35  # distance at which a GPU's weight falls by e (tuned on leave-one-GPU-out, see docs/cost.md)
FIT_ROWS = 3000  # rows (evenly spaced) a per-GPU roofline is fitted on: enough for three parameters
_COMPUTE = (0.02, 1.5)  # search ranges: efficiencies as fractions of peak, launch in seconds
_MEMORY = (0.02, 1.5)
_LAUNCH_S = (0.0, 40e-6)


@dataclass(frozen=True, kw_only=True)
class Roofline:
    compute_eff: float
    memory_eff: float
    launch_s: float

    def __post_init__(self) -> None:
        if not (self.compute_eff > 0 and self.memory_eff > 0 and self.launch_s >= 0):
            raise ValueError(f"roofline compute_eff={self.compute_eff} memory_eff={self.memory_eff} "
                             f"launch_s={self.launch_s}: efficiencies must be > 0, launch >= 0")

    def time_s(self, compute_s: np.ndarray, memory_s: np.ndarray) -> np.ndarray:
        return self.launch_s + np.maximum(compute_s / self.compute_eff, memory_s / self.memory_eff)


def fit_roofline(compute_s: np.ndarray, memory_s: np.ndarray, measured_s: np.ndarray) -> Roofline:
    """The (compute eff, memory eff, launch) minimising mean |log(fit / measured)|: a 17^3 grid refined
    twice around its best point (three parameters, so exhaustive search is cheap and has no local minima)."""
    lo = np.array([_COMPUTE[0], _MEMORY[0], _LAUNCH_S[0]])
    hi = np.array([_COMPUTE[1], _MEMORY[1], _LAUNCH_S[1]])
    best = (lo + hi) / 2
    for _ in range(3):
        c, m, launch = (np.linspace(lo[i], hi[i], 17) for i in range(3))
        base = np.maximum(compute_s[None, None, :] / c[:, None, None], memory_s[None, None, :] / m[None, :, None])
        loss = np.stack([np.abs(np.log((base + x) / measured_s)).mean(axis=-1) for x in launch], axis=-1)
        i, j, k = np.unravel_index(np.argmin(loss), loss.shape)
        best = np.array([c[i], m[j], launch[k]])
        step = (hi - lo) / 16
        lo, hi = np.maximum(best - 2 * step, [1e-3, 1e-3, 0.0]), best + 2 * step
    return Roofline(compute_eff=float(best[0]), memory_eff=float(best[1]), launch_s=float(best[2]))


def distance(a: GpuSpec, b: GpuSpec) -> float:
    """Datasheet dissimilarity: |log peak ratio| + |log bandwidth ratio| + 1 per differing memory family
    or vendor."""
    def family(g: GpuSpec) -> str:
        return "hbm" if g.memory_type.upper().startswith("HBM") else "gddr"

    return (abs(math.log(a.peak("bfloat16") / b.peak("bfloat16")))
            + abs(math.log(a.mem_bw_bytes_per_s / b.mem_bw_bytes_per_s))
            + (family(a) != family(b)) + (a.vendor != b.vendor))


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One measured GPU's table and its fitted roofline."""

    table: MeasuredTable
    fitted: Roofline | None = None  # a fit of this table done before (shipped): skips refitting

    @cached_property
    def roofline(self) -> Roofline:
        if self.fitted is not None:
            return self.fitted
        t = self.table
        rows = np.linspace(0, len(t.time_s) - 1, min(FIT_ROWS, len(t.time_s))).astype(int)
        c, m = unit_terms(t.name, t.points[rows], t.gpu)
        return fit_roofline(c, m, t.time_s[rows])

    def log_residual(self, key: tuple[int, ...], q_len: int | None) -> float:
        """log(measured / fitted roofline) at ``key``, the table interpolated as everywhere."""
        q = None if q_len is None else np.array([float(q_len)])
        c, m = unit_terms(self.table.name, np.array([key]), self.table.gpu, q_len=q)
        return math.log(self.table.time_at(key, q_len=q_len) / float(self.roofline.time_s(c, m)[0]))


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """Predicts one table's kernels on ``target`` from the measured GPUs in ``sources``."""

    target: GpuSpec
    sources: tuple[Measured, ...] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError(f"transfer to {self.target.name}: no measured GPU to carry over from")

    @cached_property
    def weights(self) -> np.ndarray:
        w = np.array([math.exp(-distance(self.target, s.table.gpu) / SCALE) for s in self.sources])
        return w / w.sum()

    @cached_property
    def roofline(self) -> Roofline:
        logs = np.array([[math.log(s.roofline.compute_eff), math.log(s.roofline.memory_eff),
                          math.log(s.roofline.launch_s + 1e-7)] for s in self.sources])
        c, m, launch = np.exp(self.weights @ logs)
        return Roofline(compute_eff=float(c), memory_eff=float(m), launch_s=max(0.0, float(launch) - 1e-7))

    def time_s(self, key: tuple[int, ...], q_len: int | None = None) -> float:
        name = self.sources[0].table.name
        q = None if q_len is None else np.array([float(q_len)])
        c, m = unit_terms(name, np.array([key]), self.target, q_len=q)
        residual = sum(w * s.log_residual(key, q_len) for w, s in zip(self.weights, self.sources, strict=True))
        return float(self.roofline.time_s(c, m)[0]) * math.exp(residual)
