"""The joint LP bound of a multi-phase plan: every phase's placement relaxed at once, sharing residency.

Phases of one plan share the devices' memory: a weight used by prefill and decode is held once, and
where it is held decides where both phases can run its kernels. Bounding each phase alone lets every
phase pick the weights' devices anew (prefill wants them on the compute-rich GPU, decode on the
bandwidth-rich one), which a real plan cannot; the joint relaxation keeps one residency per name.

Variables (relaxed, names as in the model):
  x[p,g,d] ∈ [0,1]  phase p's group g on device d
  z[w,d] ∈ [0,1]    resident name w held on d (one column per name across phases)
  T[p] ≥ 0          phase p's per-micro-batch bottleneck (throughput mode)
Rows:
  assign[p,g]:   Σ_d x[p,g,d] = 1
  resident[w,p,g,d]: z[w,d] ≥ x[p,g,d]                  g ∈ touch_p(w)
  compute[p,d]:  Σ_g t_p[g,d]·x[p,g,d] ≤ T[p]
  memory[d]:     Σ_w size[w]·z[w,d] ≤ capacity[d]   (no activation reserve: score charges each plan its own
                 peak live set, which can be far below the planner's reserve)
Objective: Σ_p n_p·((m_p−1)·T[p] + Σ_g,d t_p[g,d]·x[p,g,d])  (throughput; latency mode drops T):
the planner's objective (score.phase_objective_s) with transfers free, so a lower bound on it for any
placement of these phases (cycle_bound adds disjoint device splits). size[w] is the smallest size any phase gives the name (kv × m differs by
phase), which keeps the rows no tighter than score's by-name memory accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import Objective
from tessera.plan.solver.highs import INFEASIBLE, Model
from tessera.plan.solver.problem import PhaseProblem

MAX_SPLIT_DEVICES = 6  # pools up to this size get every disjoint split bounded (62 splits at 6)


@dataclass(frozen=True, kw_only=True)
class BoundPhase:
    prob: PhaseProblem  # built at the phase's micro-batch shape (kv/state bytes already × m)
    m: int  # micro-batches
    steps: int  # n_p: how many times the phase runs per cycle
    devices: frozenset[int] | None = None  # the devices the phase may use (None: all)


def lp_bound_joint(phases: list[BoundPhase], *, mode: Objective = Objective.THROUGHPUT) -> float | None:
    """min Σ_p n_p·objective_p over the joint relaxation (seconds per cycle); inf when nothing fits, None
    when HiGHS did not finish (a time limit)."""
    assert phases and mode in (Objective.THROUGHPUT, Objective.LATENCY), mode
    D = phases[0].prob.D  # noqa: N806
    m = Model("bound[joint]")
    size: dict[str, float] = {}
    touch: dict[str, list[int]] = {}  # name -> x columns of groups touching it
    for pi, ph in enumerate(phases):
        p = ph.prob
        assert p.D == D and not p.preresident and not p.held_bytes, "a joint bound starts from an empty pool"
        # ---- step 1: x[p,g,d] and assign[p,g] ----
        ok = ph.devices if ph.devices is not None else frozenset(range(D))
        x = [[m.var(f"x[{pi},{g},{d}]", lb=float(p.pinned.get(g) == d),
                    ub=float(p.pinned.get(g, d) == d and d in ok), cost=ph.steps * float(p.t[g, d]))
              for d in range(D)] for g in range(p.G)]
        for g in range(p.G):
            m.row(f"assign[{pi},{g}]", {x[g][d]: 1.0 for d in range(D)}, lb=1.0, ub=1.0)
        # ---- step 2: T[p] and compute[p,d] (throughput: (m−1)·T in the objective) ----
        if mode == Objective.THROUGHPUT and ph.m > 1:
            t_col = m.var(f"T[{pi}]", cost=ph.steps * float(ph.m - 1))
            for d in range(D):
                m.row(f"compute[{pi},{d}]", {**{x[g][d]: float(p.t[g, d]) for g in range(p.G)}, t_col: -1.0},
                      ub=0.0)
        # ---- step 3: residents by name ----
        for w in p.residents:
            size[w.name] = min(size.get(w.name, float(w.bytes)), float(w.bytes))
            touch.setdefault(w.name, []).extend(x[g][d] for g in w.groups for d in range(D))  # [g, d] order
    # ---- step 4: z[w,d], resident rows, memory[d] ----
    mem: list[dict[int, float]] = [{} for _ in range(D)]
    for wi, (name, cols) in enumerate(touch.items()):
        for d in range(D):
            z = m.var(f"z[{wi},{d}]", ub=1.0)
            for c in cols[d::D]:
                m.row(f"resident[{wi},{c},{d}]", {z: 1.0, c: -1.0}, lb=0.0)
            mem[d][z] = size[name]
    for d in range(D):
        cap = min(float(ph.prob.free_bytes(d)) for ph in phases)  # the problems' own reserve (planner: 0)
        m.row(f"memory[{d}]", mem[d], ub=cap)
    sol = m.solve(relax=True)
    if sol.status in INFEASIBLE:  # these phases do not fit these devices at all
        return math.inf
    return sol.objective if sol.status == "optimal" else None  # no bound rather than a wrong one


def cycle_bound(phases: list[BoundPhase], *, mode: Objective = Objective.THROUGHPUT) -> float | None:
    """Lower bound on Σ n·objective (phases sharing devices) and on max n·objective (two phases on
    disjoint device sets, prefill/decode disaggregation, whose cycle overlaps them): the smaller of the
    joint bound and, for every split of the pool, the larger of the two phases' bounds on their sides."""
    best = lp_bound_joint(phases, mode=mode)
    n = phases[0].prob.D
    if best is None or len(phases) != 2 or n < 2:
        return best
    if n > MAX_SPLIT_DEVICES:  # 2^n − 2 splits: no bound rather than one a disjoint plan could beat
        return None
    for mask in range(1, 2 ** n - 1):
        side = frozenset(d for d in range(n) if mask >> d & 1)
        a = lp_bound_joint([replace(phases[0], devices=side)], mode=mode)
        b = lp_bound_joint([replace(phases[1], devices=frozenset(range(n)) - side)], mode=mode)
        if a is None or b is None:  # a split left unbounded would make the minimum too high
            return None
        best = min(best, max(a, b))
    return best


def async_bound(g, pool, cost: KernelCosts, m: int) -> float | None:
    """Lower bound on the async period max(m·T, L) of any placement of micro-batch graph ``g`` on ``pool``,
    L taken as the MILP's sequential sum of work and transfers: the flat MILP with x relaxed to [0,1] and
    the memory rows kept (no activation reserve), rows compute[d]: Σ_g t·x ≤ T, link[a,b]: Σ s·y ≤ T and
    latency: Σ_g,d t·x + Σ s·y ≤ m·T, plus the valid inequalities flow[v,c,b] (milp.build_flat), which
    charge a transfer wherever the relaxed assignment changes along a dependency. The bound is m·T (inf
    when nothing fits, None when HiGHS did not finish)."""
    from tessera.plan.solver.milp import build_flat
    from tessera.plan.solver.solve import prepare

    prob = replace(prepare(g, pool, cost, m=m, act_bytes=0), handoffs=[])
    model, idx = build_flat(prob, objective="async", micro=m, flow=True)
    model.col_cost = [1.0 if j == idx.T else 0.0 for j in range(model.n_cols)]  # no tie-break in a bound
    sol = model.solve(relax=True)
    if sol.status in INFEASIBLE:
        return math.inf
    return m * float(sol.values[idx.T]) if sol.status == "optimal" else None


def period_floor(g, pool, cost: KernelCosts, m: int) -> float:
    """A cheap lower bound on the period max(m·T, L) of any placement of micro-batch graph ``g`` that fits
    memory, in the verifier's own terms: the larger of
      m × the LP optimum T of compute[d]: Σ_g t·x ≤ T with x relaxed, transfers free and the memory rows
          kept (kv/state × m, no activation reserve): no placement that fits has a less busy busiest device;
      latency_floor: no placement's list schedule ends before its critical path at each kernel's fastest
          device.
    inf when no placement fits at all. The search skips the MILP at a point whose floor already misses
    the SLO."""
    import numpy as np

    from tessera.plan.solver.milp import lp_bound_memory
    from tessera.plan.solver.solve import prepare

    prob = replace(prepare(g, pool, cost, m=m, act_bytes=0, with_values=False), xfer_s=np.zeros(0), handoffs=[])
    t = m * lp_bound_memory(prob)
    return t if t == math.inf else max(t, latency_floor(g, pool.gpus, cost))


def latency_floor(g, gpus, cost: KernelCosts) -> float:
    """Critical path of ``g`` with every kernel at its fastest device and transfers free: the verifier's
    list schedule starts a kernel only after the last writer of each non-resident buffer it touches has
    finished, so one micro-batch's latency L is at least this, whatever the placement (seconds)."""
    from tessera.graph import Role

    resident = (Role.WEIGHT, Role.KV, Role.STATE)
    finish: list[float] = []
    writer: dict[int, int] = {}
    for k in g.kernels:
        ready = max((finish[w] for b in set(k.reads) | set(k.writes)
                     if g.buffers[b].role not in resident and (w := writer.get(b)) is not None), default=0.0)
        finish.append(ready + min(cost.kernel_time_s(k, u) for u in gpus))
        for b in k.writes:
            writer[b] = k.id
    return max(finish, default=0.0)
