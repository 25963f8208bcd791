"""The integer program that picks how many of each cell type to run, and the lazy search around it.

Cell types t (a tuple of GPU names), GPU types g. uses[t,g]: GPUs of type g one cell of type t takes.
    c[t] ∈ ℤ, 0 ≤ c[t]                                         (cells of type t)
    avail[g]:  Σ_t uses[t,g]·c[t] ≤ available[g]                (the pool; absent for the advisor)
    budget:    Σ_t usd[t]·c[t] ≤ budget_usd_per_hour            (the advisor; absent for a pool)
With GPUs already owned (the advisor's ``have``, h[g] of type g, price p[g] per GPU-hour): r[g] ∈ ℤ, r[g] ≥ 0
GPUs of type g rented on top, and the budget pays for those only:
    own[g]:    Σ_t uses[t,g]·c[t] − r[g] ≤ h[g]
    budget:    Σ_g p[g]·r[g] ≤ budget_usd_per_hour              (with h = 0 the row above)
objective "throughput":  max Σ_t thr[t]·c[t]  (ties: a tiny cost term prefers the cheaper fleet)
objective "per_dollar":  max Σ thr·c / Σ usd·c  by Dinkelbach: λ ← ratio of the best c of
    max Σ c·(thr − λ·usd) s.t. Σ c ≥ 1 (row "some"), until that maximum is 0; then, among the fleets at
    that ratio, the one with the most throughput: max Σ thr·c s.t. Σ c·(thr − λ*·usd) ≥ 0 (row "ratio").

Lazy search: thr[t] is exact for cells the planner has evaluated and an upper bound (cells.py) for the
rest. When the optimum with upper bounds uses only evaluated cells it is the true optimum; otherwise the
most valuable unevaluated cell of a guide solution (bounds scaled by the exact/bound ratio seen so far) is
evaluated and the program re-solved, until that holds or the time budget is spent (an evaluation is not
started when one as slow as the slowest so far would end past it). The answer is then
the optimum over evaluated cells, with its certified gap to the upper-bound optimum.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from tessera.errors import UserError
from tessera.plan.solver.highs import Model

OBJECTIVES = ("throughput", "per_dollar")
Cell = tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MixSolution:
    counts: dict[Cell, int]
    throughput_per_s: float
    usd_per_hour: float
    solve_s: float

    @property
    def per_dollar(self) -> float:
        return self.throughput_per_s / self.usd_per_hour if self.usd_per_hour > 0 else 0.0

    def score(self, objective: str) -> float:
        return self.per_dollar if objective == "per_dollar" else self.throughput_per_s


@dataclass(frozen=True, kw_only=True)
class Owned:
    """GPUs the advisor's user already has (``have``: type -> count) and the hourly price of one more GPU
    of each type a cell may use (``gpu_usd``): the budget pays for GPUs beyond ``have`` only."""

    have: dict[str, int]
    gpu_usd: dict[str, float]

    def rented(self, counts: dict[Cell, int]) -> dict[str, int]:
        """GPUs of each type a mix uses beyond those owned."""
        used: dict[str, int] = {}
        for k, n in counts.items():
            for g in k:
                used[g] = used.get(g, 0) + n
        return {g: u - self.have.get(g, 0) for g, u in sorted(used.items()) if u > self.have.get(g, 0)}

    def usd_per_hour(self, counts: dict[Cell, int]) -> float:
        return sum(self.gpu_usd[g] * n for g, n in self.rented(counts).items())


def solve_mix(thr: dict[Cell, float], usd: dict[Cell, float], *, objective: str = "throughput",
              available: dict[str, int] | None = None, budget_usd_per_hour: float | None = None,
              owned: Owned | None = None) -> MixSolution:
    """The integer program of the module docstring over cells with thr > 0; with ``owned`` the budget pays
    for rented GPUs only and ``usd_per_hour`` of the answer is theirs."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    cells = sorted(c for c, v in thr.items() if v > 0)
    if owned is not None:
        if objective != "throughput" or budget_usd_per_hour is None:
            raise ValueError("owned GPUs go with a budget and the throughput objective")
        c = _solve_owned(cells, thr, usd, owned, budget_usd_per_hour)
        t = sum(n * thr[k] for k, n in c.items())
        return MixSolution(counts={k: v for k, v in c.items() if v}, throughput_per_s=t,
                           usd_per_hour=owned.usd_per_hour(c), solve_s=time.perf_counter() - t0)
    if objective == "throughput":
        c = _solve(cells, thr, usd, available, budget_usd_per_hour, lam=None, ratio=None)
    else:
        lam = 0.0
        c = {}
        for _ in range(50):  # Dinkelbach converges superlinearly; a handful of rounds in practice
            c = _solve(cells, thr, usd, available, budget_usd_per_hour, lam=lam, ratio=None)
            t, u = _totals(c, thr, usd)
            if u <= 0 or t / u <= lam * (1 + 1e-9):
                break
            lam = t / u
        if lam > 0:
            c = _solve(cells, thr, usd, available, budget_usd_per_hour, lam=None, ratio=lam * (1 - 1e-9))
    t, u = _totals(c, thr, usd)
    return MixSolution(counts={k: v for k, v in c.items() if v}, throughput_per_s=t, usd_per_hour=u,
                       solve_s=time.perf_counter() - t0)


def _totals(c: dict[Cell, int], thr: dict[Cell, float], usd: dict[Cell, float]) -> tuple[float, float]:
    return sum(n * thr[k] for k, n in c.items()), sum(n * usd[k] for k, n in c.items())


def _solve(cells: list[Cell], thr: dict[Cell, float], usd: dict[Cell, float], available: dict[str, int] | None,
           budget: float | None, *, lam: float | None, ratio: float | None) -> dict[Cell, int]:
    if not cells:
        return {}
    mdl = Model("fleet_mix")
    scale = max(thr[k] for k in cells)
    tie = 1e-6 * scale / max(max(usd[k] for k in cells), 1e-9)  # prefer the cheaper of equal fleets
    col: dict[Cell, int] = {}
    for k in cells:
        ub = math.inf
        if available is not None:
            ub = min(available.get(g, 0) // k.count(g) for g in set(k))
        if budget is not None and usd[k] > 0:
            ub = min(ub, math.floor(budget / usd[k] + 1e-9))
        if ub == math.inf:
            raise UserError("an unbounded mix: give a pool or a budget")
        gain = thr[k] - lam * usd[k] if lam is not None else thr[k] - tie * usd[k]
        col[k] = mdl.var(f"c[{'+'.join(k)}]", ub=ub, cost=-gain, integer=True)  # HiGHS minimises
    if available is not None:
        for g, n in sorted(available.items()):
            terms = [(col[k], float(k.count(g))) for k in cells if g in k]
            if terms:
                mdl.row(f"avail[{g}]", terms, ub=float(n))  # Σ_t uses[t,g]·c[t] ≤ available[g]
    if budget is not None:
        mdl.row("budget", [(col[k], usd[k]) for k in cells], ub=budget)  # Σ usd·c ≤ budget
    if lam is not None:
        mdl.row("some", [(col[k], 1.0) for k in cells], lb=1.0)  # Σ c ≥ 1: a fleet, not nothing
    if ratio is not None:
        mdl.row("ratio", [(col[k], thr[k] - ratio * usd[k]) for k in cells], lb=0.0)  # Σ c·(thr − λ*·usd) ≥ 0
    sol = mdl.solve(mip_rel_gap=1e-9, time_limit_s=60.0)
    if not sol.ok:
        return {}
    return {k: int(round(sol.values[j])) for k, j in col.items()}


def _solve_owned(cells: list[Cell], thr: dict[Cell, float], usd: dict[Cell, float], owned: Owned,
                 budget: float) -> dict[Cell, int]:
    """The program with owned GPUs (module doc): cells c[t] and rented GPUs r[g]."""
    if not cells:
        return {}
    mdl = Model("fleet_mix_owned")
    types = sorted({g for k in cells for g in k})
    scale = max(thr[k] for k in cells)
    tie = 1e-6 * scale / max(max(owned.gpu_usd[g] for g in types), 1e-9)  # of equal fleets, rent the cheaper
    # a cell never costs more than its GPUs rented: budget plus what the owned GPUs are worth bounds c[t]
    worth = budget + sum(owned.gpu_usd[g] * owned.have.get(g, 0) for g in types)
    if any(usd[k] <= 0 for k in cells):
        raise UserError("an unbounded mix: a cell of free GPUs; give the advisor priced GPU types")
    col = {k: mdl.var(f"c[{'+'.join(k)}]", ub=math.floor(worth / usd[k] + 1e-9), cost=-thr[k], integer=True)
           for k in cells}  # HiGHS minimises
    rent = {g: mdl.var(f"r[{g}]", ub=math.floor(budget / owned.gpu_usd[g] + 1e-9) if owned.gpu_usd[g] > 0
                       else 0.0, cost=tie * owned.gpu_usd[g], integer=True) for g in types}
    for g in types:  # Σ_t uses[t,g]·c[t] − r[g] ≤ h[g]
        mdl.row(f"own[{g}]", [*((col[k], float(k.count(g))) for k in cells if g in k), (rent[g], -1.0)],
                ub=float(owned.have.get(g, 0)))
    mdl.row("budget", [(rent[g], owned.gpu_usd[g]) for g in types], ub=budget)  # Σ p[g]·r[g] ≤ budget
    sol = mdl.solve(mip_rel_gap=1e-9, time_limit_s=60.0)
    if not sol.ok:
        return {}
    return {k: int(round(sol.values[j])) for k, j in col.items()}


def verify_mix(counts: dict[Cell, int], thr: dict[Cell, float], usd: dict[Cell, float], *,
               available: dict[str, int] | None, budget_usd_per_hour: float | None,
               owned: Owned | None = None) -> tuple[float, float]:
    """Independent check of a chosen mix: GPU use per type, the budget, the totals (throughput, usd/h; with
    ``owned``, the rented GPUs' usd/h)."""
    used: dict[str, int] = {}
    for k, n in counts.items():
        assert n >= 0, f"negative count for {k}"
        for g in k:
            used[g] = used.get(g, 0) + n
    if available is not None:
        for g, n in used.items():
            assert n <= available.get(g, 0), f"mix uses {n} {g}, pool has {available.get(g, 0)}"
    t = sum(n * thr[k] for k, n in counts.items())
    u = owned.usd_per_hour(counts) if owned is not None else sum(n * usd[k] for k, n in counts.items())
    if budget_usd_per_hour is not None:
        assert u <= budget_usd_per_hour * (1 + 1e-9), f"mix costs {u} $/h over budget {budget_usd_per_hour}"
    return t, u


@dataclass(frozen=True, kw_only=True)
class LazyResult:
    best: MixSolution
    upper: MixSolution  # the optimum with upper bounds for unevaluated cells
    gap: float  # 1 − best/upper on the objective; 0: certified optimal
    evaluated: int
    rounds: int


def lazy_mix(cells: list[Cell], *, exact: Callable[[Cell], float | None], bound: Callable[[Cell], float],
             usd: dict[Cell, float], objective: str, available: dict[str, int] | None = None,
             budget_usd_per_hour: float | None = None, budget_s: float = 15.0,
             evaluate: Callable[[Cell], float], owned: Owned | None = None) -> LazyResult:
    """``exact(t)``: the evaluated throughput or None; ``evaluate(t)`` plans the cell; ``bound(t)`` ≥ exact."""
    t0 = time.perf_counter()
    kw = dict(objective=objective, available=available, budget_usd_per_hour=budget_usd_per_hour, owned=owned)
    rounds = 0
    longest_s = 0.0  # the slowest evaluation so far: one is not started unless it should end within budget_s
    while True:
        rounds += 1
        ub = {k: (e if (e := exact(k)) is not None else bound(k)) for k in cells}
        upper = solve_mix(ub, usd, **kw)  # type: ignore[arg-type]
        todo = [k for k in upper.counts if exact(k) is None]
        if not todo or time.perf_counter() - t0 + longest_s > budget_s:
            break
        ratios = [exact(k) / bound(k) for k in cells if exact(k) is not None and len(k) > 1 and bound(k) > 0]
        rho = statistics.median(ratios) if ratios else 1.0  # guide: bounds scaled by what evaluation showed
        est = {k: (e if (e := exact(k)) is not None else rho * bound(k)) for k in cells}
        guide = solve_mix(est, usd, **kw)  # type: ignore[arg-type]
        pick = [k for k in guide.counts if exact(k) is None] or todo
        sol_of = guide if pick is not todo else upper
        e0 = time.perf_counter()
        evaluate(max(pick, key=lambda k: sol_of.counts[k] * est[k]))
        longest_s = max(longest_s, time.perf_counter() - e0)
    got = {k: e for k in cells if (e := exact(k)) is not None}
    best = solve_mix(got, usd, **kw)  # type: ignore[arg-type]
    up, b = upper.score(objective), best.score(objective)
    gap = max(0.0, 1.0 - b / up) if up > 0 else 0.0
    return LazyResult(best=best, upper=upper, gap=gap, evaluated=len(got), rounds=rounds)
