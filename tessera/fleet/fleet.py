"""plan_fleet: cells formed from a many-GPU pool, replicated, chosen by the integer program (mix.py).

Steps: candidate cells (cells.py) over the pool's types, dropped if the model cannot fit them; upper
bounds for all (cheap); exact plans by the planner for singles at once and for pairs lazily (mix.py);
the answer with its certified gap, verified independently. ``replan_without`` re-plans on the survivors.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tessera.errors import UserError
from tessera.fleet.cells import CellPlanner, candidate_cells, cell_name
from tessera.fleet.mix import OBJECTIVES, lazy_mix, verify_mix
from tessera.fleet.spec import FleetSpec
from tessera.plan.pool import Workload
from tessera.plan.types import Plan

FLEET_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class FleetCell:
    gpus: tuple[str, ...]
    count: int
    throughput_per_s: float  # one cell
    usd_per_hour: float  # one cell
    plan: Plan  # Tessera's plan for one cell (search-time: one StepPoint per phase)


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    version: int = FLEET_VERSION
    model: str
    objective: str
    link: str
    unit: str  # tokens/s | images/s
    workload: dict[str, int] = field(hash=False)
    pool: tuple[tuple[str, int], ...]
    cells: tuple[FleetCell, ...]
    throughput_per_s: float
    usd_per_hour: float
    usd_per_million_tokens: float | None
    unused: dict[str, int] = field(hash=False)
    upper_bound_per_s: float  # the objective's optimum with upper bounds for unevaluated cells (mix.py)
    gap: float  # certified: 1 − ours / upper (0 = optimal among the candidate cells)
    candidates: int
    evaluated: int
    plan_s: float  # everything: captures, bounds, cell plans, integer programs
    eval_s: float  # planner time on cells
    solve_s: float  # integer programs
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FleetPlan:
        if not isinstance(d, dict) or d.get("version") != FLEET_VERSION:
            raise ValueError(f"fleet plan version {d.get('version') if isinstance(d, dict) else d!r} is not "
                             f"{FLEET_VERSION}")
        cells = tuple(FleetCell(gpus=tuple(c["gpus"]), count=c["count"], throughput_per_s=c["throughput_per_s"],
                                usd_per_hour=c["usd_per_hour"], plan=Plan.from_dict(c["plan"])) for c in d["cells"])
        rest = {k: v for k, v in d.items() if k not in ("cells", "pool", "notes")}
        return cls(**rest, cells=cells, pool=tuple((str(g), int(n)) for g, n in d["pool"]),
                   notes=tuple(d.get("notes", ())))

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
        return FleetSpec(gpus=self.pool, link=self.link)

    def sim_cells(self) -> list[tuple[Plan, int]]:
        """(plan, count) per cell type: what tessera.sim.simulate_pool takes."""
        return [(c.plan, c.count) for c in self.cells]


_PLANNERS: dict[tuple[str, Workload, str], CellPlanner] = {}


def cell_planner(model: str, workload: Workload, link: str) -> CellPlanner:
    """One CellPlanner per (model, workload, link) per process: evaluations are reused across pools."""
    key = (model, workload, link)
    if key not in _PLANNERS:
        _PLANNERS[key] = CellPlanner(model, workload, link=link)
    return _PLANNERS[key]


def plan_fleet(model: str, spec: FleetSpec, *, objective: str = "throughput", workload: Workload | None = None,
               budget_s: float = 10.0, progress: Any = None) -> FleetPlan:
    """``budget_s``: planner time the lazy search may spend on pair cells before it settles (gap reported).
    ``progress(description)`` is called before each slow step (the CLI's progress bar)."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    w = workload or Workload(batch=32)
    step = progress or (lambda _d: None)
    step("capturing the model")
    cp = cell_planner(model, w, spec.link)
    e0 = cp.eval_s
    avail = spec.counts
    cands = candidate_cells(list(avail))
    cands = [c for c in cands if all(avail[g] >= c.count(g) for g in set(c))]
    for c in cands:
        if len(c) == 1:
            step(f"planning cell {cell_name(c)}")
            cp.evaluate(c)
    step(f"bounding {len(cands)} candidate cells")
    cands = [c for c in cands if cp.upper_bound(c) > 0]
    if not cands:
        raise UserError(f"{model} fits no cell of this pool ({', '.join(f'{n}x{g}' for g, n in spec.gpus)}): "
                        f"each GPU type, and each pair, has less memory than the weights")
    usd = {c: cp.usd_per_hour(c) for c in cands}

    def exact(c: tuple[str, ...]) -> float | None:
        return cp.evaluate(c).throughput_per_s if cp.evaluated(c) else None

    def evaluate(c: tuple[str, ...]) -> float:
        step(f"planning cell {cell_name(c)}")
        return cp.evaluate(c).throughput_per_s

    step("choosing cells")
    lz = lazy_mix(cands, exact=exact, bound=cp.upper_bound, usd=usd, objective=objective, available=avail,
                  budget_s=budget_s, evaluate=evaluate)
    best = lz.best
    if not best.counts:
        reasons = "; ".join(f"{cell_name(c)}: {cp.evaluate(c).reason}" for c in cands if cp.evaluated(c))
        raise UserError(f"no cell of this pool holds {model}: {reasons}")
    thr = {c: cp.evaluate(c).throughput_per_s for c in best.counts}
    t, u = verify_mix(best.counts, thr, usd, available=avail, budget_usd_per_hour=None)
    assert abs(t - best.throughput_per_s) <= 1e-6 * max(1.0, t), "verifier disagrees with the program's throughput"
    used: dict[str, int] = {}
    for c, n in best.counts.items():
        for g in c:
            used[g] = used.get(g, 0) + n
    cells = []
    for c, n in sorted(best.counts.items(), key=lambda x: -x[1] * thr[x[0]]):
        ev = cp.evaluate(c)
        assert ev.plan is not None
        cells.append(FleetCell(gpus=c, count=n, throughput_per_s=ev.throughput_per_s, usd_per_hour=usd[c],
                               plan=ev.plan))
    images = "denoise" in cp.phases
    notes = ["candidates: singles, same-type pairs (kernel placement over two identical GPUs stands in for "
             "tensor parallelism, which the planner does not model) and heterogeneous pairs; search-time plans "
             "use one micro-batch per step"]
    if lz.gap > 1e-9:
        notes.append(f"search stopped at its {budget_s:g} s budget: within {lz.gap:.1%} of the best any "
                     f"candidate mix could reach (upper bounds for {len(cands) - lz.evaluated} unplanned cells)")
    return FleetPlan(
        model=model, objective=objective, link=spec.link, unit="images/s" if images else "tokens/s",
        workload={"batch": w.batch, "prompt": w.prompt, "output": w.output, "steps": w.steps}, pool=spec.gpus,
        cells=tuple(cells), throughput_per_s=t, usd_per_hour=u,
        usd_per_million_tokens=None if images or t <= 0 else u / 3600 / t * 1e6,
        unused={g: n - used.get(g, 0) for g, n in spec.gpus if n - used.get(g, 0) > 0},
        upper_bound_per_s=lz.upper.score(objective), gap=lz.gap, candidates=len(cands), evaluated=lz.evaluated,
        plan_s=time.perf_counter() - t0, eval_s=cp.eval_s - e0, solve_s=best.solve_s + lz.upper.solve_s,
        notes=tuple(notes))


def replan_without(fleet: FleetPlan, lost_gpu: str, *, budget_s: float = 10.0) -> tuple[FleetPlan, float]:
    """The fleet after one ``lost_gpu`` fails, re-planned on the survivors; returns (plan, seconds taken)."""
    t0 = time.perf_counter()
    survivors = fleet.spec.without(lost_gpu)
    w = Workload(**fleet.workload)
    new = plan_fleet(fleet.model, survivors, objective=fleet.objective, workload=w, budget_s=budget_s)
    return new, time.perf_counter() - t0
