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

from tessera.cost.tables import MeasuredTable, Roofline, unit_terms
from tessera.hardware import GpuSpec

SCALE = 0.35  # distance at which a GPU's weight falls by e (tuned on leave-one-GPU-out, see docs/cost.md)


RIDGE = 0.1  # on the efficiency slopes: ten GPUs do not pin down a line in two features
OTHER_VENDOR = 0.1  # weight of another vendor's GPU in that fit


def features(g: GpuSpec) -> np.ndarray:
    """Datasheet features the efficiencies are regressed on: log dense bf16 TFLOP/s per SM and log bytes
    of bandwidth per FLOP (how much a kernel of given intensity leans on memory)."""
    peak = g.peak("bfloat16")
    return np.array([math.log(peak / g.sms / 1e12), math.log(g.mem_bw_bytes_per_s / peak)])


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
    """One measured GPU's table, with its fitted roofline (``table.roofline``)."""

    table: MeasuredTable

    @property
    def roofline(self) -> Roofline:
        return self.table.roofline

    def log_residual(self, key: tuple[int, ...]) -> float:
        """log(measured / fitted roofline) at ``key``, interpolated in the table as everywhere."""
        return self.table.log_ratio(key)


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
        """Efficiencies from a weighted least-squares line in datasheet features over the sources (ridge
        RIDGE on the slopes); launch overhead as the weighted geometric mean."""
        x = np.array([features(s.table.gpu) for s in self.sources])  # [S, F]
        y = np.log([[s.roofline.compute_eff, s.roofline.memory_eff] for s in self.sources])  # [S, 2]
        sw = np.sqrt(np.array([1.0 if s.table.gpu.vendor == self.target.vendor else OTHER_VENDOR
                               for s in self.sources]))
        mean = np.average(x, axis=0, weights=sw**2)
        a = np.hstack([np.ones((len(x), 1)), x - mean]) * sw[:, None]
        reg = np.diag([0.0] + [RIDGE] * x.shape[1])
        coef = np.linalg.solve(a.T @ a + reg, a.T @ (y * sw[:, None]))
        c, m = np.exp(np.hstack([1.0, features(self.target) - mean]) @ coef)
        launch = np.exp(self.weights @ np.log([s.roofline.launch_s + 1e-7 for s in self.sources])) - 1e-7
        return Roofline(compute_eff=float(c), memory_eff=float(m), launch_s=max(0.0, float(launch)))

    def time_s(self, key: tuple[int, ...], kv_len: int | None = None) -> float:
        name = self.sources[0].table.name
        q = None if kv_len is None else np.array([float(kv_len)])
        c, m = unit_terms(name, np.array([key]), self.target, kv_len=q)
        residual = sum(w * s.log_residual(key) for w, s in zip(self.weights, self.sources, strict=True))
        return float(self.roofline.time_s(c, m)[0]) * math.exp(residual)
