"""Placement rules of the strategies, as functions (graph, batch, m) -> kernel assignment.

Each rule places one micro-batch's iteration graph on a cell's devices; serving.search sweeps batch and m
around it and serving.score_point scores every candidate the same way (docs/plan.md "Baselines").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan import baselines as bl
from tessera.plan.pool import Pool
from tessera.plan.serving import over_memory, whole_step_memory
from tessera.plan.solve import check_agreement, prepare, solve_phase
from tessera.plan.verify import evaluate_cached


def uniform(device: int = 0) -> Callable[[KernelGraph, int, int], tuple[int, ...]]:
    """Every kernel on one device (a single-device replica, or one side of prefill/decode)."""
    return lambda g, b, m: (device,) * len(g.kernels)


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


def _best_fitting(g: KernelGraph, cands: list[tuple[int, ...]], m: int, units: tuple[GpuSpec, ...],
                  link: LinkSpec, cost) -> tuple[int, ...] | None:
    """The candidate with the shortest async period that fits memory; else the shortest one."""
    scored = []
    for a in cands:
        ev = evaluate_cached(g, a, units, link, cost)
        fits = over_memory(whole_step_memory(ev, m), units) is None
        scored.append((not fits, max(m * ev.bottleneck_s, ev.latency_s), a))
    return min(scored, key=lambda s: (s[0], s[1]))[2] if scored else None


def layer_pipeline(units: tuple[GpuSpec, ...], link: LinkSpec, cost) -> Callable:
    """Contiguous layer ranges, in every device order, sized in proportion to each device's speed on this
    graph's layers; the best that fits memory."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        times = [[cost.kernel_time_s(k, u) for u in units] for k in g.kernels]
        speeds = [1.0 / max(s, 1e-12) for s in bl.layer_seconds(g, times)]
        cands = []
        for perm in itertools.permutations(range(len(units))):
            counts = bl.layer_ranges(g.layers, [speeds[d] for d in perm])
            cands.append(bl.layer_pipeline(g, list(perm), counts))
            # memory-lean variant: equal layer counts (a fast device may not hold its speed share of weights)
            even = bl.layer_ranges(g.layers, [1.0] * len(units))
            cands.append(bl.layer_pipeline(g, list(perm), even))
        return _best_fitting(g, list(dict.fromkeys(cands)), m, units, link, cost)
    return place


def attention_ffn(units: tuple[GpuSpec, ...], link: LinkSpec, cost) -> Callable:
    """Attention (and its KV) on one device, everything else on the other (MegaScale-Infer); the chunk's
    attention rides with decode attention; both orientations, the better one."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        if m < 2:
            return None  # ping-pong needs two micro-batches in flight
        side = bl.attention_sides(g)
        cands = [tuple(a if s else f for s in side) for a, f in ((0, 1), (1, 0))]
        return _best_fitting(g, cands, m, units, link, cost)
    return place


def milp(pool: Pool, cost, *, starts: list[Callable] = (), mip_rel_gap: float = 1e-2,
         time_limit_s: float = 10.0, solve_log: list[float] | None = None) -> Callable:
    """Tessera: the placement MILP of the iteration graph, async objective (period max(m·T, L)), with the
    baselines' placements at the same shape as MIP starts; every answer checked by the verifier."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        prob = prepare(g, pool, cost, m=m)
        hints = [a for s in starts if (a := s(g, b, m)) is not None]
        sol = solve_phase(prob, mode="async", starts=hints, m=m, mip_rel_gap=mip_rel_gap,
                          time_limit_s=time_limit_s)
        if solve_log is not None:
            solve_log.append(sol.solve_s)
        if sol.assignment is None:
            return None
        check_agreement(prob, sol.assignment, cost, m)
        return sol.assignment
    return place
