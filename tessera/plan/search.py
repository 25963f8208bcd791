"""plan_serving: Tessera and every baseline for one model on one pool, each at its best operating point
under the serving model (serving.py), scored the same way. The steps, in order:

  shapes   one capture per model (a decode step at a reference batch, or an image step), rescaled to
           any micro-batch shape (shapes.iteration_graph);
  strategies  homogeneous (best tensor-parallel × replica split per GPU type), prefill/decode
           (rate-matched, DistServe), attention/FFN, layer pipeline (one module each under baselines/),
           and the MILP (strategies.milp);
  search   per strategy the batch and micro-batch count with the highest goodput under memory and SLO
           (cell.cell_strategy, serving.search), points an LP floor already decides skipped
           (bound.period_floor);
  bound    the MILP's plan against its LP bound at the chosen point (bound.async_bound);
  verify   every MILP answer re-scored by the independent verifier (strategies.milp);
  score    Tessera's answer is the best of its MILP plans and every baseline (each is a placement the
           MILP contains); ``chosen`` names which, so a kernel-level win is told from a tie.

The search and the plans run as tasks that ``workers`` processes share (search_strategies, forked.py).
"""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import tessera.plan.strategies as st
from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import STRATEGIES, Objective, Phase
from tessera.contracts.plan import Plan
from tessera.errors import UserError
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec, cell_link
from tessera.plan.baselines.attention_ffn import has_attention
from tessera.plan.baselines.homogeneous import homogeneous
from tessera.plan.baselines.prefill_decode import prefill_decode
from tessera.plan.captures import capture_source
from tessera.plan.config import PlannerConfig, ServingResult, StrategyResult
from tessera.plan.forked import run_shared
from tessera.plan.model.cell import Shapes, best_of, cell_strategy, make_plan, model_kind, strategy_space
from tessera.plan.model.serving import Searched, Traffic, closeness, score_point, search_m, slo_period_cap
from tessera.plan.model.units import UnitCost, make_unit
from tessera.plan.pool import Pool, engine_gpu, resolve_gpu
from tessera.plan.solver.bound import period_floor
from tessera.plan.solver.problem import default_cost

# ---- entry point -----------------------------------------------------------------------------------------------


def plan_serving(model: str, gpus: list[str] | str, cfg: PlannerConfig | None = None, *,
                 cost: KernelCosts | None = None, source=None,
                 progress: Callable[[str], None] | None = None, workers: int = 1) -> ServingResult:
    """``progress``, when given, is called with the name of each step as it starts (tessera.progress.Steps).
    ``workers``: processes sharing the search (this one and forked children, forked.run_shared); the
    answer does not depend on it."""
    if workers < 1:
        raise UserError(f"--jobs {workers} must be >= 1 (processes sharing one cell's search)")
    cfg = cfg or PlannerConfig()
    names = [n for n in (gpus.split(",") if isinstance(gpus, str) else gpus) if n.strip()]
    if not names:
        raise UserError("the pool has no GPUs; give --gpus A,B")
    specs = tuple(engine_gpu(resolve_gpu(n), cfg.gpu_memory_utilization) for n in names)
    lk = cell_link(specs, cfg.link)  # auto: the best link this cell can have; an unbuildable one is refused
    images, pd_ok = model_kind(model)
    t0 = time.perf_counter()
    step = progress or (lambda _desc: None)
    step(f"capture {model} (decode step at batch {cfg.ref_batch})" if not images else f"capture {model}")
    shapes = Shapes(model, source or capture_source(model), cfg, images)
    _check_fits(model, shapes, specs, cfg)  # before the cost tables load: a refusal costs only the capture
    cost = UnitCost.over(cost or default_cost())  # memoised: layers repeat kernels, the search repeats shapes
    out, solve_s = search_strategies(shapes, specs, lk, cost, cfg, pd_ok, workers=workers, step=step)
    mil = out.pop("milp")
    out["tessera"] = adopt_best(mil, out)
    res = ServingResult(model=model, gpus=tuple(s.name for s in specs), link=lk.name, config=cfg, images=images,
                        strategies={n: out[n] for n in STRATEGIES}, solve_s=solve_s,
                        wall_s=time.perf_counter() - t0)
    if not any(s.feasible for s in res.strategies.values()):
        raise UserError(no_point_message(res))
    return res


def search_strategies(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost: KernelCosts,
                      cfg: PlannerConfig, pd_ok: bool, *, workers: int,
                      step: Callable[[str], None]) -> tuple[dict[str, StrategyResult], float]:
    """Every strategy at its best point on every layout of the pool (the MILP as "milp"), and the MILP's
    solve seconds. The work runs as tasks: one per layout and micro-batch count, searching every strategy
    there (they share the shapes' graphs, LP floors and the baselines' placements, the MILP's starts), the
    two whole baselines, then one task per strategy's plan; ``workers`` processes share them
    (forked.run_shared), and the answers do not depend on how many."""
    lays = [LayoutSearch(shapes, units, ucost, lk, cfg) for units, ucost in layouts(specs, cost, cfg)]
    parts = [(li, m) for li, lay in enumerate(lays) if lay.searched for m in cfg.microbatches]
    tasks: list[Callable[[], Any]] = [functools.partial(lays[li].part, m) for li, m in parts]
    tasks += [lambda: homogeneous(shapes, specs, lk, cost, cfg),
              lambda: prefill_decode_sides(shapes, specs, lk, cost, cfg, pd_ok)]
    answers = run_shared(tasks, workers, task_progress(parts, lays, step))
    found: dict[tuple[int, str], list[Searched]] = defaultdict(list)
    for (li, _), (per_strategy, _) in zip(parts, answers[:len(parts)], strict=True):
        for name, searched in per_strategy.items():
            found[li, name].append(searched)
    step("each strategy's plan at its best point")
    finish = [(li, name) for li, lay in enumerate(lays) for name in lay.searched]
    plans = run_shared([functools.partial(lays[li].result, name, found[li, name]) for li, name in finish], workers)
    per_layout = [lay.unsearched() for lay in lays]
    for (li, name), (r, _) in zip(finish, plans, strict=True):
        per_layout[li][name] = r
    out = {"homogeneous": answers[-2], "prefill_decode": answers[-1]}
    for name in ("attention_ffn", "layer_pipeline", "milp"):
        out[name] = best_of([lay[name] for lay in per_layout])
    return out, sum(s for _, s in answers[:len(parts)]) + sum(s for _, s in plans)


def task_progress(parts: list[tuple[int, int]], lays: list[LayoutSearch],
                  step: Callable[[str], None]) -> Callable[[int], None]:
    """The progress line of task i of search_strategies (the searches' parts, then the two whole baselines)."""
    def started(i: int) -> None:
        if i < len(parts):
            li, m = parts[i]
            on = f" on {' + '.join(u.name for u in lays[li].cell.gpus)}" if len(lays) > 1 else ""
            step(f"the MILP, layer pipeline and attention/FFN{on}: batches at {m} micro-batch{'es' if m > 1 else ''}")
        else:
            step(("homogeneous: TP degree and batch per GPU type",
                  "prefill/decode: rate-matched pair")[i - len(parts)])
    return started


def _check_fits(model: str, shapes: Shapes, specs: tuple[GpuSpec, ...], cfg: PlannerConfig) -> None:
    need = sum(b.bytes for b in shapes.base.buffers if b.role == Role.WEIGHT)
    have = sum(s.mem_bytes for s in specs)
    if need > have:
        raise UserError(f"{model} does not fit {'+'.join(s.name for s in specs)} even with tensor parallelism: "
                        f"weights need {need / 1e9:.1f} GB, an engine may fill {have / 1e9:.1f} GB of the pool "
                        f"({cfg.gpu_memory_utilization:.0%} of each GPU less its runtime's; "
                        f"{(need - have) / 1e9:.1f} GB short)")


def no_point_message(res: ServingResult) -> str:
    """One line: the SLO no configuration meets, the point nearest to meeting it and what binds there
    (TTFT or TPOT with its time unloaded, or memory with its bytes), then every other strategy's reason."""
    c = res.config
    slo = (f"image latency ≤ {c.slo.image_s:g} s" if res.images else
           f"TTFT ≤ {c.slo.ttft_s:g} s and TPOT ≤ {c.slo.tpot_s * 1e3:g} ms")
    tried = [(n, s) for n, s in res.strategies.items() if s.applicable and s.reason]
    near = [(closeness(s.point, c.slo), n) for n, s in tried if s.point is not None and s.point.knee is not None]
    lead = min(near)[1] if near else None
    head = ""
    if lead is not None:
        p = res.strategies[lead].point
        binds = "image latency" if res.images else p.knee.binding
        head = f"; nearest: {lead}, {p.reason}: {binds} binds"
    rest = "; ".join(f"{n}: {s.reason}" for n, s in tried if n != lead)
    return f"no configuration of {res.model} on {'+'.join(res.gpus)} meets {slo}{head}" + (
        f" (others: {rest})" if rest else "")


# ---- strategies over one cell ----------------------------------------------------------------------------------


MAX_SINGLE_UNITS = 4  # beyond this many GPUs a cell's devices are tensor-parallel groups per type only


def layouts(specs: tuple[GpuSpec, ...], cost: KernelCosts,
            cfg: PlannerConfig) -> list[tuple[tuple[GpuSpec, ...], Any]]:
    """The ways a pool's GPUs form a cell's devices: every GPU its own device, and (where a type repeats)
    each type's GPUs as one tensor-parallel group (a power of two up to cfg.max_tp)."""
    out: list[tuple[tuple[GpuSpec, ...], Any]] = []
    if len(specs) <= MAX_SINGLE_UNITS:
        out.append((specs, cost))
    counts = Counter(s.name for s in specs)
    if max(counts.values()) > 1:
        by = {s.name: s for s in specs}
        if all(n & (n - 1) == 0 and n <= cfg.max_tp for n in counts.values()):
            groups = tuple((by[n], k) for n, k in counts.items())
            out.append((tuple(make_unit(g, k) for g, k in groups), UnitCost.over(cost, groups)))
    return out


def tp_degrees(units: tuple[GpuSpec, ...], cost: KernelCosts) -> tuple[int, ...]:
    """Tensor-parallel degree of each device of a layout (1 unless its cost model groups GPUs)."""
    return tuple(cost.tp_of(u) if isinstance(cost, UnitCost) else 1 for u in units)


def prefill_decode_sides(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost: KernelCosts,
                         cfg: PlannerConfig, pd_ok: bool) -> StrategyResult:
    """Prefill/decode on every layout of the pool with two devices: a pair of GPUs, or two GPU types each
    as one tensor-parallel group (4×H100 prefilling, 4×H20 decoding); the best of them."""
    if not pd_ok:
        return StrategyResult(name="prefill_decode", applicable=False,
                              reason="no prefill/decode phases (an image model)")
    sides = [(u, c) for u, c in layouts(specs, cost, cfg) if len(u) == 2]
    if not sides:
        return StrategyResult(name="prefill_decode", applicable=False, reason=(
            "needs two devices: a pair of GPUs, or two GPU types whose counts form tensor-parallel groups"))
    results = []
    for units, ucost in sides:
        results.append(replace(prefill_decode(shapes, units, lk, ucost, cfg), tp=tp_degrees(units, ucost)))
    return best_of(results)


class LayoutSearch:
    """One layout of the cell's devices: the placement rules of the strategies searched over it (the MILP's
    MIP starts are the baselines' rules, and one LP floor per shape serves all three searches: searched in
    one process, they share their answers at the shapes both visit)."""

    def __init__(self, shapes: Shapes, units: tuple[GpuSpec, ...], cost: KernelCosts, lk: LinkSpec,
                 cfg: PlannerConfig) -> None:
        self.shapes, self.cost, self.cfg = shapes, cost, cfg
        self.cell = cell = Pool(gpus=units, link=lk)
        self.tp = tp_degrees(units, cost)
        self.solve_log: list[float] = []  # this process's MILP solve seconds
        self.floor = st.memo(lambda g, b, m: period_floor(g, cell, cost, m)) if len(units) >= 2 else None
        self.placers: dict[str, Callable] = {}
        if len(units) >= 2:
            pipe = st.memo(st.layer_pipeline(units, lk, cost))
            af = st.memo(st.attention_ffn(units, lk, cost))
            pair = len(units) == 2
            self.placers["milp"] = st.milp(cell, cost, starts=[pipe] + ([af] if pair else []),
                                           mip_rel_gap=cfg.mip_rel_gap, time_limit_s=cfg.time_limit_s,
                                           max_nodes=cfg.mip_max_nodes, solve_log=self.solve_log,
                                           period_cap=lambda g: slo_period_cap(g, cfg.traffic, cfg.slo))
            self.placers["layer_pipeline"] = pipe
            if pair and has_attention(shapes.base):
                self.placers["attention_ffn"] = af

    @property
    def searched(self) -> tuple[str, ...]:
        """The strategies that apply here, the longest search first."""
        return tuple(self.placers)

    def part(self, m: int) -> tuple[dict[str, Searched], float]:
        """Every strategy's search at m micro-batches (the MILP's first: the baselines' placements it asks
        for as starts are then answered from memory), and the MILP's solve seconds it took."""
        n0 = len(self.solve_log)
        found = {name: search_m(strategy_space(placer, self.shapes, self.cell, self.cost, self.cfg,
                                               floor=self.floor), m) for name, placer in self.placers.items()}
        return found, sum(self.solve_log[n0:])

    def result(self, name: str, found: list[Searched]) -> tuple[StrategyResult, float]:
        """Strategy ``name``'s answer over this layout from its search's parts (one per micro-batch count of
        the config, in its order): the points the floor skipped placed when none met the SLO, the plan at
        its best point; and the MILP's solve seconds that took."""
        n0 = len(self.solve_log)
        r = cell_strategy("tessera" if name == "milp" else name, self.placers[name], self.shapes, self.cell,
                          self.cost, self.cfg, bound=name == "milp", floor=self.floor, parts=found)
        return (replace(r, tp=self.tp) if r.plan is not None else r), sum(self.solve_log[n0:])

    def unsearched(self) -> dict[str, StrategyResult]:
        """Why the strategies this layout does not search do not apply."""
        n = len(self.cell.gpus)
        out = {"attention_ffn": StrategyResult(name="attention_ffn", applicable=False, reason=(
                   "needs two devices" if n != 2 else "no attention kernels (e.g. a state-space model)")),
               "layer_pipeline": StrategyResult(name="layer_pipeline", applicable=False,
                                                reason="needs two or more devices"),
               "milp": StrategyResult(name="tessera", applicable=True, reason="one device: nothing to place")}
        return {k: v for k, v in out.items() if k not in self.placers}


def adopt_best(mil: StrategyResult, out: dict[str, StrategyResult]) -> StrategyResult:
    """Tessera's answer: the MILP's plan or, when a baseline beats it, that baseline's (its placement is one
    the MILP contains, or a replica split of the same GPUs); ``chosen`` says which."""
    best = mil
    for r in out.values():
        if r.feasible and r.goodput > best.goodput * (1 + 1e-9):
            best = r
    if best is mil:
        return replace(mil, chosen="milp", detail={**mil.detail, "idle": idle_reason(mil)})
    pool = best.pool.relabelled("tessera") if best.pool is not None else None
    plan = pool.lead if pool is not None else replace(best.plan, strategy="tessera") if best.plan else None
    milp_ratio = mil.plan.bound_ratio if mil.plan is not None else None
    return replace(best, name="tessera", plan=plan, pool=pool, chosen=best.name,
                   detail={**best.detail, "milp_goodput": mil.goodput, "milp_reason": mil.reason,
                           "milp_bound_ratio": milp_ratio})


def idle_reason(mil: StrategyResult) -> str | None:
    """Say why a device of the MILP plan does no work (never leave it silent)."""
    if mil.point is None or mil.plan is None:
        return None
    busy = mil.point.evaluation.device_busy_s
    idle = [i for i, b in enumerate(busy) if b == 0]
    if not idle:
        return None
    names = ", ".join(f"{mil.plan.devices[i].gpu} (device {i})" for i in idle)
    return (f"{names} unused: the MILP's best placement at batch {mil.point.batch}, m={mil.point.microbatches} "
            f"is faster without it (every placement using it is slower per iteration)")


# the names other stages import from here (the search's pieces live in config, cell and baselines)
__all__ = ["STRATEGIES", "PlannerConfig", "ServingResult", "Shapes", "StrategyResult", "cell_strategy",
           "homogeneous", "latency_variant", "model_kind", "plan_graph", "plan_serving"]


def latency_variant(res: ServingResult, name: str = "tessera", *, cost: KernelCosts | None = None,
                    source=None, placement: str = "same") -> Plan | None:
    """The latency-oriented plan of strategy ``name`` for the online switch: one micro-batch, a quarter of
    the batch: lower TPOT and TTFT, less throughput. ``placement="same"`` keeps the strategy's placement
    (no weight moves; one paged KV pool serves both); ``"milp"`` solves the placement MILP again for that
    shape with the latency objective (one micro-batch's sequential path of work and transfers), a
    different placement the simulator accepts only when both fit at once. None when the strategy has no
    single-cell plan (or the MILP finds no placement that fits)."""
    from tessera.plan.captures import capture_source
    from tessera.plan.pool import resolve_link
    from tessera.plan.solver.solve import prepare, solve_phase

    if placement not in ("same", "milp"):
        raise ValueError(f"latency_variant placement={placement!r} must be 'same' or 'milp'")
    s = res.strategies[name]
    if s.plan is None or s.point is None or s.pool is not None or len(s.plan.phases) != 1:
        return None
    cfg = res.config
    shapes = Shapes(res.model, source or capture_source(res.model), cfg, res.images)
    try:
        units = tuple(engine_gpu(resolve_gpu(d.gpu), cfg.gpu_memory_utilization) for d in s.plan.devices)
    except UserError:  # a TP group ("2xH100-SXM") is not a catalog name: no single-GPU latency variant
        return None
    lk = resolve_link(res.link)
    cost = cost or default_cost()
    b = max(1, s.point.batch // 4)
    g = shapes.graph(b, 1)
    assignment = s.point.assignment
    if placement == "milp":
        sol = solve_phase(prepare(g, Pool(gpus=units, link=lk), cost, m=1), mode=Objective.LATENCY, starts=[assignment],
                          m=1, mip_rel_gap=cfg.mip_rel_gap, time_limit_s=cfg.time_limit_s,
                          max_nodes=cfg.mip_max_nodes)
        if sol.assignment is None:
            return None
        assignment = sol.assignment
    p = score_point(g, assignment, batch=b, m=1, units=units, link=lk, cost=cost, traffic=cfg.traffic,
                    slo=cfg.slo, at=shapes.at, budgets=cfg.budgets)
    return replace(make_plan(s.plan.strategy, p, shapes, units, lk, cost, cfg), mode=Objective.LATENCY)


def plan_graph(plan: Plan, *, source=None) -> KernelGraph:
    """The iteration graph a serving-model Plan's "mixed" (or "denoise") assignment refers to, rebuilt
    from the model's capture at the plan's operating point (for the runtime to align kernels with)."""
    from tessera.plan.captures import capture_source

    w = plan.workload
    phase = Phase.MIXED if Phase.MIXED in plan.phases else Phase.DENOISE
    if phase not in plan.phases or not plan.batch:
        raise UserError(f"plan for {plan.model} ({plan.strategy}) is not a serving-model cell plan "
                        f"(phases: {', '.join(sorted(plan.phases))})")
    ref = plan.phases[phase].graph_shape.get("batch", 64)
    given = {"prompt": w.prompt, "output": w.output, "steps": w.steps, "image_tokens": w.image_tokens}
    # Traffic's own defaults where the plan names none
    cfg = PlannerConfig(traffic=Traffic(**{k: v for k, v in given.items() if v is not None}), ref_batch=ref)
    shapes = Shapes(plan.model, source or capture_source(plan.model), cfg, images=phase == Phase.DENOISE)
    g = shapes.graph(plan.batch, plan.microbatches)
    if len(g.kernels) != len(plan.phases[phase].assignment):
        raise UserError(f"plan for {plan.model} places {len(plan.phases[phase].assignment)} kernels but its "
                        f"iteration graph has {len(g.kernels)}: made by another capture of the model")
    return g
