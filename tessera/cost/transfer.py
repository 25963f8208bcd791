"""Kernel times on a GPU without measured tables, carried over from the GPUs that have them.

Per measured GPU h and table (gemm, context/generation attention, moe), a roofline is fitted:
``fit_h(s) = launch_h + max(compute_s(s) / ce_h, memory_s(s) / me_h)`` (``unit_terms`` at efficiency 1).
What that roofline misses at a given shape, ``rho_h(s) = measured_h(s) / fit_h(s)``, is mostly a property of
the shape (tile shapes, kernel choice, split-K) shared across GPUs. For a target GPU g,

    time_g(s) = fit_g(s) * exp(sum_h w_h log rho_h(s) / sum_h w_h),

where g's efficiencies come from a weighted least-squares line in datasheet features over the measured
GPUs, its launch floor from theirs in clock cycles (a small kernel's prologue, one k step and epilogue are a
fixed number of cycles: launch_h x clock_h, scaled to g's clock), and
``w_h = exp(-distance(g, h) / scale)`` weighs GPUs that look alike on their datasheets (log dense bf16
peak, log memory bandwidth, the memory's family (HBM or GDDR), vendor) more. The two constants (``scale``,
``ridge``) are ``TransferConstants``, chosen by leave-one-GPU-out (nested inside each fold for the accuracy
figures: ``aic_validate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tessera.cost.tables import MeasuredTable, Roofline
from tessera.hardware import GpuSpec

OTHER_VENDOR = 0.1  # weight of another vendor's GPU in the efficiency fit
TINY_S = 1e-7  # added to launch floors before taking logs (a fitted floor may be 0)


@dataclass(frozen=True, kw_only=True)
class TransferConstants:
    scale: float  # distance at which a source GPU's weight falls by e
    ridge: float  # on the efficiency slopes: ten GPUs do not pin down a line in two features

    def __post_init__(self) -> None:
        if not (self.scale > 0 and self.ridge >= 0):
            raise ValueError(f"transfer scale={self.scale} must be > 0 and ridge={self.ridge} >= 0")


# per table, chosen by leave-one-GPU-out over the measured GPUs with that table (bench/bench_cost_aic.py; the
# accuracy it reports chooses them again inside each fold)
TABLE_CONSTANTS = {"gemm": TransferConstants(scale=0.5, ridge=0.3),
                   "context_attention": TransferConstants(scale=0.25, ridge=0.03),
                   "generation_attention": TransferConstants(scale=0.35, ridge=0.03),
                   "moe": TransferConstants(scale=0.25, ridge=0.3)}
TABLE_CONSTANTS["moe_power_law"] = TABLE_CONSTANTS["moe"]  # the same kernels, other routing (validation only)
TABLE_CONSTANTS["gemm_fp8"] = TransferConstants(scale=0.7, ridge=0.3)  # over the nine GPUs with fp8 GEMMs
TABLE_CONSTANTS["moe_fp8_block"] = TransferConstants(scale=0.35, ridge=0.3)  # the seven with fp8 MoE
DEFAULT_CONSTANTS = TransferConstants(scale=0.35, ridge=0.1)  # a table without its own


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
class TableTransfer:
    """Carries measured tables over to a GPU without them: predicts one table's kernels on ``target`` from the
    measured GPUs in ``sources``."""

    target: GpuSpec
    sources: tuple[Measured, ...] = field(hash=False)
    constants: TransferConstants = DEFAULT_CONSTANTS

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError(f"transfer to {self.target.name}: no measured GPU to carry over from")

    @cached_property
    def weights(self) -> np.ndarray:
        w = np.array([math.exp(-distance(self.target, s.table.gpu) / self.constants.scale)
                      for s in self.sources])
        return w / w.sum()

    @cached_property
    def roofline(self) -> Roofline:
        """Efficiencies from a weighted least-squares line in datasheet features over the sources (ridge
        on the slopes); launch floor from the sources' in clock cycles."""
        x = np.array([features(s.table.gpu) for s in self.sources])  # [S, F]
        y = np.log([[s.roofline.compute_eff, s.roofline.memory_eff] for s in self.sources])  # [S, 2]
        sw = np.sqrt(np.array([1.0 if s.table.gpu.vendor == self.target.vendor else OTHER_VENDOR
                               for s in self.sources]))
        mean = np.average(x, axis=0, weights=sw**2)
        a = np.hstack([np.ones((len(x), 1)), x - mean]) * sw[:, None]
        reg = np.diag([0.0] + [self.constants.ridge] * x.shape[1])
        coef = np.linalg.solve(a.T @ a + reg, a.T @ (y * sw[:, None]))
        c, m = np.exp(np.hstack([1.0, features(self.target) - mean]) @ coef)
        return Roofline(compute_eff=float(c), memory_eff=float(m), launch_s=self.launch_s())

    def launch_s(self) -> float:
        """The sources' launch floors as the w-weighted geometric mean, each scaled by its clock over the
        target's (cycles carry over, seconds do not); unscaled where either clock is not in the catalog."""
        to = self.target.boost_clock_hz
        factor = np.array([s.table.gpu.boost_clock_hz / to if to > 0 and s.table.gpu.boost_clock_hz > 0 else 1.0
                           for s in self.sources])
        floors = np.array([s.roofline.launch_s for s in self.sources]) * factor  # at the target's clock
        return max(0.0, float(np.exp(self.weights @ np.log(floors + TINY_S))) - TINY_S)

    def times_s(self, points: np.ndarray, log_residuals: np.ndarray, kv_len: np.ndarray | None = None
                ) -> np.ndarray:
        """Seconds at shapes ``points`` [N, d], given each source's log residual there [S, N]."""
        c, m = self.sources[0].table.unit_terms(points, self.target, kv_len=kv_len)
        return self.roofline.time_s(c, m) * np.exp(self.weights @ log_residuals)

    def time_s(self, key: tuple[int, ...], kv_len: int | None = None) -> float:
        q = None if kv_len is None else np.array([float(kv_len)])
        residuals = np.array([[s.log_residual(key)] for s in self.sources])
        return float(self.times_s(np.array([key]), residuals, kv_len=q)[0])
