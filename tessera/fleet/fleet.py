"""plan_fleet: cells formed from a many-GPU pool, replicated, chosen by the integer program (mix.py).

Steps: candidate cells (cells.py) over the pool's types, dropped if the weights cannot fit them; group
cells (one GPU, a TP group of 4 or 8) planned at once, pairs bounded (cheap) and planned lazily by
``plan_serving`` (mix.py); the answer with its certified gap, verified independently. ``replan_without``
re-plans on the survivors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tessera.contracts.plan import Plan, PoolCell, PoolPlan
from tessera.contracts.provenance import Provenance
from tessera.errors import UserError
from tessera.fleet.cells import Cell, CellPlanner, candidate_cells, cell_name, is_group
from tessera.fleet.mix import OBJECTIVES, lazy_mix, verify_mix
from tessera.fleet.spec import FleetSpec
from tessera.plan import PlannerConfig, planner_provenance

# 3: the file is a pool plan (``version``, ``cells``: count and plan each, what `tessera simulate` and
# `tessera report` read) with the fleet's own figures in ``fleet`` and a ``provenance`` object beside them
FLEET_VERSION = 3
# How the fleet narrows the caller's PlannerConfig: micro-batch counts 1 and 2 (of plan_serving's 1, 2, 4,
# 8), a 5% MILP gap and 1 s per MILP solve, so that a pair plans in a few seconds and 16 GPUs of five types
# in well under 30 s. Cells are valued and planned under this one config; nothing is re-planned afterwards.
SEARCH_MICROBATCHES = (1, 2)
SEARCH_MIP_REL_GAP = 0.05
SEARCH_TIME_LIMIT_S = 1.0


def fleet_config(cfg: PlannerConfig | None = None, *, link: str | None = None) -> PlannerConfig:
    """``cfg`` (default: plan_serving's defaults) narrowed for the fleet search, on the pool's link."""
    cfg = cfg or PlannerConfig()
    ms = tuple(sorted({1, *(m for m in cfg.microbatches if m in SEARCH_MICROBATCHES)}))
    return replace(cfg, microbatches=ms, mip_rel_gap=max(cfg.mip_rel_gap, SEARCH_MIP_REL_GAP),
                   time_limit_s=min(cfg.time_limit_s, SEARCH_TIME_LIMIT_S), link=link or cfg.link)


@dataclass(frozen=True, kw_only=True)
class FleetCell:
    """One chosen cell type: its GPUs, how many copies, and what one copy serves."""

    gpus: Cell
    count: int
    goodput_per_s: float  # one cell, output tokens/s (images/s) meeting the SLO
    usd_per_hour: float  # one cell
    chosen: str | None  # Tessera's answer for the cell: "milp" or the baseline it adopted


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    version: int = FLEET_VERSION
    model: str
    objective: str
    link: str
    unit: str  # tokens/s | images/s
    config: PlannerConfig  # what the cells were planned with
    available: tuple[tuple[str, int], ...]  # the pool: GPU type -> count
    cells: tuple[FleetCell, ...]
    plans: PoolPlan  # each chosen cell's Plan with its count, in the order of ``cells``
    goodput_per_s: float
    usd_per_hour: float
    usd_per_million_tokens: float | None
    unused: dict[str, int] = field(hash=False)
    upper_bound_per_s: float  # the objective's optimum with upper bounds for unplanned cells (mix.py)
    gap: float  # certified: 1 − ours / upper (0 = optimal among the candidate cells)
    candidates: int
    largest_candidate_gpus: int  # GPUs in the largest candidate cell (a TP group of up to 8)
    evaluated: int
    plan_s: float  # everything: capture, bounds, cell plans, integer programs
    eval_s: float  # planning cells
    bound_s: float  # bounding pairs
    solve_s: float  # integer programs
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The pool plan's own fields (so either reader takes the file), the fleet's figures in "fleet" and
        the provenance."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("cells", "plans")}
        d["config"] = self.config.to_dict()
        d["available"] = [list(x) for x in self.available]
        d["cells"] = [{"gpus": list(c.gpus), "count": c.count, "goodput_per_s": c.goodput_per_s,
                       "usd_per_hour": c.usd_per_hour, "chosen": c.chosen} for c in self.cells]
        d["notes"] = list(self.notes)
        return {**self.plans.to_dict(), "fleet": d, "provenance": self.provenance.to_dict()}

    @property
    def provenance(self) -> Provenance:
        return planner_provenance(self.model, self.config, self.plans, images=self.unit == "images/s")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetPlan:
        f = d.get("fleet") if isinstance(d, dict) else None
        if not isinstance(f, dict) or f.get("version") != FLEET_VERSION:
            got = f.get("version") if isinstance(f, dict) else (d.get("version") if isinstance(d, dict) else d)
            raise ValueError(f"fleet plan version {got!r} is not {FLEET_VERSION}: write it again with "
                             "`tessera plan MODEL --pool POOL.toml -o FILE`")
        cells = tuple(FleetCell(**{**c, "gpus": tuple(c["gpus"])}) for c in f["cells"])
        rest = {k: v for k, v in f.items() if k not in ("cells", "available", "notes", "config")}
        return cls(**rest, config=PlannerConfig.from_dict(f["config"]), cells=cells, plans=PoolPlan.from_dict(d),
                   available=tuple((str(g), int(n)) for g, n in f["available"]), notes=tuple(f.get("notes", ())))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> FleetPlan:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"cannot read fleet plan {path}: {e}") from None

    @property
    def spec(self) -> FleetSpec:
        return FleetSpec(gpus=self.available, link=self.link)

    def sim_cells(self) -> list[tuple[Plan, int]]:
        """(plan, count) per cell type: what tessera.sim.simulate_pool takes."""
        return self.plans.sim_cells()


_PLANNERS: dict[tuple[str, PlannerConfig], CellPlanner] = {}


def cell_planner(model: str, cfg: PlannerConfig) -> CellPlanner:
    """One CellPlanner per (model, config) per process: evaluations are reused across pools and budgets."""
    key = (model, cfg)
    if key not in _PLANNERS:
        _PLANNERS[key] = CellPlanner(model, cfg)
    return _PLANNERS[key]


def plan_fleet(model: str, spec: FleetSpec, cfg: PlannerConfig | None = None, *, objective: str = "throughput",
               budget_s: float = 25.0, max_gpus: int = 8,
               progress: Callable[[str], None] | None = None) -> FleetPlan:
    """Cells of up to ``max_gpus`` GPUs planned under ``fleet_config(cfg)`` on the pool's link.
    ``budget_s``: the wall time the whole plan aims for (capture and bounds included); pairs are planned
    lazily while it lasts, then the search settles on planned cells and reports its certified gap.
    ``progress(description)`` is called before each slow step (the CLI's progress lines)."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    step = progress or (lambda _d: None)
    cfg = fleet_config(cfg, link=spec.link)
    step("capturing the model")
    cp = cell_planner(model, cfg)
    e0, b0 = cp.eval_s, cp.bound_s
    cands = bounded_candidates(cp, spec, max_gpus, step)

    def exact(c: Cell) -> float | None:
        return cp.evaluate(c).goodput_per_s if cp.evaluated(c) else None

    def evaluate(c: Cell) -> float:
        step(f"planning cell {cell_name(c)}")
        return cp.evaluate(c).goodput_per_s

    step("choosing cells")
    usd = {c: cp.usd_per_hour(c) for c in cands}
    lz = lazy_mix(cands, exact=exact, bound=cp.upper_bound, usd=usd, objective=objective, available=spec.counts,
                  budget_s=budget_s - (time.perf_counter() - t0), evaluate=evaluate)
    if not lz.best.counts:
        reasons = "; ".join(f"{cell_name(c)}: {cp.evaluate(c).reason}" for c in cands if cp.evaluated(c))
        raise UserError(f"no cell of this pool serves {model} at the SLO: {reasons}")
    counts = lz.best.counts
    thr = {c: cp.evaluate(c).goodput_per_s for c in counts}
    t, u = verify_mix(counts, thr, usd, available=spec.counts, budget_usd_per_hour=None)
    assert abs(t - lz.best.throughput_per_s) <= 1e-6 * max(1.0, t), "verifier disagrees with the program's total"
    order = sorted(counts.items(), key=lambda x: -x[1] * thr[x[0]])
    used = {g: sum(n * c.count(g) for c, n in counts.items()) for g, _ in spec.gpus}
    return FleetPlan(
        model=model, objective=objective, link=spec.link, unit="images/s" if cp.images else "tokens/s",
        config=cfg, available=spec.gpus,
        cells=tuple(FleetCell(gpus=c, count=n, goodput_per_s=thr[c], usd_per_hour=usd[c],
                              chosen=cp.evaluate(c).chosen) for c, n in order),
        plans=PoolPlan(cells=tuple(PoolCell(plan=_plan_of(cp, c), count=n) for c, n in order)),
        goodput_per_s=t, usd_per_hour=u, usd_per_million_tokens=None if cp.images or t <= 0 else u / 3600 / t * 1e6,
        unused={g: n - used[g] for g, n in spec.gpus if n > used[g]},
        upper_bound_per_s=lz.upper.score(objective), gap=lz.gap, candidates=len(cands),
        largest_candidate_gpus=max(len(c) for c in cands), evaluated=lz.evaluated,
        plan_s=time.perf_counter() - t0, eval_s=cp.eval_s - e0, bound_s=cp.bound_s - b0,
        solve_s=lz.best.solve_s + lz.upper.solve_s,
        notes=tuple(_notes(cfg, lz.gap, budget_s, len(cands) - lz.evaluated)))


def plan_pool_file(model: str, pool_path: str | Path, cfg: PlannerConfig | None = None, *,
                   objective: str = "throughput", progress: Callable[[str], None] | None = None) -> FleetPlan:
    """``plan_fleet`` on the pool file at ``pool_path`` (`tessera plan --pool`, `tessera fleet plan`)."""
    return plan_fleet(model, FleetSpec.load(pool_path), cfg, objective=objective, progress=progress)


def bounded_candidates(cp: CellPlanner, spec: FleetSpec, max_gpus: int, step: Any) -> list[Cell]:
    """The pool's candidate cells that hold the weights, groups planned, pairs bounded; those with a zero
    bound (nothing meets the SLO) dropped."""
    cands = [c for c in candidate_cells(spec.counts, max_gpus=max_gpus) if cp.fits(c)]
    for c in cands:
        if is_group(c):
            step(f"planning cell {cell_name(c)}")
            cp.evaluate(c)
    step(f"bounding {len(cands)} candidate cells")
    cands = [c for c in cands if cp.upper_bound(c) > 0]
    if not cands:
        raise UserError(f"{cp.model} fits no cell of this pool ({', '.join(f'{n}x{g}' for g, n in spec.gpus)}) at "
                        f"the SLO: no GPU type, TP group or pair holds the weights and meets it")
    return cands


def _plan_of(cp: CellPlanner, c: Cell) -> Plan:
    p = cp.evaluate(c).plan
    assert p is not None, f"cell {cell_name(c)} has goodput but no plan"
    return p


def _notes(cfg: PlannerConfig, gap: float, budget_s: float, unplanned: int) -> list[str]:
    notes = [f"candidates: one GPU, TP groups of 4 and 8, same-type and mixed pairs (plan_serving: TP=2, "
             f"replicas or the MILP); cells planned with micro-batch counts {', '.join(map(str, cfg.microbatches))} "
             f"and ≤ {cfg.time_limit_s:g} s, gap {cfg.mip_rel_gap:g} per MILP solve"]
    if gap > 1e-9:
        notes.append(f"search stopped at its {budget_s:g} s planning budget: within {gap:.1%} of the best any candidate "
                     f"mix could reach (upper bounds for {unplanned} unplanned cells)")
    return notes


def replan_without(fleet: FleetPlan, lost_gpu: str, *, budget_s: float = 25.0) -> tuple[FleetPlan, float]:
    """The fleet after one ``lost_gpu`` fails, re-planned on the survivors; returns (plan, seconds taken)."""
    t0 = time.perf_counter()
    new = plan_fleet(fleet.model, fleet.spec.without(lost_gpu), fleet.config, objective=fleet.objective,
                     budget_s=budget_s)
    return new, time.perf_counter() - t0
