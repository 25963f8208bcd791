"""Per-kernel time on a GPU type: roofline per kernel class with efficiencies and launch overhead.

Interface used by plan, sim and report: ``CostModel.kernel_time_s(kernel, gpu)`` and
``CostModel.transfer_time_s(nbytes, link)``. ``tessera.cost.default_cost_model()`` returns the
calibrated instance (efficiencies fitted on the shipped profiles, measured GEMM tables loaded).

time = launch_s + max(compute_s, memory_s), where
  memory_s  = bytes moved / (memory bandwidth * memory efficiency)
  compute_s = FLOPs / (dense peak for the dtype * compute efficiency), except for GEMMs, which run
              in waves of output tiles (tile quantisation + wave quantisation over the SMs):
              tiles = ceil(m / tile_m) * ceil(n / tile_n) * batch, waves = ceil(tiles / sms),
              compute_s = waves * 2 * tile_m * tile_n * k / (peak / sms * compute efficiency);
              tile_n = 128 and tile_m = next power of two >= m in [16, 128] (small-m kernels pick
              thin tiles). So a 1-token GEMM pays for 16 rows and a GEMM with 109 tiles on a
              108-SM GPU pays for two waves: small and ragged GEMMs do not reach peak.
              Split-K: where the tiles fill under one wave, k is cut into s slices run side by side
              (as cuBLAS does for skinny GEMMs), s = min(sms // tiles, k // SPLIT_K_MIN_K): the wave
              then costs one tile over ceil(k / s), and memory gains the fp32 partial sums, written
              and read back once (2 * s * m * n * 4 bytes). A router GEMM (n = 256 experts, k = 7168)
              would otherwise pay a whole k loop on 2 of 132 SMs.
Measured kernel tables override the roofline, in this order: AIConfigurator's tables (``aic``: GEMM,
context and generation attention, MoE; interpolated on a GPU with tables, transferred to one without,
see aic.py), then Vidur's GEMM tables for the GPU where they have the kernel's (n, k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tessera.cost.aic import AicCosts
from tessera.cost.profiles import GemmTable
from tessera.graph import Kernel, KernelKind
from tessera.hardware import GpuSpec, LinkSpec

TILE_N = 128
TILE_M_MAX = 128
TILE_M_MIN = 16
SPLIT_K_MIN_K = 256  # fewest k per split-K slice: four 64-deep k steps, so a slice still pipelines its loads
PARTIAL_BYTES = 4  # split-K partial sums are fp32


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    compute: float  # fraction of dense peak reached
    memory: float  # fraction of peak memory bandwidth reached
    launch_s: float | None = None  # per-kernel launch + tail overhead; None: the model's launch_s

    def __post_init__(self) -> None:
        if not (0 < self.compute <= 1.5 and 0 < self.memory <= 1.5):
            raise ValueError(f"efficiency compute={self.compute} memory={self.memory} must be in (0, 1.5]")
        if self.launch_s is not None and self.launch_s < 0:
            raise ValueError(f"efficiency launch_s={self.launch_s} must be >= 0")


# Prior values, used for kinds no profile covers (attention, scan, conv, copy on the shipped GPU data):
# engineering estimates, not measurements; the calibrated model replaces the kinds it has data for.
DEFAULT_EFFICIENCY: dict[KernelKind, Efficiency] = {
    KernelKind.GEMM: Efficiency(compute=0.7, memory=0.8),
    KernelKind.ATTENTION: Efficiency(compute=0.5, memory=0.7),
    KernelKind.ATTENTION_DECODE: Efficiency(compute=0.3, memory=0.7),
    KernelKind.ELEMENTWISE: Efficiency(compute=0.3, memory=0.8),
    KernelKind.NORM: Efficiency(compute=0.3, memory=0.7),
    KernelKind.EMBEDDING: Efficiency(compute=0.3, memory=0.6),
    KernelKind.MOE_ROUTING: Efficiency(compute=0.3, memory=0.6),
    KernelKind.SCAN: Efficiency(compute=0.2, memory=0.5),
    KernelKind.CONV: Efficiency(compute=0.4, memory=0.6),
    KernelKind.COPY: Efficiency(compute=0.3, memory=0.8),
    KernelKind.OTHER: Efficiency(compute=0.2, memory=0.5),
}


def gemm_waves(m: int, n: int, batch: int, sms: int) -> tuple[int, int, int]:
    """(tile_m, tiles, waves) of a [batch x] m x n output on ``sms`` SMs."""
    tile_m = min(TILE_M_MAX, max(TILE_M_MIN, 1 << max(0, m - 1).bit_length()))
    tiles = math.ceil(m / tile_m) * math.ceil(n / TILE_N) * max(1, batch)
    return tile_m, tiles, math.ceil(tiles / sms)


def split_k(tiles: int, k: int, sms: int) -> int:
    """Slices of k that ``tiles`` output tiles run in: as many as fill the SMs, each at least SPLIT_K_MIN_K
    deep, where the tiles alone fill under one wave; else 1."""
    if tiles >= sms:
        return 1
    return max(1, min(sms // tiles, k // SPLIT_K_MIN_K))


def gemm_terms(dims: dict[str, int], sms: int, peak: float) -> tuple[float, int]:
    """(compute seconds at efficiency 1, extra bytes moved) of a GEMM with ``dims`` m, n, k[, batch] on ``sms``
    SMs of total ``peak`` FLOP/s: tile waves with split-K (module doc); the extra bytes are split-K's fp32
    partial sums, written and read once."""
    m, n, k, batch = dims["m"], dims["n"], dims["k"], max(1, dims.get("batch", 1))
    tile_m, tiles, _ = gemm_waves(m, n, batch, sms)
    s = split_k(tiles, k, sms)
    waves = math.ceil(tiles * s / sms)
    partial_bytes = 2 * s * m * n * batch * PARTIAL_BYTES if s > 1 else 0
    return waves * 2 * tile_m * TILE_N * math.ceil(k / s) / (peak / sms), partial_bytes


@dataclass(frozen=True, kw_only=True)
class CostModel:
    efficiency: dict[KernelKind, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY), hash=False)
    launch_s: float = 4e-6  # per-kernel launch + tail overhead on a GPU
    # GPU name -> kind -> efficiency fitted on that GPU's own profiles (overrides `efficiency` there)
    per_gpu: dict[str, dict[KernelKind, Efficiency]] = field(default_factory=dict, hash=False)
    gemm_tables: dict[str, GemmTable] = field(default_factory=dict, hash=False)  # GPU name -> measured GEMMs
    aic: AicCosts | None = field(default=None, hash=False, compare=False)  # AIConfigurator tables, first source

    def efficiency_for(self, kind: KernelKind, gpu: GpuSpec) -> Efficiency:
        own = self.per_gpu.get(gpu.name, {})
        return own.get(kind) or self.efficiency.get(kind) or DEFAULT_EFFICIENCY[kind]

    def roofline_time_s(self, kernel: Kernel, gpu: GpuSpec, eff: Efficiency | None = None) -> float:
        """Roofline time of ``kernel`` on ``gpu``, ignoring measured tables."""
        eff = eff or self.efficiency_for(kernel.kind, gpu)
        peak = gpu.peak(kernel.dtype)
        d = kernel.dims
        extra_bytes = 0
        if kernel.kind is KernelKind.GEMM and gpu.vendor != "host" and {"m", "n", "k"} <= d.keys():
            # host BLAS does not run fixed tile waves: CPUs use the plain FLOP count below
            unit_s, extra_bytes = gemm_terms(d, gpu.sms, peak)
            compute_s = unit_s / eff.compute
        else:
            compute_s = kernel.flops / (peak * eff.compute)
        nbytes = kernel.bytes_read + kernel.bytes_written + extra_bytes
        memory_s = nbytes / (gpu.mem_bw_bytes_per_s * eff.memory)
        launch_s = self.launch_s if eff.launch_s is None else eff.launch_s
        return launch_s + max(compute_s, memory_s)

    def measured_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float | None:
        """Time from the GPU's measured GEMM table, or None where no table covers the kernel.

        Token counts outside the table are clamped to its edge and scaled by the roofline ratio.
        """
        table = self.gemm_tables.get(gpu.name)
        d = kernel.dims
        if table is None or kernel.kind is not KernelKind.GEMM or d.get("batch", 1) > 1:
            return None
        if not {"m", "n", "k"} <= d.keys():
            return None
        hit = table.lookup(d["m"], d["n"], d["k"])
        if hit is None:
            return None
        time_s, m_clamped = hit
        if m_clamped != d["m"]:
            mc, n, k = int(m_clamped), d["n"], d["k"]
            elem_bytes = kernel.bytes_written / max(1, d["m"] * n)
            edge = replace(kernel, dims={**d, "m": mc}, flops=2 * mc * n * k,
                           bytes_read=int((mc * k + k * n) * elem_bytes), bytes_written=int(mc * n * elem_bytes))
            time_s *= self.roofline_time_s(kernel, gpu) / self.roofline_time_s(edge, gpu)
        return time_s

    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        measured = self.aic.time_s(kernel, gpu) if self.aic is not None else None
        if measured is None:
            measured = self.measured_time_s(kernel, gpu)
        return measured if measured is not None else self.roofline_time_s(kernel, gpu)

    def transfer_time_s(self, nbytes: int, link: LinkSpec) -> float:
        return link.latency_s + nbytes / (link.bytes_per_s * link.efficiency)
