"""Placement rules as functions (graph, batch, m) -> kernel assignment: Tessera's MILP here, the
baselines' rules in tessera.plan.baselines (re-exported under their old names), and ``memo``.

Each rule places one micro-batch's iteration graph on a cell's devices; serving.search sweeps batch and m
around it and serving.score_point scores every candidate the same way (docs/plan.md "Strategies").
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.contracts.cost import KernelCosts
from tessera.graph import KernelGraph
from tessera.plan.baselines.attention_ffn import rule as attention_ffn
from tessera.plan.baselines.homogeneous import uniform
from tessera.plan.baselines.layer_pipeline import rule as layer_pipeline
from tessera.plan.pool import Pool
from tessera.plan.solver.solve import check_agreement, prepare, solve_phase


def memo(place: Callable) -> Callable:
    """A placement rule answering each (graph, batch, m) once: the rule's own search and the MILP's MIP
    starts ask for the same shapes. Graphs are keyed by identity (one graph per shape, kept alive here)."""
    seen: dict[tuple[int, int, int], tuple[KernelGraph, tuple[int, ...] | None]] = {}

    def cached(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        hit = seen.get((id(g), b, m))
        if hit is None or hit[0] is not g:
            hit = seen[id(g), b, m] = (g, place(g, b, m))
        return hit[1]
    return cached


def milp(pool: Pool, cost: KernelCosts, *, starts: list[Callable] = (), mip_rel_gap: float = 1e-2,
         time_limit_s: float = 10.0, max_nodes: int | None = None, solve_log: list[float] | None = None,
         period_cap: Callable[[KernelGraph], float] | None = None) -> Callable:
    """Tessera: the placement MILP of the iteration graph, async objective (period max(m·T, L)), with the
    baselines' placements at the same shape as MIP starts; every answer checked by the verifier.
    ``period_cap(graph)``: the longest period worth finding (the SLO's, serving.slo_period_cap): the MILP
    searches only placements whose modelled period meets it, and proves quickly when none does; the best
    start is the answer then."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        prob = prepare(g, pool, cost, m=m)
        hints = [a for s in starts if (a := s(g, b, m)) is not None]
        sol = solve_phase(prob, mode="async", starts=hints, m=m, mip_rel_gap=mip_rel_gap,
                          time_limit_s=time_limit_s, period_cap_s=period_cap(g) if period_cap else None,
                          max_nodes=max_nodes)
        if solve_log is not None:
            solve_log.append(sol.solve_s)
        if sol.assignment is None:
            return None
        check_agreement(prob, sol.assignment, cost, m)
        return sol.assignment
    return place


__all__ = ["attention_ffn", "layer_pipeline", "memo", "milp", "uniform"]
