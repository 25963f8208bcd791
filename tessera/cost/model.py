"""Per-kernel time on a GPU type: roofline per kernel class with efficiencies and launch overhead.

Interface used by plan, sim and report: ``CostModel.kernel_time_s(kernel, gpu)`` and
``CostModel.transfer_time_s(nbytes, link)``. (Initial version: fixed efficiencies; the cost issue
replaces them with fitted ones and measured profile tables.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.graph import Kernel, KernelKind
from tessera.hardware import GpuSpec, LinkSpec


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    compute: float  # fraction of dense peak reached
    memory: float  # fraction of peak memory bandwidth reached


DEFAULT_EFFICIENCY: dict[KernelKind, Efficiency] = {
    KernelKind.GEMM: Efficiency(compute=0.7, memory=0.8),
    KernelKind.ATTENTION: Efficiency(compute=0.5, memory=0.7),
    KernelKind.ATTENTION_DECODE: Efficiency(compute=0.3, memory=0.7),
    KernelKind.ELEMENTWISE: Efficiency(compute=0.3, memory=0.8),
    KernelKind.NORM: Efficiency(compute=0.3, memory=0.7),
    KernelKind.EMBEDDING: Efficiency(compute=0.3, memory=0.6),
    KernelKind.SCAN: Efficiency(compute=0.2, memory=0.5),
    KernelKind.CONV: Efficiency(compute=0.4, memory=0.6),
    KernelKind.COPY: Efficiency(compute=0.3, memory=0.8),
    KernelKind.OTHER: Efficiency(compute=0.2, memory=0.5),
}


@dataclass(frozen=True, kw_only=True)
class CostModel:
    efficiency: dict[KernelKind, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY), hash=False)
    launch_s: float = 4e-6  # per-kernel launch + tail overhead on a GPU

    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        eff = self.efficiency[kernel.kind]
        compute_s = kernel.flops / (gpu.peak(kernel.dtype) * eff.compute)
        memory_s = (kernel.bytes_read + kernel.bytes_written) / (gpu.mem_bw_bytes_per_s * eff.memory)
        return self.launch_s + max(compute_s, memory_s)

    def transfer_time_s(self, nbytes: int, link: LinkSpec) -> float:
        return link.latency_s + nbytes / link.bytes_per_s
