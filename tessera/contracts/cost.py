"""What the planner asks of a cost model: a kernel's time on a GPU type and a transfer's time on a link.

``tessera.cost.CostModel`` (measured tables and a fitted roofline) implements it, and so do the planner's
tensor-parallel wrapper (``tessera.plan.model.units.UnitCost``), the engine's measured worker costs and the
runtime's per-kernel CPU profiles; the planner's functions take any of them as ``cost: KernelCosts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: the hardware catalog's types
    from tessera.contracts.ir import Kernel
    from tessera.hardware import GpuSpec, LinkSpec


class KernelCosts(Protocol):
    def kernel_time_s(self, kernel: Kernel, gpu: GpuSpec) -> float:
        """Seconds ``kernel`` takes on one GPU of type ``gpu``."""
        ...

    def transfer_time_s(self, nbytes: int, link: LinkSpec) -> float:
        """Seconds to move ``nbytes`` over ``link``."""
        ...
