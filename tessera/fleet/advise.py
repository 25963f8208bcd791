"""advise: which GPU mix to rent from the catalog for a budget, against the best homogeneous and the best
prefill/decode mix for the same budget, with simulated metrics and throughput–cost frontier points.

Catalog types are pruned first: those whose single GPU holds the model, ranked by single-GPU throughput
per dollar (the planner's exact plan), best ``keep`` kept. Candidate cells over the kept types go through
the integer program of mix.py with a budget row and no availability rows (rent any number).
  mix:            every candidate cell, Tessera's plan.
  homogeneous:    cells of one GPU type only (single or same-type pair), best over types.
  prefill_decode: pair cells valued at their prefill/decode baseline (DistServe/Splitwise) plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tessera.errors import UserError
from tessera.fleet.cells import CellPlanner, candidate_cells, cell_name
from tessera.fleet.fleet import cell_planner
from tessera.fleet.mix import MixSolution, lazy_mix, verify_mix
from tessera.hardware import gpu_names
from tessera.plan.pool import Workload, resolve_gpu
from tessera.plan.types import Plan


@dataclass(frozen=True, kw_only=True)
class MixChoice:
    group: str  # mix | homogeneous | prefill_decode
    counts: tuple[tuple[tuple[str, ...], int], ...]  # (cell GPUs, count)
    throughput_per_s: float
    usd_per_hour: float
    gap: float  # certified gap to the upper-bound optimum (mix.py)

    @property
    def per_dollar(self) -> float:
        return self.throughput_per_s / self.usd_per_hour if self.usd_per_hour > 0 else 0.0

    @property
    def label(self) -> str:
        return " + ".join(f"{n}x({cell_name(c)})" for c, n in self.counts) or "nothing"


@dataclass(frozen=True, kw_only=True)
class Advice:
    model: str
    budget_usd_per_hour: float
    workload: dict[str, int] = field(hash=False)
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
            return {"label": c.label, "cells": [{"gpus": list(g), "count": n} for g, n in c.counts],
                    "throughput_per_s": c.throughput_per_s, "usd_per_hour": c.usd_per_hour,
                    "throughput_per_usd_hour": c.per_dollar, "gap": c.gap}
        return {"model": self.model, "budget_usd_per_hour": self.budget_usd_per_hour, "workload": self.workload,
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
    ranked, pruned = [], []
    for t in types:
        ev = cp.evaluate((t,))
        if not ev.feasible or ev.usd_per_hour <= 0:
            pruned.append((t, "a single GPU does not hold the model" if not ev.feasible else "no price"))
        else:
            ranked.append((ev.throughput_per_s / ev.usd_per_hour, t))
    ranked.sort(reverse=True)
    kept = [t for _, t in ranked[:keep]]
    pruned += [(t, f"{r:.0f} per $/h, below the {keep} best") for r, t in ranked[keep:]]
    return kept, pruned


def _choose(group: str, cp: CellPlanner, cells: list[tuple[str, ...]], budget: float, budget_s: float,
            value: str = "tessera") -> MixChoice | None:
    cells = [c for c in cells if cp.upper_bound(c) > 0]
    if not cells:
        return None
    usd = {c: cp.usd_per_hour(c) for c in cells}

    def exact(c: tuple[str, ...]) -> float | None:
        if not cp.evaluated(c):
            return None
        return cp.evaluate(c).strategy_per_s.get(value, 0.0)

    lz = lazy_mix(cells, exact=exact, bound=cp.upper_bound, usd=usd, objective="throughput",
                  budget_usd_per_hour=budget, budget_s=budget_s, evaluate=lambda c: cp.evaluate(c).throughput_per_s)
    best: MixSolution = lz.best
    thr = {c: exact(c) or 0.0 for c in best.counts}
    t, u = verify_mix(best.counts, thr, usd, available=None, budget_usd_per_hour=budget)
    return MixChoice(group=group, counts=tuple(sorted(best.counts.items(), key=lambda x: -x[1] * thr[x[0]])),
                     throughput_per_s=t, usd_per_hour=u, gap=lz.gap)


def advise(model: str, workload: Workload | None, budget_usd_per_hour: float, slo: Any = None,
           catalog_types: list[str] | None = None, *, keep: int = 3, budget_s: float = 10.0,
           simulate: bool = True, link: str = "pcie5", progress: Any = None) -> Advice:
    if not budget_usd_per_hour > 0:
        raise UserError(f"budget_usd_per_hour={budget_usd_per_hour} must be > 0")
    t0 = time.perf_counter()
    step = progress or (lambda _d: None)
    w = workload or Workload(batch=32)
    types = [resolve_gpu(t).name for t in catalog_types] if catalog_types else \
        [n for n in gpu_names() if not resolve_gpu(n).measured and resolve_gpu(n).usd_per_hour > 0]
    step("capturing the model")
    cp = cell_planner(model, w, link)
    step(f"planning {len(types)} single-GPU cells")
    kept, pruned = prune_types(cp, types, keep)
    if not kept:
        raise UserError(f"{model} fits no single catalog GPU among {', '.join(types)}")
    cheapest = min(cp.usd_per_hour((t,)) for t in kept)
    if budget_usd_per_hour < cheapest:
        raise UserError(f"budget {budget_usd_per_hour} $/h buys no GPU; the cheapest kept type costs {cheapest} $/h")
    cands = candidate_cells(kept)
    step("choosing the mix")
    mix = _choose("mix", cp, cands, budget_usd_per_hour, budget_s)
    assert mix is not None
    step("best homogeneous mix")
    homs = [h for t in kept if (h := _choose("homogeneous", cp, [(t,), (t, t)], budget_usd_per_hour, budget_s))]
    hom = max(homs, key=lambda c: c.throughput_per_s, default=None)
    step("best prefill/decode mix")
    pd = _choose("prefill_decode", cp, [c for c in cands if len(c) == 2], budget_usd_per_hour, budget_s,
                 value="prefill_decode")
    if pd is not None and pd.throughput_per_s <= 0:
        pd = None
    sim = None
    if simulate:
        step("simulating the mix")
        sim = simulate_mix(cp, mix, w, slo)
    return Advice(model=model, budget_usd_per_hour=budget_usd_per_hour,
                  workload={"batch": w.batch, "prompt": w.prompt, "output": w.output, "steps": w.steps},
                  kept_types=tuple(kept), pruned=tuple(pruned), mix=mix, homogeneous=hom, prefill_decode=pd,
                  sim=sim, verdict=verdict(mix, hom), advise_s=time.perf_counter() - t0)


def verdict(mix: MixChoice, hom: MixChoice | None) -> str:
    if hom is None:
        return "no homogeneous mix fits the budget"
    r = mix.per_dollar / hom.per_dollar if hom.per_dollar > 0 else float("inf")
    if r > 1 + 1e-9:
        return (f"the mix beats the best homogeneous mix ({hom.label}) by {r:.3f}x throughput per $/h "
                f"({mix.per_dollar:.1f} vs {hom.per_dollar:.1f})")
    return (f"the mix does not beat the best homogeneous mix ({hom.label}): {mix.per_dollar:.1f} vs "
            f"{hom.per_dollar:.1f} throughput per $/h; the best cells are of one type for this model and budget")


def simulate_mix(cp: CellPlanner, mix: MixChoice, w: Workload, slo: Any = None) -> dict[str, Any]:
    """The mix's cells (Tessera's plans with full StepPoint tables) behind one router in tessera.sim, offline
    load of three full batches per cell (fewer requests and the run is all ramp-up and drain)."""
    from tessera.sim import LengthSpec, WorkloadSpec, simulate_pool

    requests = 3 * sum(n * w.batch * len(c) for c, n in mix.counts)
    cells: list[tuple[Plan, int]] = [(cp.full_plan(c), n) for c, n in mix.counts]
    spec = WorkloadSpec(kind="offline", requests=requests, prompt=LengthSpec(lo=w.prompt, hi=w.prompt),
                        output=LengthSpec(lo=w.output, hi=w.output))
    return simulate_pool(cells, spec, slo=slo).to_json()


def frontier(model: str, workload: Workload | None, budgets: list[float], **kw: Any) -> list[Any]:
    """FrontierPoints (tessera.report.data) of the mix, homogeneous and prefill/decode choices per budget."""
    pts = []
    for b in budgets:
        pts += advise(model, workload, b, simulate=False, **kw).frontier_points()
    return pts
