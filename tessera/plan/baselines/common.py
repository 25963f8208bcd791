"""What the placement rules share: the best candidate placement that fits memory."""

from __future__ import annotations

from tessera.contracts.cost import KernelCosts
from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.model.serving import over_memory, whole_step_memory
from tessera.plan.solver.verify import evaluate_cached


def best_fitting(g: KernelGraph, cands: list[tuple[int, ...]], m: int, units: tuple[GpuSpec, ...],
                 link: LinkSpec, cost: KernelCosts) -> tuple[int, ...] | None:
    """The candidate with the shortest async period that fits memory; else the shortest one."""
    scored = []
    for a in cands:
        ev = evaluate_cached(g, a, units, link, cost)
        fits = over_memory(whole_step_memory(ev, m), units) is None
        scored.append((not fits, max(m * ev.bottleneck_s, ev.latency_s), a))
    return min(scored, key=lambda s: (s[0], s[1]))[2] if scored else None
