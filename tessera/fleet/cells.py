"""Candidate cells, a cheap upper bound on each one's throughput, and exact evaluation by the planner.

A cell is a few GPUs that run one model replica under Tessera's kernel placement. Candidates for a set of
GPU types: each type alone, a same-type pair (the planner has no tensor parallelism, so two identical GPUs
under kernel placement stand in for TP=2), and each heterogeneous pair.

Upper bound (the fractional load-balancing LP, free transfers, no memory): per phase p with n_p steps per
request batch and m_p micro-batches of B/m_p sequences, kernel k costs t[p,k,d] on device d.
    min C   s.t.  Σ_d y[p,k,d] = 1                                   (assign[p,k])
                  Σ_{p,k} n_p·m_p·t[p,k,d]·y[p,k,d] ≤ C   for all d   (load[d])
Every plan the planner can return (its MILP and every baseline placement) has a request-batch cycle
≥ C*(m): the cycle is Σ_p n_p·step_p ≥ Σ_p n_p·m_p·T_p on shared devices and max_p n_p·step_p on disjoint
ones, and each device's busy time is one of the load rows. So B·O / min_m C*(m) bounds its throughput
(assuming, as the planner's batch halving does, that a smaller batch never raises throughput).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

from tessera.cost import CostModel
from tessera.errors import UserError
from tessera.plan import planner
from tessera.plan.highs import Model
from tessera.plan.planner import PlanResult, capture_source, plan_graphs
from tessera.plan.pool import Pool, Workload, resolve_gpu, resolve_link
from tessera.plan.problem import default_cost
from tessera.plan.score import phase_shape
from tessera.plan.types import Plan

BOUND_MS = (1, 2, 4)  # every micro-batch count the planner or a baseline may pick (planner.M_CHOICES, baselines)
QUICK_MS = {"decode": (1,), "prefill": (1,), "denoise": (1,), "encode": (1,)}  # search-time m choices


def cell_name(gpus: tuple[str, ...]) -> str:
    return "+".join(gpus)


def candidate_cells(types: list[str], *, pairs: bool = True) -> list[tuple[str, ...]]:
    """Singles, same-type pairs, heterogeneous pairs (sorted names, so a cell has one spelling)."""
    ts = sorted(set(types))
    out: list[tuple[str, ...]] = [(t,) for t in ts]
    if pairs:
        out += [(t, t) for t in ts] + list(itertools.combinations(ts, 2))
    return out


@dataclass(frozen=True, kw_only=True)
class CellEval:
    """One candidate cell planned by the planner: Tessera's plan, its throughput and the baselines'."""

    gpus: tuple[str, ...]
    feasible: bool
    reason: str | None
    throughput_per_s: float  # Tessera's (tokens/s, images/s for diffusion); 0 when infeasible
    usd_per_hour: float
    plan: Plan | None
    strategy_per_s: dict[str, float]  # every feasible strategy's throughput (prefill_decode, …)
    plans: dict[str, Plan]  # every feasible strategy's plan (the prefill/decode mix uses these)
    eval_s: float


class CellPlanner:
    """Plans cells of one model under one workload and link; caches bounds and evaluations per process
    (a re-plan after a failure, the advisor's several budgets and the 64-GPU pool reuse them)."""

    def __init__(self, model: str, workload: Workload, *, link: str = "pcie5", cost: CostModel | None = None,
                 quick: bool = True) -> None:
        from tessera.capture import model_phases

        self.model, self.workload, self.link = model, workload, resolve_link(link).name
        self.cost = cost or default_cost()
        self.phases = model_phases(model)
        self.source = capture_source(model)
        self.quick = quick
        self._bounds: dict[tuple[str, ...], float] = {}
        self._evals: dict[tuple[str, ...], CellEval] = {}
        self.eval_s = 0.0
        self.bound_s = 0.0

    def usd_per_hour(self, gpus: tuple[str, ...]) -> float:
        return sum(resolve_gpu(g).usd_per_hour for g in gpus)

    def fits(self, gpus: tuple[str, ...]) -> bool:
        """Weights plus one sequence's KV fit the cell's total memory (the planner's own first check)."""
        order = sorted(self.phases, key=lambda p: 0 if p == "decode" else 1)
        seq, ctx, _ = phase_shape(order[0], self.workload)
        g = self.source(order[0], 1, seq, ctx)
        from tessera.graph import Role

        need = sum(b.bytes for b in g.buffers if b.role in (Role.WEIGHT, Role.KV, Role.STATE))
        return need <= sum(resolve_gpu(x).mem_bytes for x in gpus)

    def upper_bound(self, gpus: tuple[str, ...]) -> float:
        """Throughput upper bound (per s) of any plan of this cell; 0 when the model cannot fit it."""
        if gpus in self._bounds:
            return self._bounds[gpus]
        t0 = time.perf_counter()
        ub = 0.0
        if len(gpus) == 1 and self.fits(gpus):  # one device: nothing to balance; the plan itself is cheap
            ub = self.evaluate(gpus).throughput_per_s
        elif self.fits(gpus):
            specs = [resolve_gpu(g) for g in gpus]
            w = replace(self.workload, batch=self.workload.batch * len(gpus))  # planner: per-GPU batch × n
            per_phase = {p: {m: self._times(p, m, w, specs) for m in BOUND_MS if m <= w.batch} for p in self.phases}
            best_c = min(_balance_lp([per_phase[p][m] for p, m in zip(self.phases, ms, strict=True)], len(gpus))
                         for ms in itertools.product(*(sorted(per_phase[p]) for p in self.phases)))
            images = "denoise" in self.phases
            ub = w.batch / best_c if images else w.batch * w.output / best_c
        self._bounds[gpus] = ub
        self.bound_s += time.perf_counter() - t0
        return ub

    def _times(self, phase: str, m: int, w: Workload, specs: list[Any]) -> list[tuple[float, tuple[float, ...]]]:
        """(weight n_p·m, per-device seconds) per kernel class: kernels with equal times are merged."""
        seq, ctx, n_steps = phase_shape(phase, w)
        g = self.source(phase, max(1, w.batch // m), seq, ctx)
        acc: dict[tuple[float, ...], float] = {}
        for k in g.kernels:
            t = tuple(self.cost.kernel_time_s(k, s) for s in specs)
            acc[t] = acc.get(t, 0.0) + n_steps * m
        return [(wt, t) for t, wt in acc.items()]

    def evaluate(self, gpus: tuple[str, ...]) -> CellEval:
        """Tessera's plan for the cell (and the baselines') by the planner, StepPoint tables left out."""
        if gpus in self._evals:
            return self._evals[gpus]
        t0 = time.perf_counter()
        usd = self.usd_per_hour(gpus)
        try:
            r = self._plan(gpus, points=False)
        except UserError as e:  # the model does not fit this cell at all
            ev = CellEval(gpus=gpus, feasible=False, reason=str(e), throughput_per_s=0.0, usd_per_hour=usd,
                          plan=None, strategy_per_s={}, plans={}, eval_s=time.perf_counter() - t0)
        else:
            o = r.strategies["tessera"]
            feas = {n: s for n, s in r.strategies.items() if s.feasible and s.plan is not None}
            ev = CellEval(gpus=gpus, feasible=o.feasible, reason=None if o.feasible else o.reason,
                          throughput_per_s=o.throughput, usd_per_hour=usd, plan=o.plan,
                          strategy_per_s={n: s.throughput for n, s in feas.items()},
                          plans={n: s.plan for n, s in feas.items()},  # type: ignore[misc]
                          eval_s=time.perf_counter() - t0)
        self.eval_s += ev.eval_s
        self._evals[gpus] = ev
        return ev

    def evaluated(self, gpus: tuple[str, ...]) -> bool:
        return gpus in self._evals

    def full_plan(self, gpus: tuple[str, ...]) -> Plan:
        """Tessera's plan with StepPoint tables (what the simulator interpolates), all micro-batch choices."""
        r = self._plan(gpus, points=True, quick=False)
        assert r.tessera is not None, f"cell {cell_name(gpus)} was feasible in the search but not here"
        return r.tessera

    def _plan(self, gpus: tuple[str, ...], *, points: bool, quick: bool | None = None) -> PlanResult:
        pool = Pool.parse(list(gpus), self.link)
        kw = dict(mode="throughput", workload=self.workload, cost=self.cost, points=points)
        if self.quick if quick is None else quick:
            # one micro-batch count (m = 1) during the search; the final tables use all.
            with mock.patch.dict(planner.M_CHOICES, QUICK_MS):
                return plan_graphs(self.model, self.phases, self.source, pool, **kw)  # type: ignore[arg-type]
        return plan_graphs(self.model, self.phases, self.source, pool, **kw)  # type: ignore[arg-type]


def _balance_lp(phases: list[list[tuple[float, tuple[float, ...]]]], n_dev: int) -> float:
    """C* of the fractional load-balancing LP (module docstring); phases: [(weight, t per device)]."""
    if n_dev == 1:
        return sum(wt * t[0] for ph in phases for wt, t in ph)
    mdl = Model("cell_bound")
    c = mdl.var("C", cost=1.0)  # seconds per request batch
    load: list[dict[int, float]] = [{c: -1.0} for _ in range(n_dev)]
    for i, ph in enumerate(phases):
        for j, (wt, t) in enumerate(ph):
            ys = [mdl.var(f"y[{i},{j},{d}]", ub=1.0) for d in range(n_dev)]
            mdl.row(f"assign[{i},{j}]", [(y, 1.0) for y in ys], lb=1.0, ub=1.0)  # Σ_d y = 1
            for d in range(n_dev):
                load[d][ys[d]] = wt * t[d]
    for d in range(n_dev):
        mdl.row(f"load[{d}]", load[d], ub=0.0)  # Σ w·t·y − C ≤ 0
    sol = mdl.solve(relax=True)
    assert sol.ok, f"load-balancing LP: {sol.status}"
    return sol.objective
