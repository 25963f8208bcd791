"""Solve one phase: build the problem at the micro-batch shape, patterns + polish or flat MILP, check.

Returns a kernel assignment. Every solution is re-scored by the independent verifier and must agree with
the solver's own loads and resident bytes (an AssertionError otherwise: that is a bug, not user error).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from tessera.cost import CostModel
from tessera.graph import KernelGraph, Role
from tessera.plan.pool import Pool
from tessera.plan.solver.milp import Background, loads, objective_value, solve_flat
from tessera.plan.solver.patterns import find_segments, polish, solve_patterns
from tessera.plan.solver.problem import Handoff, PhaseProblem, build_problem
from tessera.plan.solver.verify import evaluate_cached

FLAT_MAX_GROUPS = 400  # above this (and with repeated layers) use layer patterns


@dataclass(frozen=True, kw_only=True)
class PhaseSolution:
    assignment: tuple[int, ...] | None  # None: infeasible (memory)
    objective: float
    solve_s: float
    method: str  # flat | patterns
    status: str
    handoffs: tuple[tuple[int, int, int], ...] = ()


def prepare(g: KernelGraph, pool: Pool, cost: CostModel, *, m: int, act_bytes: int | None = None,
            kv_home: dict[str, int] | None = None, preresident: dict[str, frozenset[int]] | None = None,
            held_bytes: tuple[int, ...] = (), with_values: bool = True) -> PhaseProblem:
    """PhaseProblem at the micro-batch shape; kv/state resident bytes × m (all micro-batches' caches),
    ``kv_home``: kv buffer name -> device that keeps it for the next phase (a handoff if placed elsewhere)."""
    p = build_problem(g, pool, cost, with_values=with_values)
    res = [replace(r, bytes=r.bytes * m) if r.role in (Role.KV, Role.STATE) else r for r in p.residents]
    hand = []
    for r in p.residents:
        if r.role in (Role.KV, Role.STATE) and kv_home and r.name in kv_home:
            hand.append(Handoff(name=r.name, src=r.groups[0], device=kv_home[r.name], bytes=r.bytes))
    return replace(p, residents=res, handoffs=hand, act_bytes=act_bytes if act_bytes is not None else p.act_bytes,
                   preresident=preresident or {}, held_bytes=held_bytes)


def solve_phase(prob: PhaseProblem, *, mode: str = "throughput", starts: list[tuple[int, ...]] = (),
                mip_rel_gap: float = 1e-2, time_limit_s: float = 20.0, m: int = 1,
                background: Background | None = None, period_cap_s: float | None = None,
                max_nodes: int | None = None) -> PhaseSolution:
    """throughput mode minimises the synchronous pipeline step bound (m−1)·T + Σ (objective "step"); async
    the period max(m·T, Σ) of independently advancing micro-batches (objective "async"); latency mode the
    sequential critical path Σ (objective "weighted", α = β = 1). ``period_cap_s`` (async, flat MILP):
    search only placements whose modelled period meets it (solve_flat); the starts are kept either way.
    ``max_nodes``: branch-and-bound nodes per MILP solve (highs.Model.solve; None: no limit)."""
    t0 = time.perf_counter()
    objective = {"throughput": "step", "latency": "weighted", "async": "async"}[mode]
    group_starts = []
    for s in starts:
        if len(s) != len(prob.graph.kernels):
            continue  # captured at a shape whose kernel sequence differs (MoE routing)
        try:
            group_starts.append(tuple(prob.group_assignment(s)))
        except AssertionError:  # a start that splits a kv group is not a valid placement here
            continue
    segs = find_segments(prob) if prob.G > FLAT_MAX_GROUPS else []
    method = "patterns" if segs else "flat"
    if segs:
        pr = solve_patterns(prob, segs, objective=objective, background=background, mip_rel_gap=mip_rel_gap,
                            time_limit_s=time_limit_s, m_micro=m, max_nodes=max_nodes)
        gd, status = pr.group_dev, pr.status
        if gd:
            gd = polish(prob, segs, gd, objective=objective, background=background, mip_rel_gap=mip_rel_gap,
                        time_limit_s=min(5.0, time_limit_s), free_layers=0, m=m, max_nodes=max_nodes)
    else:
        fr = solve_flat(prob, objective=objective, background=background, starts=group_starts,
                        mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s, m=m,
                        period_cap_s=period_cap_s if objective == "async" else None, max_nodes=max_nodes)
        gd, status = fr.group_dev, fr.status
    # keep the best of the solver's answer and the given starts (each a placement the MILP contains), each
    # re-checked against memory by the independent bookkeeping of resident_bytes
    cands = [c for c in ([tuple(gd)] if gd else []) + group_starts if _fits(prob, c)]
    if not cands:
        return PhaseSolution(assignment=None, objective=math.inf, solve_s=time.perf_counter() - t0,
                             method=method, status=status)
    best = min(cands, key=lambda c: objective_value(prob, c, objective, m, background))
    return PhaseSolution(assignment=prob.kernel_assignment(best), objective=objective_value(
                         prob, best, objective, m, background), solve_s=time.perf_counter() - t0, method=method,
                         status=status, handoffs=handoff_triples(prob, best))


def handoff_triples(prob: PhaseProblem, gd: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    return tuple((h.bytes, gd[h.src], h.device) for h in prob.handoffs if gd[h.src] != h.device)


def resident_bytes(prob: PhaseProblem, gd: tuple[int, ...]) -> list[int]:
    """Solver-side memory[d] (without activations): Σ size[w]·z[w,d] for this placement."""
    out = [0] * prob.D
    for w in prob.residents:
        for d in {gd[g] for g in w.groups}:
            if d not in prob.preresident.get(w.name, frozenset()):
                out[d] += w.bytes
    return out


def _fits(prob: PhaseProblem, gd: tuple[int, ...]) -> bool:
    # slack: HiGHS's integrality tolerance (x = 1 − 1e-6 lets z sit that far under the memory row)
    slack = 1e-6 * sum(w.bytes for w in prob.residents)
    return all(b <= prob.free_bytes(d) + slack for d, b in enumerate(resident_bytes(prob, gd)))


def check_agreement(prob: PhaseProblem, assignment: tuple[int, ...], cost: CostModel, m: int) -> None:
    """Solver bookkeeping vs the independent verifier: loads, links and resident bytes must agree."""
    gd = tuple(prob.group_assignment(assignment))
    dev, lk = loads(prob, gd)
    ev = evaluate_cached(prob.graph, assignment, prob.pool.gpus, prob.pool.link, cost,
                         handoffs=handoff_triples(prob, gd))
    for d in range(prob.D):
        assert math.isclose(dev[d], ev.device_busy_s[d], rel_tol=1e-9, abs_tol=1e-15), (d, dev[d], ev.device_busy_s)
    for p, s in lk.items():
        assert math.isclose(s, ev.link_busy_s[p], rel_tol=1e-9, abs_tol=1e-15), (p, s, ev.link_busy_s[p])
    solver_mem = resident_bytes(replace(prob, preresident={}), gd)
    for d, md in enumerate(ev.memory_bytes):
        mine = md["weight"] + m * (md["kv"] + md["state"])
        assert mine == solver_mem[d], (d, mine, solver_mem[d])
        assert md["activation"] <= prob.act_bytes, (d, md["activation"], prob.act_bytes)

