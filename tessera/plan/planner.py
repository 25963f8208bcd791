"""plan_model: Tessera's plan and the four baselines for one model on one pool, scored alike.

Search (throughput mode): the KV-owning phase first (decode; else the only phase) over micro-batch
counts m, then the other phases with the first phase's placement as background facts (its weights are
already resident, its KV is where prefill must deliver it); batch halves while nothing fits.
Tessera's answer is the best of its MILP plans and every baseline placement (the MILP contains them),
so it never scores below an applicable baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from tessera.cost import CostModel
from tessera.errors import UserError
from tessera.graph import KernelGraph, Role
from tessera.plan.bound import BoundPhase, cycle_bound
from tessera.plan.milp import lp_bound_memory
from tessera.plan.pool import Pool, Workload
from tessera.plan.problem import PhaseProblem, default_cost
from tessera.plan.score import GB, GraphSource, PhaseSpec, Scored, phase_shape, score
from tessera.plan.solve import check_agreement, prepare, solve_phase
from tessera.plan.types import Plan

STRATEGIES = ("tessera", "homogeneous", "prefill_decode", "attention_ffn", "layer_pipeline")
M_CHOICES = {"decode": (1, 2, 4), "prefill": (1, 2), "denoise": (1, 2), "encode": (1,)}


@dataclass(frozen=True, kw_only=True)
class Outcome:
    name: str
    applicable: bool
    reason: str | None = None
    plan: Plan | None = None

    @property
    def feasible(self) -> bool:
        return self.plan is not None and (self.plan.throughput_tokens_per_s is not None
                                          or self.plan.throughput_images_per_s is not None)

    @property
    def throughput(self) -> float:
        if not self.feasible or self.plan is None:
            return 0.0
        return self.plan.throughput_tokens_per_s or self.plan.throughput_images_per_s or 0.0


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    model: str
    gpus: tuple[str, ...]
    link: str
    mode: str
    workload: Workload
    strategies: dict[str, Outcome] = field(hash=False)
    solve_s: float = 0.0

    @property
    def tessera(self) -> Plan | None:
        return self.strategies["tessera"].plan

    def to_json(self) -> dict[str, Any]:
        """The `tessera plan --json` contract."""
        t = self.tessera
        out: dict[str, Any] = {"model": self.model, "gpus": list(self.gpus), "mode": self.mode,
                               "solve_s": self.solve_s, "bound_ratio": t.bound_ratio if t else None,
                               "strategies": {}}
        for name in STRATEGIES:
            o = self.strategies[name]
            p = o.plan
            ent: dict[str, Any] = {
                "applicable": o.applicable, "reason": o.reason if not o.feasible else None,
                "feasible": o.feasible, "usd_per_hour": p.usd_per_hour if p else _usd(self.gpus),
                "usd_per_million_tokens": p.usd_per_million_tokens if p and o.feasible else None,
                "latency_s": p.latency_s if p and o.feasible else None,
                "memory_bytes": {f"{i}:{d.gpu}": sum(p.memory_bytes[i].values()) for i, d in enumerate(p.devices)}
                if p else {},
            }
            if p and p.throughput_images_per_s is not None or self.workload_is_images:
                ent["throughput_images_per_s"] = p.throughput_images_per_s if p and o.feasible else None
            else:
                ent["throughput_tokens_per_s"] = p.throughput_tokens_per_s if p and o.feasible else None
            out["strategies"][name] = ent
        return out

    @property
    def workload_is_images(self) -> bool:
        t = self.tessera
        return bool(t and "denoise" in t.phases)


def _usd(gpus: tuple[str, ...]) -> float:
    from tessera.plan.pool import resolve_gpu

    return sum(resolve_gpu(g).usd_per_hour for g in gpus)


@cache
def _captured(model: str, phase: str, batch: int, seq: int, context: int) -> KernelGraph:
    """Captures are GPU-independent: cached per process across pools (compare reuses them)."""
    from tessera.capture import capture_model

    kw: dict[str, int] = {}
    if phase == "prefill" and seq:
        kw["seq"] = seq
    if phase == "decode" and context:
        kw["context"] = context
    return capture_model(model, phase, batch=batch, **kw)


def capture_source(model: str) -> GraphSource:
    return lambda phase, batch, seq, context: _captured(model, phase, batch, seq, context)


def plan_model(model: str, gpus: list[str] | str, *, link: str = "pcie5", mode: str = "throughput",
               workload: Workload | None = None, cost: CostModel | None = None) -> PlanResult:
    from tessera.capture import model_phases

    phases = model_phases(model)
    return plan_graphs(model, phases, capture_source(model), Pool.parse(gpus, link), mode=mode,
                       workload=workload or Workload(), cost=cost)


def plan_graphs(model: str, phases: list[str], source: GraphSource, pool: Pool, *, mode: str = "throughput",
                workload: Workload | None = None, cost: CostModel | None = None, points: bool = True
                ) -> PlanResult:
    if mode not in ("throughput", "latency"):
        raise UserError(f"unknown mode {mode!r}; valid: latency, throughput")
    w1 = workload or Workload()
    w = replace(w1, batch=w1.batch * pool.n)  # a cell of n GPUs serves n times the per-GPU batch
    cost = cost or default_cost()
    order = sorted(phases, key=lambda p: 0 if p == "decode" else 1) if "decode" in phases else list(phases)
    _check_pool_fits(model, order[0], source, pool, w)
    t0 = time.perf_counter()
    bounds: dict[tuple, float | None] = {}
    bound_probs: dict[tuple[str, int, int], PhaseProblem] = {}  # (phase, batch, m): shared across plans

    def bound_fn(batch: int):
        """(phase, m) pairs of a plan -> bound.cycle_bound on its objective at this batch (None: none)."""
        wb = replace(w, batch=batch)

        def f(specs: tuple[tuple[str, int], ...]) -> float | None:
            key = (batch, specs)
            if key not in bounds:
                parts = []
                for phase, m in specs:
                    seq, ctx, n = phase_shape(phase, wb)
                    if (phase, batch, m) not in bound_probs:
                        g = source(phase, max(1, batch // m), seq, ctx)
                        # no activation reserve: a baseline scored by its own peak live set must stay within it
                        bound_probs[phase, batch, m] = prepare(g, pool, cost, m=m, act_bytes=0)
                    parts.append(BoundPhase(prob=bound_probs[phase, batch, m], m=m, steps=n))
                bounds[key] = cycle_bound(parts, mode=mode)
            return bounds[key]
        return f

    base = _baselines(model, order, source, pool, w1, cost, mode, bound_fn(w.batch), points=points)
    starts: dict[str, list[tuple[int, ...]]] = {p: [] for p in order}
    for o in base.values():
        if o.plan is not None and o.name != "homogeneous":
            for p, pp in o.plan.phases.items():
                starts[p].append(pp.assignment)
    batch = w.batch
    best: Scored | None = None
    solve_total = 0.0
    while best is None:
        wb = replace(w, batch=batch)
        best, solve_s = _tessera(model, order, source, pool, wb, cost, mode, starts, bound_fn(batch), points)
        solve_total += solve_s
        if best is None:
            if batch == 1:
                break
            batch = max(1, batch // 2)
    tess = best.plan if best else None
    for o in base.values():  # a baseline placement is a Tessera placement too: keep the best
        if o.feasible and o.plan and (tess is None or _thr(o.plan) > _thr(tess)):
            tess = replace(o.plan, strategy="tessera", notes=o.plan.notes + (f"chosen: the {o.name} placement",))
    if tess is not None:
        tess = replace(tess, solve_s=solve_total)
    outs = {"tessera": Outcome(name="tessera", applicable=True, plan=tess,
                               reason=None if tess else "no placement fits the pool's memory"), **base}
    return PlanResult(model=model, gpus=tuple(pool.names), link=pool.link.name, mode=mode, workload=w1,
                      strategies=outs, solve_s=solve_total if tess else time.perf_counter() - t0)


def _thr(p: Plan) -> float:
    return p.throughput_tokens_per_s or p.throughput_images_per_s or 0.0


def _check_pool_fits(model: str, phase: str, source: GraphSource, pool: Pool, w: Workload) -> None:
    """The whole model's weights (+ KV of one sequence) must fit the pool's total memory."""
    seq, ctx, _ = phase_shape(phase, w)
    g = source(phase, 1, seq, ctx)
    need = sum(b.bytes for b in g.buffers if b.role in (Role.WEIGHT, Role.KV, Role.STATE))
    have = sum(gp.mem_bytes for gp in pool.gpus)
    if need > have:
        raise UserError(f"{model} does not fit {'+'.join(pool.names)}: needs {need / GB:.1f} GB for weights and "
                        f"one sequence's KV, the pool has {have / GB:.1f} GB ({(need - have) / GB:.1f} GB short)")


def _tessera(model: str, order: list[str], source: GraphSource, pool: Pool, w: Workload, cost: CostModel,
             mode: str, starts: dict[str, list[tuple[int, ...]]], bound_fn: Any, points: bool
             ) -> tuple[Scored | None, float]:
    solve_total = 0.0
    chosen: list[PhaseSpec] = []
    kv_home: dict[str, int] = {}
    pre: dict[str, frozenset[int]] = {}
    held = [0] * pool.n  # bytes of resident buffers earlier phases keep, per device
    act = _act_reserve(order, source, pool, cost, w, mode)
    for i, p in enumerate(order):
        seq, ctx, n_steps = phase_shape(p, w)
        best: tuple[float, PhaseSpec] | None = None
        for m in _ms(p, w, mode):
            g = source(p, max(1, w.batch // m), seq, ctx)
            prob = prepare(g, pool, cost, m=m, act_bytes=act, kv_home=kv_home if i else None, preresident=pre,
                           held_bytes=tuple(held))
            if best is not None and mode == "throughput":
                # skip an m that cannot win: any placement's cycle >= n·step >= n·m·T >= n·m·T_LP (a sum or
                # a max over phases, either way at least this phase's share)
                t0 = time.perf_counter()
                lb = n_steps * m * lp_bound_memory(prob)
                solve_total += time.perf_counter() - t0
                if lb >= best[0]:
                    continue
            sol = solve_phase(prob, mode=mode, starts=starts[p], m=m)
            solve_total += sol.solve_s
            if sol.assignment is None:
                continue
            check_agreement(prob, sol.assignment, cost, m)
            spec = PhaseSpec(phase=p, assignment=sol.assignment, m=m, handoffs=sol.handoffs)
            sc = score(model=model, strategy="tessera", mode=mode, pool=pool, workload=w, phases=[*chosen, spec],
                       source=source, cost=cost, points=False)
            key = sc.cycle_s
            if best is None or key < best[0]:
                best = (key, spec)
        if best is None:
            return None, solve_total
        spec = best[1]
        chosen.append(spec)
        g = source(p, max(1, w.batch // spec.m), seq, ctx)
        for k in g.kernels:
            for b in (*k.reads, *k.writes):
                buf = g.buffers[b]
                if buf.role in (Role.KV, Role.STATE):
                    kv_home.setdefault(buf.name, spec.assignment[k.id])
                if buf.role in (Role.WEIGHT, Role.KV, Role.STATE):
                    d = spec.assignment[k.id]
                    if d not in pre.get(buf.name, frozenset()):
                        held[d] += buf.bytes * (spec.m if buf.role != Role.WEIGHT else 1)
                    pre[buf.name] = pre.get(buf.name, frozenset()) | {d}
    sc = score(model=model, strategy="tessera", mode=mode, pool=pool, workload=w, phases=chosen, source=source,
               cost=cost, solve_s=solve_total, bound_s=bound_fn, points=points,
               notes=(f"micro-batches: {', '.join(f'{s.phase} {s.m}' for s in chosen)}",))
    return (sc if sc.feasible else None), solve_total


def _act_reserve(order: list[str], source: GraphSource, pool: Pool, cost: CostModel, w: Workload,
                 mode: str) -> int:
    """Activation bytes reserved on every device: the largest peak live set of any phase and m searched."""
    acts = []
    for p in order:
        seq, ctx, _ = phase_shape(p, w)
        acts.append(max(prepare(source(p, max(1, w.batch // m), seq, ctx), pool, cost, m=m).act_bytes
                        for m in _ms(p, w, mode)))
    return max(acts)


def _ms(phase: str, w: Workload, mode: str) -> list[int]:
    if mode == "latency":
        return [1]
    return [m for m in M_CHOICES.get(phase, (1,)) if m <= w.batch]


def _baselines(model: str, order: list[str], source: GraphSource, pool: Pool, w: Workload, cost: CostModel,
               mode: str, bound_fn: Any, *, points: bool) -> dict[str, Outcome]:
    from tessera.plan.baseline_plans import build_baselines

    return build_baselines(model, order, source, pool, w, cost, mode, bound_fn, points=points)
