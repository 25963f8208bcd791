"""What `tessera report` renders, gathered: the files it is given read into one ``ReportData`` (``gather``),
with what only the stages know looked up before it is rendered (``with_facts``): each GPU's catalog entry
and where its kernel costs come from, the planner's goodput and capacity of the deployment and of each
baseline, the commands that serve the plan, and the Gantt of its iterations. `tessera report` and `make demo`
call these before ``tessera.report.html.build_report``, so that tessera.report renders and imports none of
the stages."""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from tessera.contracts.ir import KernelGraph
from tessera.contracts.plan import Plan, PoolPlan, plan_from_dict
from tessera.cost.aic import AicCosts
from tessera.errors import UserError
from tessera.hardware import catalog
from tessera.plan import launch_lines
from tessera.report.data import (
    GanttFacts,
    GpuFacts,
    ReportData,
    evaluation_maps,
    load_compare,
    load_cost_accuracy,
    load_evaluation,
    load_sims,
    read_json,
    sims_of_plan,
)
from tessera.report.html import FIGURES, GANTT_PNG
from tessera.sim.gantt import plot_plan
from tessera.sim.traffic import plan_capacity_per_s, plan_goodput_per_s

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")  # the datasheet rates the report lists, in this order
NOT_IN_CATALOG = "not in the catalog"
T = TypeVar("T")


def gather(*, compare: Path | None, plan: Path | None, graph: list[Path], sim: list[str], sweep: list[str],
           gantt: Path | None, evaluation: Path | None, cost_accuracy: Path | None, title: str,
           out: Path) -> ReportData:
    """Every file `tessera report` is given, read and checked into one ReportData with its facts; a pool plan
    of different cells is drawn by its lead cell, and simulations shown beside a plan must be of it."""
    if compare is None and plan is None and not sim and evaluation is None:
        raise UserError("nothing to report: give at least one of --compare, --plan, --sim, --evaluation")
    if gantt is not None and not gantt.is_file():
        raise UserError(f"gantt image {gantt} does not exist")
    deployment = _load(plan, "plan", plan_from_dict) if plan is not None else None
    # the plan sections draw one cell: a pool's lead (fastest) cell; the first screen the whole pool
    pool = deployment if isinstance(deployment, PoolPlan) else None
    the_plan = deployment.lead if isinstance(deployment, PoolPlan) else deployment
    graphs = tuple(_load(g, "kernel graph", KernelGraph.from_dict) for g in graph)
    sims = tuple(r for s in sim for r in load_sims(s))
    sweeps = tuple(r for s in sweep for r in load_sims(s))
    if deployment is not None:  # runs shown beside a plan must be of it (or of another strategy's plan)
        assert plan is not None
        sims, sweeps = sims_of_plan(deployment, plan, sims), sims_of_plan(deployment, plan, sweeps)
    args = [*(["--compare", str(compare)] if compare else []), *(["--plan", str(plan)] if plan else []),
            *(x for g in graph for x in ("--graph", str(g))), *(x for s in sim for x in ("--sim", s)),
            *(x for s in sweep for x in ("--sweep", s)), *(["--gantt", str(gantt)] if gantt else []),
            *(["--evaluation", str(evaluation)] if evaluation else []),
            *(["--cost-accuracy", str(cost_accuracy)] if cost_accuracy else []), "--out-dir", str(out)]
    data = ReportData(
        title=title,
        compare=load_compare(compare) if compare is not None else None,
        plan=the_plan, pool=pool, graphs=graphs or None, sims=sims or None,
        cost_accuracy=load_cost_accuracy(cost_accuracy) if cost_accuracy is not None else None,
        sweep=sweeps or None,
        gantt_png=gantt,
        commands=(*input_commands(compare, deployment, plan, graphs, graph, sim), shlex.join(["tessera", "report", *args])),
        deploy=tuple(launch_lines(the_plan, str(plan))) if the_plan is not None and pool is None else (),
        evaluation=load_evaluation(evaluation) if evaluation is not None else None,
        evaluation_maps=evaluation_maps(evaluation) if evaluation is not None else (),
    )
    return with_facts(data, out)


def input_commands(compare: Path | None, deployment: Plan | PoolPlan | None, plan: Path | None,
                   graphs: tuple[KernelGraph, ...], graph: list[Path], sim: list[str]) -> list[str]:
    """The commands that made the report's inputs, as far as the files record them."""
    cmds = [f"tessera compare --json > {shlex.quote(str(compare))}"] if compare is not None else []
    if deployment is not None:
        pool = deployment if isinstance(deployment, PoolPlan) else None
        the_plan = deployment.lead if isinstance(deployment, PoolPlan) else deployment
        gpus = [d.gpu for c in (pool.cells if pool else ()) for _ in range(c.count) for d in c.plan.devices] \
            if pool is not None else [d.gpu for d in the_plan.devices]
        where = "--pool POOL.toml" if len(gpus) > 2 else f"--gpus {','.join(gpus)} --link {the_plan.link}"
        cmds.append(f"tessera plan {shlex.quote(the_plan.model)} {where} -o {shlex.quote(str(plan))}")
    for g, path in zip(graphs, graph, strict=True):
        shape = " ".join(f"--{k} {v}" for k, v in g.shape.items() if k in ("batch", "seq", "context"))
        cmds.append(f"tessera trace {shlex.quote(g.model)} --phase {g.phase} {shape} -o {shlex.quote(str(path))}")
    sim_plan = shlex.quote(str(plan)) if plan is not None else "PLAN.json"
    cmds += [f"tessera simulate {sim_plan} --workload … --json > {shlex.quote(s.rpartition('=')[2])}" for s in sim]
    return cmds


def _load(path: Path, what: str, from_dict: Callable[[dict[str, Any]], T]) -> T:
    """Read one JSON object into a value; any shape problem is one line naming the file."""
    raw = read_json(path, what)
    if not isinstance(raw, dict):
        raise UserError(f"{what} file {path} holds a JSON {type(raw).__name__}, not an object")
    try:
        return from_dict(raw)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        msg = f"missing field {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot read {what} {path}: {msg}") from None


def with_facts(data: ReportData, out_dir: Path | None = None) -> ReportData:
    """``data`` with its stage facts filled in; ``out_dir`` is where ``build_report`` will write (the Gantt's
    layout is drawn to its figure there first; None: no Gantt)."""
    d = data.deployment
    return replace(
        data, gpu_facts=tuple(gpu_facts(name) for name in sorted(gpus_named(data))),
        goodput_per_s=plan_goodput_per_s(d) if d is not None else None,
        capacity_per_s=plan_capacity_per_s(d) if d is not None else None,
        baseline_goodputs=tuple((p.strategy, g) for p in data.baseline_plans if (g := plan_goodput_per_s(p))),
        deploy=data.deploy or (tuple(launch_lines(data.plan, "PLAN.json"))
                               if data.plan is not None and data.pool is None else ()),
        gantt=gantt_facts(data.plan, out_dir) if data.plan is not None and data.gantt_png is None
        and out_dir is not None else None)


def gpus_named(data: ReportData) -> set[str]:
    """Every GPU the report names: the compare matrix's pools and references, the deployment's devices, the
    baselines' and the options'."""
    plans = [c.plan for p in (data.pool, *data.baseline_plans) if isinstance(p, PoolPlan) for c in p.cells]
    plans += [p for p in (data.plan, *data.baseline_plans) if isinstance(p, Plan)]
    return ({g for c in data.compare or () for g in c.gpus}
            | {g for c in data.compare or () if c.reference for g in c.reference.gpus}
            | {dev.gpu for p in plans for dev in p.devices} | {g for o in data.options for g in o.gpus})


def gpu_facts(name: str) -> GpuFacts:
    """The catalog's entry for ``name`` (a GPU not in it: only where its costs come from, "not in the catalog")."""
    try:
        s = catalog.gpu(name)
    except ValueError:
        return GpuFacts(name=name, cost_source=NOT_IN_CATALOG)
    return GpuFacts(name=name, vendor=s.vendor, usd_per_hour=s.usd_per_hour, price_date=s.price_date,
                    price_source=s.price_source, dtypes=tuple(k for k in DTYPES if k in s.peak_flops_per_s),
                    spec_source=s.source, cost_source=cost_source(name))


@functools.cache
def cost_source(gpu_name: str) -> str:
    """Where a GPU's kernel costs come from: its own measured tables, or a transfer from measured GPUs
    (cached: reading the measured tables takes seconds)."""
    try:
        return _aic_costs().source(catalog.gpu(gpu_name)) or "measured on this machine"
    except (ValueError, UserError):
        return NOT_IN_CATALOG


@functools.cache
def _aic_costs() -> AicCosts:
    return AicCosts()


def gantt_facts(plan: Plan, out_dir: Path) -> GanttFacts:
    """Three pipelined iterations of the plan's decode phase ("mixed" for serving-model plans; the first phase
    when it has neither: denoise, encode), laid out by the simulator (the report draws them with a legend)."""
    phase = "decode" if "decode" in plan.phases else "mixed" if "mixed" in plan.phases else next(iter(plan.phases))
    path = Path(out_dir) / FIGURES / GANTT_PNG
    path.parent.mkdir(parents=True, exist_ok=True)
    spans = plot_plan(plan, path, phase=phase)
    return GanttFacts(spans=tuple(spans), title=f"{plan.model}, {plan.strategy} plan, phase {phase}: 3 iterations, "
                                                f"{plan.phases[phase].microbatches} micro-batches in flight")
