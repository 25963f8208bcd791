"""advise: which GPU mix to rent from the catalog for a budget, against the best homogeneous and the best
prefill/decode mix for the same budget, with simulated metrics and throughput–cost frontier points.

Everything is goodput at the SLO under the serving model (tessera.plan.serve), cells planned as in
plan_fleet (cells.py). Catalog types are pruned first: each type's best TP group (1, 2, 4 or 8 GPUs) that
serves the model at the SLO, ranked by goodput per dollar, best ``keep`` kept. Candidate cells over the kept
types go through the integer program of mix.py with a budget row and no availability rows (rent any number).
  mix:            every candidate cell, Tessera's answer for it.
  homogeneous:    cells of one GPU type only (a TP group, or a same-type pair valued at plan_serving's
                  homogeneous strategy: TP=2 or two replicas), best over types.
  prefill_decode: pair cells valued at their prefill/decode baseline (DistServe, rate-matched).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tessera.errors import UserError
from tessera.fleet.cells import Cell, CellPlanner, candidate_cells, cell_name, is_group
from tessera.fleet.fleet import cell_planner, config_dict, fleet_config
from tessera.fleet.mix import MixSolution, lazy_mix, verify_mix
from tessera.hardware import gpu_names
from tessera.plan.pool import resolve_gpu
from tessera.plan.serve import PlannerConfig
from tessera.plan.types import PoolCell, PoolPlan

RENT_UP_TO = 8  # same-type GPUs one cell may hold when renting (TP groups of 1, 4, 8 and pairs)


@dataclass(frozen=True, kw_only=True)
class MixChoice:
    group: str  # mix | homogeneous | prefill_decode
    counts: tuple[tuple[Cell, int], ...]  # (cell GPUs, count)
    chosen: tuple[str | None, ...]  # per cell: "milp" or the strategy whose plan it is
    throughput_per_s: float  # goodput at the SLO, output tokens/s (images/s)
    usd_per_hour: float
    gap: float  # certified gap to the upper-bound optimum (mix.py)

    @property
    def per_dollar(self) -> float:
        return self.throughput_per_s / self.usd_per_hour if self.usd_per_hour > 0 else 0.0

    @property
    def label(self) -> str:
        """Counts and cells, each cell's plan named where the mix took a baseline's: 2x(2xMI300X = homogeneous)."""
        def one(c: Cell, how: str | None) -> str:
            return f"{cell_name(c)} = {how}" if how and how != "milp" else cell_name(c)

        return " + ".join(f"{n}x({one(c, h)})" for (c, n), h in zip(self.counts, self.chosen, strict=True)) or "nothing"


@dataclass(frozen=True, kw_only=True)
class Advice:
    model: str
    budget_usd_per_hour: float
    config: dict[str, Any] = field(hash=False)  # the PlannerConfig cells were planned with
    kept_types: tuple[str, ...]
    pruned: tuple[tuple[str, str], ...]  # (type, why)
    mix: MixChoice
    homogeneous: MixChoice | None
    prefill_decode: MixChoice | None
    sim: dict[str, Any] | None = field(default=None, hash=False)  # simulate_pool's result for the mix
    verdict: str = ""
    advise_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        def ch(c: MixChoice | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {"label": c.label, "cells": [{"gpus": list(g), "count": n, "chosen": h}
                                                for (g, n), h in zip(c.counts, c.chosen, strict=True)],
                    "throughput_per_s": c.throughput_per_s, "usd_per_hour": c.usd_per_hour,
                    "throughput_per_usd_hour": c.per_dollar, "gap": c.gap}
        return {"model": self.model, "budget_usd_per_hour": self.budget_usd_per_hour, "config": self.config,
                "kept_types": list(self.kept_types), "pruned": [list(p) for p in self.pruned],
                "mix": ch(self.mix), "homogeneous": ch(self.homogeneous), "prefill_decode": ch(self.prefill_decode),
                "sim": self.sim, "verdict": self.verdict, "advise_s": self.advise_s}

    def frontier_points(self) -> list[Any]:
        from tessera.report.data import FrontierPoint

        return [FrontierPoint(label=f"{c.group} {c.label}", group=c.group, usd_per_hour=c.usd_per_hour,
                              throughput_per_s=c.throughput_per_s)
                for c in (self.mix, self.homogeneous, self.prefill_decode)
                if c is not None and c.usd_per_hour > 0 and c.throughput_per_s > 0]


def prune_types(cp: CellPlanner, types: list[str], keep: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Keep the ``keep`` types whose best TP group (1, 4 or 8 GPUs) has the most goodput per $/h."""
    ranked, pruned = [], []
    for t in types:
        evs = [cp.evaluate(c) for c in candidate_cells({t: RENT_UP_TO}) if is_group(c)]
        best = max((e.goodput_per_s / e.usd_per_hour for e in evs if e.feasible and e.usd_per_hour > 0), default=0.0)
        if best > 0:
            ranked.append((best, t))
        else:
            pruned.append((t, "no TP group of 1, 4 or 8 serves the model at the SLO" if evs else "no price"))
    ranked.sort(reverse=True)
    kept = [t for _, t in ranked[:keep]]
    pruned += [(t, f"{r:.0f} per $/h, below the {keep} best") for r, t in ranked[keep:]]
    return kept, pruned


def _choose(group: str, cp: CellPlanner, cells: list[Cell], budget: float, budget_s: float,
            value: str = "tessera") -> MixChoice | None:
    """The budget program over ``cells`` valued at strategy ``value`` (Tessera's bound bounds every
    strategy: Tessera's answer is the best of them)."""
    cells = [c for c in cells if cp.fits(c) and cp.upper_bound(c) > 0]
    if not cells:
        return None
    usd = {c: cp.usd_per_hour(c) for c in cells}

    def exact(c: Cell) -> float | None:
        return _value(cp, c, value) if cp.evaluated(c) else None

    lz = lazy_mix(cells, exact=exact, bound=cp.upper_bound, usd=usd, objective="throughput",
                  budget_usd_per_hour=budget, budget_s=budget_s, evaluate=lambda c: _value(cp, c, value))
    best: MixSolution = lz.best
    thr = {c: _value(cp, c, value) for c in best.counts}
    t, u = verify_mix(best.counts, thr, usd, available=None, budget_usd_per_hour=budget)
    counts = tuple(sorted(best.counts.items(), key=lambda x: -x[1] * thr[x[0]]))
    chosen = tuple(cp.evaluate(c).chosen if value == "tessera" else value for c, _ in counts)
    return MixChoice(group=group, counts=counts, chosen=chosen, throughput_per_s=t, usd_per_hour=u, gap=lz.gap)


def _value(cp: CellPlanner, c: Cell, strategy: str) -> float:
    return cp.evaluate(c).strategy_goodput.get(strategy, 0.0)


def advise(model: str, cfg: PlannerConfig | None, budget_usd_per_hour: float,
           catalog_types: list[str] | None = None, *, keep: int = 3, budget_s: float = 10.0,
           simulate: bool = True, progress: Any = None) -> Advice:
    """Which GPUs to rent for ``budget_usd_per_hour``; cells planned under ``fleet_config(cfg)``."""
    if not budget_usd_per_hour > 0:
        raise UserError(f"budget_usd_per_hour={budget_usd_per_hour} must be > 0")
    t0 = time.perf_counter()
    step = progress or (lambda _d: None)
    cfg = fleet_config(cfg)
    types = [resolve_gpu(t).name for t in catalog_types] if catalog_types else \
        [n for n in gpu_names() if not resolve_gpu(n).measured and resolve_gpu(n).usd_per_hour > 0]
    step("capturing the model")
    cp = cell_planner(model, cfg)
    step(f"planning TP groups of {len(types)} GPU types")
    kept, pruned = prune_types(cp, types, keep)
    if not kept:
        raise UserError(f"{model} is served at the SLO by no TP group of {', '.join(types)}")
    cands = [c for c in candidate_cells(dict.fromkeys(kept, RENT_UP_TO)) if cp.fits(c)]
    cheapest = min(cp.usd_per_hour(c) for c in cands if cp.upper_bound(c) > 0)
    if budget_usd_per_hour < cheapest:
        raise UserError(f"budget {budget_usd_per_hour} $/h buys no cell; the cheapest that serves {model} "
                        f"costs {cheapest:.2f} $/h")
    step("choosing the mix")
    mix = _choose("mix", cp, cands, budget_usd_per_hour, budget_s)
    assert mix is not None
    step("best homogeneous mix")
    homs = [h for t in kept if (h := _choose("homogeneous", cp, [c for c in cands if set(c) == {t}],
                                             budget_usd_per_hour, budget_s, value="homogeneous"))]
    hom = max(homs, key=lambda c: c.throughput_per_s, default=None)
    step("best prefill/decode mix")
    pd = _choose("prefill_decode", cp, [c for c in cands if len(c) == 2], budget_usd_per_hour, budget_s,
                 value="prefill_decode")
    if pd is not None and pd.throughput_per_s <= 0:
        pd = None
    sim = None
    if simulate:
        step("simulating the mix")
        sim = simulate_mix(cp, mix)
    return Advice(model=model, budget_usd_per_hour=budget_usd_per_hour, config=config_dict(cfg),
                  kept_types=tuple(kept), pruned=tuple(pruned), mix=mix, homogeneous=hom, prefill_decode=pd,
                  sim=sim, verdict=verdict(mix, hom), advise_s=time.perf_counter() - t0)


def verdict(mix: MixChoice, hom: MixChoice | None) -> str:
    if hom is None:
        return "no homogeneous mix fits the budget"
    r = mix.per_dollar / hom.per_dollar if hom.per_dollar > 0 else float("inf")
    if r > 1 + 1e-9:
        return (f"the mix beats the best homogeneous mix ({hom.label}) by {r:.3f}x goodput per $/h "
                f"({mix.per_dollar:.1f} vs {hom.per_dollar:.1f})")
    return (f"the mix does not beat the best homogeneous mix ({hom.label}): {mix.per_dollar:.1f} vs "
            f"{hom.per_dollar:.1f} goodput per $/h; the best cells are of one type for this model and budget")


def simulate_mix(cp: CellPlanner, mix: MixChoice) -> dict[str, Any]:
    """The mix's cells (their Tessera plans) behind one router in tessera.sim, Poisson arrivals at 90% of
    the predicted goodput over four request lifetimes (O · the slowest cell's TPOT), so that most of the run
    is steady state; ``steady_per_s`` is the output rate from a quarter of the arrival span to its end."""

    from tessera.sim import SLO, LengthSpec, WorkloadSpec, simulate_pool

    pool = PoolPlan(cells=tuple(PoolCell(plan=p, count=n) for c, n in mix.counts
                                if (p := cp.evaluate(c).plan) is not None))
    t, slo = cp.cfg.traffic, cp.cfg.slo
    per_request = 1 if cp.images else t.output
    rate = 0.9 * mix.throughput_per_s / per_request  # the mix's goodput at the SLO, not its plans' capacity
    life_s = max((c.plan.latency_s or 0.0) for c in pool.cells) * (t.steps if cp.images else t.output)
    requests = max(500, int(rate * 4 * life_s))
    spec = WorkloadSpec(kind="poisson", requests=requests, rate_per_s=rate,
                        prompt=LengthSpec(lo=t.prompt, hi=t.prompt), output=LengthSpec(lo=t.output, hi=t.output))
    sim_slo = None if cp.images else SLO(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s)
    res = simulate_pool(pool.sim_cells(), spec, slo=sim_slo)
    span = requests / rate
    steady = res.steady_per_s(0.25 * span, span, default=0.0)
    return {**res.to_json(), "requests": requests, "offered_per_s": rate * per_request,
            "predicted_per_s": mix.throughput_per_s, "capacity_per_s": pool.throughput_per_s, "steady_per_s": steady}


def frontier(model: str, cfg: PlannerConfig | None, budgets: list[float], **kw: Any) -> list[Any]:
    """FrontierPoints (tessera.report.data) of the mix, homogeneous and prefill/decode choices per budget."""
    pts = []
    for b in budgets:
        pts += advise(model, cfg, b, simulate=False, **kw).frontier_points()
    return pts
