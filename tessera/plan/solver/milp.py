"""The flat placement MILP of docs/plan.md (throughput and latency objectives) and the LP bound.

Variables (names as in the model):
  x[g,d] ∈ {0,1}   group g runs on device d                      (per contracted group of kernels)
  y[v,a,b] ∈ [0,1] value v is sent a→b (a ≠ b)                   (once per value and destination)
  z[w,d] ∈ [0,1]   resident buffer w held on d (binary at optimum since memory rows push it down)
  T ≥ 0            per-micro-batch bottleneck (throughput objective only)
Rows:
  assign[g]:      Σ_d x[g,d] = 1
  cross[v,c,a,b]: y[v,a,b] ≥ x[src(v),a] + x[c,b] − 1          c ∈ dst(v)
  flow[v,c,b]:    Σ_a≠b y[v,a,b] ≥ x[c,b] − x[src(v),b]          (``flow``: the bound's valid inequality)
  resident[w,g,d]: z[w,d] ≥ x[g,d]                              g ∈ touch(w)
  compute[d]:     bg[d] + ω·Σ_g t[g,d]·x[g,d] ≤ T
  link[a,b]:      bg[a,b] + ω·(Σ_v s[v]·y[v,a,b] + Σ_h s[h]·x[src(h),a]) ≤ T   (h: handoffs into b)
  memory[d]:      Σ_w size[w]·z[w,d] ≤ capacity[d] − activations     (w already counted on d: coefficient 0)
Objective: throughput  min T (+ ε·total work as a tie-break);
           step        min (m−1)·T + Σ_d Σ_g t·x + Σ transfer s·y: an upper bound on the pipeline step
                       max(m·T, latency + (m−1)·T), since the sequential sum bounds one micro-batch's latency;
           weighted    min Σ_d α_d·Σ_g t·x + β·Σ transfer s·y  (latency mode: α = β = 1, the sequential
                       critical path of a chain; pattern generation sweeps α, β);
           async       min T with the extra row latency: Σ_g t·x + Σ s·y ≤ m·T, so that m·T is the period
                       max(m·T, L) of m micro-batches advancing independently (L, one micro-batch's path
                       through a chain placement, is its sequential sum); + ε·(Σ t·x + Σ s·y) as a tie-break.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tessera.plan.solver.highs import INF, INFEASIBLE, Model, Solution
from tessera.plan.solver.problem import PhaseProblem

TIE_BREAK = 1e-4  # weight of total work in the throughput objective, relative to T


@dataclass(frozen=True, kw_only=True)
class Background:
    """Loads other work puts on the same resources per cycle (seconds): added to compute/link rows."""

    device_s: tuple[float, ...]
    link_s: dict[tuple[int, int], float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, kw_only=True)
class FlatResult:
    group_dev: tuple[int, ...]
    objective: float
    status: str
    solve_s: float
    mip_gap: float


@dataclass
class _Index:
    x: np.ndarray  # [G, D] column ids
    y: dict[tuple[int, int, int], int]  # (v, a, b) -> column
    z: dict[tuple[int, int], int]  # (w, d) -> column
    T: int | None  # noqa: N815


def make_async(model: Model, t_col: int, micro: int) -> None:
    """Turn a model built for the ``step`` objective (column costs = one micro-batch's sequential work and
    transfers, T's cost m−1) into the ``async`` one: row latency[·]: Σ_j c_j·col_j − m·T ≤ 0, objective
    T + ε·Σ_j c_j·col_j."""
    terms = {j: c for j, c in enumerate(model.col_cost) if j != t_col and c != 0.0}
    terms[t_col] = -float(micro)
    model.row("latency", terms, ub=0.0)
    model.col_cost = [1.0 if j == t_col else TIE_BREAK * c for j, c in enumerate(model.col_cost)]


def build_flat(prob: PhaseProblem, *, objective: str = "throughput", omega: float = 1.0,
               background: Background | None = None, alpha: tuple[float, ...] | None = None,
               beta: float = 1.0, memory: bool = True, micro: int = 1,
               mem_price: tuple[float, ...] | None = None, flow: bool = False) -> tuple[Model, _Index]:
    """``flow`` adds the rows flow[v,c,b]: a consumer on b whose producer is not on b receives the value
    on b from some device. Integral placements satisfy them with their own sends, so they cut no placement
    off; relaxed, they charge a transfer wherever the fractional assignment changes along a dependency
    (cross[·] alone lets x = ½ on both devices send nothing), which tightens the LP bound."""
    assert objective in ("throughput", "weighted", "step", "async")
    if objective == "async":
        model, idx = build_flat(prob, objective="step", omega=omega, background=background, memory=memory,
                                micro=micro, flow=flow)
        assert idx.T is not None
        make_async(model, idx.T, micro)
        return model, idx
    D, G = prob.D, prob.G  # noqa: N806
    pairs = prob.pool.pairs()
    m = Model(f"place[{prob.graph.model}/{prob.graph.phase}]")
    thr = objective == "throughput"
    rows_t = objective in ("throughput", "step")  # compute/link rows bound T
    alpha = alpha or tuple([1.0] * D)
    # ---- step 1: assignment variables x[g,d] and assign[g] ----
    x = np.zeros((G, D), dtype=int)
    for g in range(G):
        pin = prob.pinned.get(g)
        for d in range(D):
            ub = 1.0 if pin is None or pin == d else 0.0
            lb = 1.0 if pin == d else 0.0
            # throughput: ε·ω·t tie-break (prefer less total work at equal T); weighted: α_d·t
            c = TIE_BREAK * omega * float(prob.t[g, d]) if thr else alpha[d] * float(prob.t[g, d])
            x[g, d] = m.var(f"x[{g},{d}]", lb=lb, ub=ub, cost=c, integer=True)
        m.row(f"assign[{g}]", {int(x[g, d]): 1.0 for d in range(D)}, lb=1.0, ub=1.0)
    T = m.var("T", cost=1.0 if thr else float(micro - 1)) if rows_t else None  # noqa: N806
    # ---- step 2: crossing variables y[v,a,b] and cross rows ----
    y: dict[tuple[int, int, int], int] = {}
    for vi, v in enumerate(prob.values):
        for a, b in pairs:
            c = 0.0 if thr else beta * float(prob.xfer_s[vi])
            y[vi, a, b] = col = m.var(f"y[{vi},{a},{b}]", ub=1.0, cost=c)
            for cg in v.dst:
                m.row(f"cross[{vi},{cg},{a},{b}]", {col: 1.0, int(x[v.src, a]): -1.0, int(x[cg, b]): -1.0},
                      lb=-1.0)
        if flow:
            for cg in v.dst:
                for b in range(D):
                    terms = {y[vi, a, b]: 1.0 for a in range(D) if a != b}
                    terms[int(x[cg, b])], terms[int(x[v.src, b])] = -1.0, 1.0
                    m.row(f"flow[{vi},{cg},{b}]", terms, lb=0.0)
    # ---- step 3: residency z[w,d] (a one-group buffer uses x directly) ----
    z: dict[tuple[int, int], int] = {}
    for wi, w in enumerate(prob.residents):
        for d in range(D):
            if len(w.groups) == 1:
                z[wi, d] = int(x[w.groups[0], d])
                continue
            z[wi, d] = col = m.var(f"z[{wi},{d}]", ub=1.0)
            for g in w.groups:
                m.row(f"resident[{wi},{g},{d}]", {col: 1.0, int(x[g, d]): -1.0}, lb=0.0)
    # weighted objective may price residency: + Σ_w,d γ_d·size[w]·z[w,d] (memory-aware pattern sweep)
    if mem_price is not None and not thr:
        for (wi, d), col in z.items():
            m.col_cost[col] += mem_price[d] * float(prob.residents[wi].bytes)
    # ---- step 4: loads (throughput and step objectives) ----
    if rows_t:
        bg = background or Background(device_s=tuple([0.0] * D))
        for d in range(D):
            terms = {int(x[g, d]): omega * float(prob.t[g, d]) for g in range(G)}
            terms[T] = -1.0
            m.row(f"compute[{d}]", terms, ub=-bg.device_s[d])
        for a, b in pairs:
            terms = {y[vi, a, b]: omega * float(prob.xfer_s[vi]) for vi in range(len(prob.values))}
            for h in prob.handoffs:
                if h.device == b:
                    j = int(x[h.src, a])
                    terms[j] = terms.get(j, 0.0) + omega * prob.handoff_s(h)
            terms[T] = -1.0
            m.row(f"link[{a},{b}]", terms, ub=-bg.link_s.get((a, b), 0.0))
    # ---- step 5: memory[d] ----
    if memory:
        for d in range(D):
            terms = {}
            for wi, w in enumerate(prob.residents):
                if d in prob.preresident.get(w.name, frozenset()):
                    continue
                terms[z[wi, d]] = terms.get(z[wi, d], 0.0) + float(w.bytes)
            cap = prob.free_bytes(d)
            if terms:
                m.row(f"memory[{d}]", terms, ub=cap)
            elif cap < 0:
                m.row(f"memory[{d}]", {int(x[0, d]): 0.0}, ub=cap)
    return m, _Index(x=x, y=y, z=z, T=T)


def weighted_costs(prob: PhaseProblem, idx: _Index, n_cols: int, *, alpha: tuple[float, ...], beta: float,
                   mem_price: tuple[float, ...] | None = None) -> np.ndarray:
    """The column costs build_flat gives the weighted objective (α_d·t on x, β·s on y, γ_d·size on z), for
    re-solving one built model across a sweep; a test holds the two equal."""
    c = np.zeros(n_cols)
    for d in range(prob.D):
        c[idx.x[:, d]] = alpha[d] * prob.t[:, d]
    for (vi, _a, _b), col in idx.y.items():
        c[col] = beta * float(prob.xfer_s[vi])
    if mem_price is not None:
        for (wi, d), col in idx.z.items():
            c[col] += mem_price[d] * float(prob.residents[wi].bytes)
    return c


def start_vector(prob: PhaseProblem, model: Model, idx: _Index, group_dev: list[int] | tuple[int, ...],
                 *, omega: float = 1.0, background: Background | None = None,
                 micro: int | None = None) -> np.ndarray:
    """``micro``: the async objective's m (T must also cover one micro-batch's sequential work / m)."""
    """A full column vector for a given group assignment (a MIP start hint)."""
    v = np.zeros(model.n_cols)
    D = prob.D  # noqa: N806
    for g, d in enumerate(group_dev):
        v[idx.x[g, d]] = 1.0
    link = {p: 0.0 for p in prob.pool.pairs()}
    for vi, val in enumerate(prob.values):
        a = group_dev[val.src]
        for b in {group_dev[c] for c in val.dst} - {a}:
            v[idx.y[vi, a, b]] = 1.0
            link[a, b] += float(prob.xfer_s[vi])
    for h in prob.handoffs:
        a = group_dev[h.src]
        if a != h.device:
            link[a, h.device] += prob.handoff_s(h)
    for (wi, d), col in idx.z.items():
        if any(group_dev[g] == d for g in prob.residents[wi].groups):
            v[col] = 1.0
    if idx.T is not None:
        bg = background or Background(device_s=tuple([0.0] * D))
        comp = [bg.device_s[d] + omega * sum(prob.t[g, d] for g in range(prob.G) if group_dev[g] == d)
                for d in range(D)]
        links = [bg.link_s.get(p, 0.0) + omega * s for p, s in link.items()]
        total = [(sum(comp) + sum(links)) / micro] if micro else []
        v[idx.T] = max(comp + links + total)
    return v


def solve_flat(prob: PhaseProblem, *, objective: str = "throughput", omega: float = 1.0,
               background: Background | None = None, alpha: tuple[float, ...] | None = None,
               beta: float = 1.0, starts: list[tuple[int, ...]] | None = None, mip_rel_gap: float = 0.0,
               time_limit_s: float = 60.0, m: int = 1, period_cap_s: float | None = None,
               max_nodes: int | None = None) -> FlatResult:
    """Solve the flat MILP; ``starts`` are group assignments handed to HiGHS as MIP starts.
    ``period_cap_s`` (async only): T ≤ cap / m, so only placements whose modelled period m·T meets the
    cap are searched; "infeasible" when none does, which HiGHS usually proves at the root."""
    model, idx = build_flat(prob, objective=objective, omega=omega, background=background, alpha=alpha,
                            beta=beta, micro=m)
    if period_cap_s is not None:
        assert objective == "async" and idx.T is not None, objective
        model.col_ub[idx.T] = period_cap_s / m
    micro = m if objective == "async" else None
    hints = [start_vector(prob, model, idx, s, omega=omega, background=background, micro=micro)
             for s in starts or []]
    sol = model.solve(mip_rel_gap=mip_rel_gap, time_limit_s=time_limit_s, starts=hints, max_nodes=max_nodes)
    return _result(prob, idx, sol, objective)


def _result(prob: PhaseProblem, idx: _Index, sol: Solution, objective: str) -> FlatResult:
    if not sol.ok:
        return FlatResult(group_dev=(), objective=INF, status=sol.status, solve_s=sol.solve_s, mip_gap=INF)
    xs = sol.values[idx.x]
    gd = tuple(int(i) for i in np.argmax(xs, axis=1))
    obj = float(sol.values[idx.T]) if idx.T is not None and objective in ("throughput", "async") else sol.objective
    return FlatResult(group_dev=gd, objective=obj, status=sol.status, solve_s=sol.solve_s, mip_gap=sol.mip_gap)


def lp_bound(parts: list[tuple[np.ndarray, float]], n_devices: int,
             background: Background | None = None) -> float:
    """Upper bound on throughput as a lower bound on T: x relaxed to [0,1], transfers free, no memory.

    ``parts`` are (t[G,D], ω) for every phase sharing the devices; returns the LP's minimal T.
    """
    m = Model("bound")
    T = m.var("T", cost=1.0)  # noqa: N806
    comp: list[dict[int, float]] = [{T: -1.0} for _ in range(n_devices)]
    for pi, (t, omega) in enumerate(parts):
        for g in range(t.shape[0]):
            cols = [m.var(f"x[{pi},{g},{d}]", ub=1.0) for d in range(n_devices)]
            m.row(f"assign[{pi},{g}]", {c: 1.0 for c in cols}, lb=1.0, ub=1.0)
            for d, c in enumerate(cols):
                comp[d][c] = omega * float(t[g, d])
    bg = background.device_s if background else tuple([0.0] * n_devices)
    for d in range(n_devices):
        m.row(f"compute[{d}]", comp[d], ub=-bg[d])
    sol = m.solve(relax=True)
    assert sol.status == "optimal", f"LP bound: {sol.status}"
    return float(sol.values[T])


def loads(prob: PhaseProblem, group_dev: list[int] | tuple[int, ...]) -> tuple[list[float], dict[tuple[int, int], float]]:
    """compute[d] and link[a,b] of one step (ω = 1, no background) for a group assignment."""
    dev = [0.0] * prob.D
    for g, d in enumerate(group_dev):
        dev[d] += float(prob.t[g, d])
    link = {p: 0.0 for p in prob.pool.pairs()}
    for vi, v in enumerate(prob.values):
        a = group_dev[v.src]
        for b in {group_dev[c] for c in v.dst} - {a}:
            link[a, b] += float(prob.xfer_s[vi])
    for h in prob.handoffs:
        a = group_dev[h.src]
        if a != h.device:
            link[a, h.device] += prob.handoff_s(h)
    return dev, link


def objective_value(prob: PhaseProblem, group_dev: list[int] | tuple[int, ...], objective: str, m: int = 1,
                    background: Background | None = None) -> float:
    """The MILP objective of a given placement (ε tie-break left out)."""
    dev, lk = loads(prob, group_dev)
    bg = background or Background(device_s=tuple([0.0] * prob.D))
    t = max([bg.device_s[d] + dev[d] for d in range(prob.D)] + [bg.link_s.get(p, 0.0) + x for p, x in lk.items()])
    if objective == "throughput":
        return t
    total = sum(dev) + sum(lk.values())
    if objective == "async":  # per micro-batch: the period is m times this
        return max(t, total / m)
    return total + (m - 1) * t if objective == "step" else total


def lp_bound_memory(prob: PhaseProblem) -> float:
    """The same relaxation keeping the memory rows (z relaxed): still an upper bound on throughput, and
    the one a memory-bound pool (weights barely fit) can approach; inf when nothing fits. The step and
    latency objectives' relaxations are bound.lp_bound_joint's."""
    from dataclasses import replace

    free = replace(prob, values=[], xfer_s=np.zeros(0), handoffs=[])
    model, idx = build_flat(free, objective="throughput")
    model.col_cost = [1.0 if j == idx.T else 0.0 for j in range(model.n_cols)]  # no tie-break in a bound
    sol = model.solve(relax=True)
    if sol.status in INFEASIBLE:  # no placement fits memory at all
        return math.inf
    assert sol.status == "optimal", f"LP bound with memory: {sol.status}"
    return float(sol.values[idx.T])
