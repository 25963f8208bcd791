"""advise: which GPU mix to rent from the catalog for a budget, against the best homogeneous and the best
prefill/decode mix for the same budget, with simulated metrics and throughput–cost frontier points; or,
given GPUs already owned (``have``), which to add for the budget.

Everything is goodput at the SLO under the serving model (tessera.plan.search), cells planned as in
plan_fleet (cells.py). Catalog types are pruned first: each type's TP groups (1, 4 or 8 GPUs) that serve the
model at the SLO *and whose rented GPUs the budget pays for*, ranked by their best goodput per dollar, best
``keep`` kept (a type owned is always kept: its GPUs cost nothing more). Candidate cells over the kept types
go through the integer program of mix.py with a budget row and no availability rows (rent any number; with
owned GPUs, the budget pays for those beyond them).
  mix:            every candidate cell, Tessera's answer for it.
  homogeneous:    cells of one GPU type only (a TP group, or a same-type pair valued at plan_serving's
                  homogeneous strategy: TP=2 or two replicas), best over types.
  prefill_decode: pair cells valued at their prefill/decode baseline (DistServe, rate-matched).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.contracts import FrontierPoint, Provenance, SimResult
from tessera.contracts.plan import PoolCell, PoolPlan
from tessera.errors import UserError
from tessera.fleet.cells import Cell, CellPlanner, candidate_cells, cell_name, is_group
from tessera.fleet.fleet import cell_planner, fleet_config
from tessera.fleet.mix import MixSolution, Owned, lazy_mix, verify_mix
from tessera.hardware import gpu_names
from tessera.plan import PlannerConfig, planner_provenance, resolve_gpu
from tessera.sim import LatencyTargets, LengthSpec, WorkloadSpec, simulate_pool

RENT_UP_TO = 8  # same-type GPUs one cell may hold when renting (TP groups of 1, 4, 8 and pairs)


@dataclass(frozen=True, kw_only=True)
class MixChoice:
    group: str  # mix | homogeneous | prefill_decode | owned (what the GPUs owned serve alone)
    counts: tuple[tuple[Cell, int], ...]  # (cell GPUs, count)
    chosen: tuple[str | None, ...]  # per cell: "milp" or the strategy whose plan it is
    throughput_per_s: float  # goodput at the SLO, output tokens/s (images/s)
    usd_per_hour: float  # what is rented: every GPU, or those beyond the ones owned
    gap: float  # certified gap to the upper-bound optimum (mix.py)
    rent: tuple[tuple[str, int], ...] = ()  # GPU type -> how many to rent (beyond those owned)

    @property
    def per_dollar(self) -> float:
        return self.throughput_per_s / self.usd_per_hour if self.usd_per_hour > 0 else 0.0

    @property
    def label(self) -> str:
        """Counts and cells, each cell's plan named where the mix took a baseline's: 2x(2xMI300X = homogeneous)."""
        def one(c: Cell, how: str | None) -> str:
            return f"{cell_name(c)} = {how}" if how and how != "milp" else cell_name(c)

        return " + ".join(f"{n}x({one(c, h)})" for (c, n), h in zip(self.counts, self.chosen, strict=True)) or "nothing"

    @property
    def rent_label(self) -> str:
        return ", ".join(f"{n}x{g}" for g, n in self.rent) or "nothing"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "cells": [{"gpus": list(g), "count": n, "chosen": h}
                                               for (g, n), h in zip(self.counts, self.chosen, strict=True)],
                "rent": [[g, n] for g, n in self.rent], "throughput_per_s": self.throughput_per_s,
                "usd_per_hour": self.usd_per_hour, "throughput_per_usd_hour": self.per_dollar, "gap": self.gap}


@dataclass(frozen=True, kw_only=True)
class MixSim:
    """The advised mix simulated behind one router (simulate_mix): the simulator's ``result``, the requests
    it ran, the offered, predicted (the mix's goodput at the SLO) and capacity output rates, and the steady
    rate once ramp-up is past (all output tokens/s, images/s for image models)."""

    result: SimResult
    requests: int
    offered_per_s: float
    predicted_per_s: float
    capacity_per_s: float
    steady_per_s: float

    def to_dict(self) -> dict[str, Any]:
        """The simulator's contract with the mix's figures after it (its own ``requests`` replaced)."""
        return {**self.result.to_json(), "requests": self.requests, "offered_per_s": self.offered_per_s,
                "predicted_per_s": self.predicted_per_s, "capacity_per_s": self.capacity_per_s,
                "steady_per_s": self.steady_per_s}


@dataclass(frozen=True, kw_only=True)
class Advice:
    model: str
    budget_usd_per_hour: float
    config: PlannerConfig  # what the cells were planned with
    kept_types: tuple[str, ...]
    pruned: tuple[tuple[str, str], ...]  # (type, why)
    mix: MixChoice
    homogeneous: MixChoice | None
    prefill_decode: MixChoice | None
    have: tuple[tuple[str, int], ...] = ()  # GPUs already owned (type, count); () : rent everything
    owned: MixChoice | None = None  # what the owned GPUs serve alone (with ``have``)
    sim: MixSim | None = None  # the mix simulated behind one router
    verdict: str = ""
    advise_s: float = 0.0
    pool: PoolPlan | None = None  # the mix's cells as a pool plan (what `tessera simulate` takes)
    provenance: Provenance | None = None

    def to_dict(self) -> dict[str, Any]:
        """The advice; written to a file (-o) after the mix's pool plan, which simulate and report read."""
        def ch(c: MixChoice | None) -> dict[str, Any] | None:
            return None if c is None else c.to_dict()
        return {"model": self.model, "budget_usd_per_hour": self.budget_usd_per_hour, "config": self.config.to_dict(),
                "have": [[g, n] for g, n in self.have], "kept_types": list(self.kept_types),
                "pruned": [list(p) for p in self.pruned], "mix": ch(self.mix), "homogeneous": ch(self.homogeneous),
                "prefill_decode": ch(self.prefill_decode), "owned": ch(self.owned),
                "sim": self.sim.to_dict() if self.sim else None,
                "verdict": self.verdict, "advise_s": self.advise_s,
                "provenance": self.provenance.to_dict() if self.provenance else None}

    def _file_dict(self) -> dict[str, Any]:
        """What `advise -o FILE` writes: the mix's pool plan (`tessera simulate FILE` and `tessera report
        --plan FILE` read it), the advice beside it, the provenance."""
        if self.pool is None:
            raise UserError(f"the advice for {self.model} rents nothing that serves it: no plan to write")
        return {**self.pool.to_dict(), "advice": self.to_dict(), "provenance": self.to_dict()["provenance"]}

    def save(self, path: str | Path) -> None:
        """Write ``_file_dict`` to ``path`` (`advise -o FILE`)."""
        Path(path).write_text(json.dumps(self._file_dict(), indent=1))

    def frontier_points(self) -> list[FrontierPoint]:
        return [FrontierPoint(label=f"{c.group} {c.label}", group=c.group, usd_per_hour=c.usd_per_hour,
                              throughput_per_s=c.throughput_per_s)
                for c in (self.mix, self.homogeneous, self.prefill_decode)
                if c is not None and c.usd_per_hour > 0 and c.throughput_per_s > 0]


def parse_have(text: str | None) -> dict[str, int]:
    """``H100:4,L40S:2`` -> {"H100-SXM": 4, "L40S": 2} (`advise --have`: aliases resolved, a type named
    twice summed, a bare TYPE counting one)."""
    counts: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, n = part.partition(":")
        try:
            count = int(n) if sep else 1
        except ValueError:
            count = 0
        if count < 1:
            raise UserError(f"--have {part.strip()!r} is not TYPE:COUNT with a count >= 1, e.g. H100:4,L40S:2")
        g = resolve_gpu(name.strip()).name
        counts[g] = counts.get(g, 0) + count
    return counts


def rent_usd(gpus: Cell, have: dict[str, int]) -> float:
    """$/h of the GPUs of ``gpus`` beyond those owned (``have``)."""
    extra: dict[str, int] = {}
    for g in gpus:
        extra[g] = extra.get(g, 0) + 1
    return sum(max(0, n - have.get(g, 0)) * resolve_gpu(g).usd_per_hour for g, n in extra.items())


def prune_types(cp: CellPlanner, types: list[str], keep: int, budget: float = float("inf"),
                have: dict[str, int] | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """Keep every owned type and the ``keep`` others whose TP groups (1, 4 or 8 GPUs) within ``budget``
    have the most goodput per $/h; a type none of whose serving groups the budget pays for is pruned and
    says so (the budget is applied before ranking, so a small budget keeps the types it can buy)."""
    have = have or {}
    ranked, pruned, owned = [], [], []
    for t in types:
        if have.get(t):  # owned: in pairs with rented GPUs even where no group of its own serves
            owned.append(t)
            continue
        evs = [e for c in candidate_cells({t: RENT_UP_TO}) if is_group(c) and (e := cp.evaluate(c)).feasible]
        if not evs:
            pruned.append((t, "no TP group of 1, 4 or 8 serves the model at the SLO"))
            continue
        within = [e for e in evs if e.usd_per_hour <= budget * (1 + 1e-9) and e.usd_per_hour > 0]
        if not within:
            cheapest = min(evs, key=lambda e: e.usd_per_hour)
            pruned.append((t, f"its smallest serving group, {cell_name(cheapest.gpus)}, costs "
                              f"{cheapest.usd_per_hour:.2f} $/h, over the budget"))
            continue
        ranked.append((max(e.goodput_per_s / e.usd_per_hour for e in within), t))
    ranked.sort(reverse=True)
    kept = owned + [t for _, t in ranked[:keep]]
    pruned += [(t, f"{r:.0f} per $/h, below the {keep} best") for r, t in ranked[keep:]]
    return kept, pruned


def _choose(group: str, cp: CellPlanner, cells: list[Cell], budget: float, budget_s: float,
            value: str = "tessera", owned: Owned | None = None) -> MixChoice | None:
    """The budget program over ``cells`` valued at strategy ``value`` (Tessera's bound bounds every
    strategy: Tessera's answer is the best of them); with ``owned``, the budget pays for GPUs beyond them."""
    cells = [c for c in cells if cp.fits(c) and cp.upper_bound(c) > 0]
    if not cells:
        return None
    usd = {c: cp.usd_per_hour(c) for c in cells}

    def exact(c: Cell) -> float | None:
        return _value(cp, c, value) if cp.evaluated(c) else None

    lz = lazy_mix(cells, exact=exact, bound=cp.upper_bound, usd=usd, objective="throughput",
                  budget_usd_per_hour=budget, budget_s=budget_s, evaluate=lambda c: _value(cp, c, value),
                  owned=owned)
    best: MixSolution = lz.best
    thr = {c: _value(cp, c, value) for c in best.counts}
    t, u = verify_mix(best.counts, thr, usd, available=None, budget_usd_per_hour=budget, owned=owned)
    counts = tuple(sorted(best.counts.items(), key=lambda x: -x[1] * thr[x[0]]))
    chosen = tuple(cp.evaluate(c).chosen if value == "tessera" else value for c, _ in counts)
    rent = (owned or Owned(have={}, gpu_usd={})).rented(best.counts)
    return MixChoice(group=group, counts=counts, chosen=chosen, throughput_per_s=t, usd_per_hour=u, gap=lz.gap,
                     rent=tuple(rent.items()))


def _value(cp: CellPlanner, c: Cell, strategy: str) -> float:
    return cp.evaluate(c).strategy_goodput.get(strategy, 0.0)


def _types(catalog_types: list[str] | None, have: dict[str, int]) -> list[str]:
    """The GPU types to consider: those named (aliases resolved), else every priced catalog type; with
    the owned types always among them."""
    names = [resolve_gpu(t).name for t in catalog_types] if catalog_types else \
        [n for n in gpu_names() if not resolve_gpu(n).measured and resolve_gpu(n).usd_per_hour > 0]
    return list(dict.fromkeys([*have, *names]))


def advise(model: str, cfg: PlannerConfig | None, budget_usd_per_hour: float,
           catalog_types: list[str] | None = None, *, keep: int = 3, budget_s: float = 10.0,
           simulate: bool = True, progress: Callable[[str], None] | None = None,
           have: dict[str, int] | None = None) -> Advice:
    """Which GPUs to rent for ``budget_usd_per_hour``; cells planned under ``fleet_config(cfg)``. ``have``:
    GPUs already owned (catalog type or alias -> count): the budget buys GPUs beyond them, and the answer
    says which to add."""
    have = {resolve_gpu(g).name: n for g, n in (have or {}).items()}
    if not budget_usd_per_hour >= 0 or (budget_usd_per_hour == 0 and not have):
        raise UserError(f"--budget-usd-per-hour {budget_usd_per_hour:g} must be > 0 (0 only with --have: what "
                        "the GPUs you have serve alone)")
    t0 = time.perf_counter()
    step = progress or (lambda _d: None)
    cfg = fleet_config(cfg)
    types = _types(catalog_types, have)
    step("capturing the model")
    cp = cell_planner(model, cfg)
    step(f"planning TP groups of {len(types)} GPU types")
    kept, pruned = prune_types(cp, types, keep, budget_usd_per_hour, have)
    if not kept:
        raise UserError(_nothing_fits(model, budget_usd_per_hour, pruned))
    owned = Owned(have=have, gpu_usd={t: resolve_gpu(t).usd_per_hour for t in kept}) if have else None
    cands = [c for c in candidate_cells(dict.fromkeys(kept, RENT_UP_TO)) if cp.fits(c)]
    step("choosing the mix")
    mix = _choose("mix", cp, cands, budget_usd_per_hour, budget_s, owned=owned)
    if mix is None or not mix.counts:
        raise UserError(_nothing_fits(model, budget_usd_per_hour, pruned))
    step("best homogeneous mix")
    homs = [h for t in kept if (h := _choose("homogeneous", cp, [c for c in cands if set(c) == {t}],
                                             budget_usd_per_hour, budget_s, value="homogeneous", owned=owned))]
    hom = max(homs, key=lambda c: c.throughput_per_s, default=None)
    step("best prefill/decode mix")
    pd = _choose("prefill_decode", cp, [c for c in cands if len(c) == 2], budget_usd_per_hour, budget_s,
                 value="prefill_decode", owned=owned)
    if pd is not None and pd.throughput_per_s <= 0:
        pd = None
    alone = None
    if owned is not None:
        step("what the GPUs you have serve alone")
        alone = _choose("owned", cp, [c for c in cands if set(c) <= set(have)], 0.0, budget_s, owned=owned)
    pool = mix_pool(cp, mix)
    sim = None
    if simulate:
        step("simulating the mix")
        sim = simulate_mix(cp, mix)
    return Advice(model=model, budget_usd_per_hour=budget_usd_per_hour, config=cfg,
                  kept_types=tuple(kept), pruned=tuple(pruned), mix=mix, homogeneous=hom, prefill_decode=pd,
                  have=tuple(have.items()), owned=alone, sim=sim,
                  verdict=verdict_owned(mix, alone) if owned else verdict(mix, hom),
                  advise_s=time.perf_counter() - t0, pool=pool,
                  provenance=planner_provenance(model, cfg, pool, images=cp.images))


def _nothing_fits(model: str, budget: float, pruned: list[tuple[str, str]]) -> str:
    why = "; ".join(f"{t}: {w}" for t, w in pruned) or "no GPU type to consider"
    return f"budget {budget:g} $/h buys nothing that serves {model} at the SLO ({why})"


def mix_pool(cp: CellPlanner, mix: MixChoice) -> PoolPlan | None:
    """The mix's cells (their Tessera plans) with their counts: what `tessera simulate` takes."""
    cells = tuple(PoolCell(plan=p, count=n) for c, n in mix.counts if (p := cp.evaluate(c).plan) is not None)
    return PoolPlan(cells=cells) if cells else None


def verdict(mix: MixChoice, hom: MixChoice | None) -> str:
    if hom is None:
        return "no homogeneous mix fits the budget"
    r = mix.per_dollar / hom.per_dollar if hom.per_dollar > 0 else float("inf")
    if r > 1 + 1e-9:
        return (f"the mix beats the best homogeneous mix ({hom.label}) by {r:.3f}x goodput per $/h "
                f"({mix.per_dollar:.1f} vs {hom.per_dollar:.1f})")
    return (f"the mix does not beat the best homogeneous mix ({hom.label}): {mix.per_dollar:.1f} vs "
            f"{hom.per_dollar:.1f} goodput per $/h; the best cells are of one type for this model and budget")


def verdict_owned(mix: MixChoice, alone: MixChoice | None) -> str:
    """What the additions buy over the GPUs owned alone."""
    base = alone.throughput_per_s if alone is not None else 0.0
    if not mix.rent:
        return f"add nothing: the GPUs you have serve {base:,.1f} per s at the SLO; the budget buys no gain"
    gain = mix.throughput_per_s - base
    return (f"add {mix.rent_label} ({mix.usd_per_hour:.2f} $/h): goodput from {base:,.1f} (the GPUs you have "
            f"alone) to {mix.throughput_per_s:,.1f} per s, +{gain / mix.usd_per_hour:,.1f} per s per $/h added")


def simulate_mix(cp: CellPlanner, mix: MixChoice) -> MixSim:
    """The mix's cells (their Tessera plans) behind one router in tessera.sim, Poisson arrivals at 90% of
    the predicted goodput over four request lifetimes (O · the slowest cell's TPOT), so that most of the run
    is steady state; ``steady_per_s`` is the output rate from a quarter of the arrival span to its end."""
    pool = mix_pool(cp, mix)
    assert pool is not None, "a mix with goodput has plans"
    t, slo = cp.cfg.traffic, cp.cfg.slo
    per_request = 1 if cp.images else t.output
    rate = 0.9 * mix.throughput_per_s / per_request  # the mix's goodput at the SLO, not its plans' capacity
    life_s = max((c.plan.latency_s or 0.0) for c in pool.cells) * (t.steps if cp.images else t.output)
    requests = max(500, int(rate * 4 * life_s))
    spec = WorkloadSpec(kind="poisson", requests=requests, rate_per_s=rate,
                        prompt=LengthSpec(lo=t.prompt, hi=t.prompt), output=LengthSpec(lo=t.output, hi=t.output))
    sim_slo = None if cp.images else LatencyTargets.of(slo)
    res = simulate_pool(pool.sim_cells(), spec, slo=sim_slo)
    span = requests / rate
    steady = res.steady_per_s(0.25 * span, span, default=0.0)
    return MixSim(result=res, requests=requests, offered_per_s=rate * per_request,
                  predicted_per_s=mix.throughput_per_s, capacity_per_s=pool.throughput_per_s, steady_per_s=steady)


def frontier(model: str, cfg: PlannerConfig | None, budgets: list[float], **kw: Any) -> list[Any]:
    """FrontierPoints of the mix, homogeneous and prefill/decode choices per budget."""
    pts = []
    for b in budgets:
        pts += advise(model, cfg, b, simulate=False, **kw).frontier_points()
    return pts
