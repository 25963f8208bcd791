"""`tessera report`: the HTML report (and terminal tables) from the JSON files the other stages write."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from tessera.contracts.plan import PoolPlan, plan_from_dict
from tessera.errors import UserError
from tessera.graph.ir import KernelGraph
from tessera.plan import launch_lines
from tessera.progress import Steps
from tessera.text import stdout_console

T = TypeVar("T")


def _load(path: Path, what: str, from_dict: Callable[[dict[str, Any]], T]) -> T:
    """Read one JSON object into a value; any shape problem is one line naming the file."""
    from tessera.report.data import read_json

    raw = read_json(path, what)
    if not isinstance(raw, dict):
        raise UserError(f"{what} file {path} holds a JSON {type(raw).__name__}, not an object")
    try:
        return from_dict(raw)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        msg = f"missing field {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot read {what} {path}: {msg}") from None


def report(
    compare: Path | None = typer.Option(None, "--compare", help="`tessera compare --json` (or plan --json) output."),
    plan: Path | None = typer.Option(None, "--plan", help="Plan file (tessera plan -o plan.json); a pool plan of "
                                     "different cells is shown by its lead cell."),
    graph: list[Path] = typer.Option([], "--graph", help="Kernel graph of a plan phase; repeat per phase."),
    sim: list[str] = typer.Option([], "--sim", help="Simulator JSON (one result, or a list of results each with "
                                  "a label, as make demo writes), as LABEL=path or path (label: file stem)."),
    sweep: list[str] = typer.Option([], "--sweep", help="Simulator JSON of each plan at several offered rates "
                                    "(as make demo writes to out/sweep.json): goodput-vs-rate curves."),
    gantt: Path | None = typer.Option(None, "--gantt", help="Pipeline Gantt PNG written by the simulator."),
    evaluation: Path | None = typer.Option(None, "--evaluation", help="`tessera evaluate --json` output; the "
                                           "placement maps STEM.best_placement.png / STEM.worst_placement.png "
                                           "beside it are shown too."),
    cost_accuracy: Path | None = typer.Option(None, "--cost-accuracy", help="The cost model's measured error "
                                              "(bench/results/cost_aic.json, or `tessera cost validate --source "
                                              "aic --json`): part of the first screen's \"how sure\"."),
    title: str = typer.Option("Tessera placement report", "--title", help="Report title."),
    out: Path = typer.Option(Path("out"), "--out-dir", help="Output folder for report.html and figures/."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print the terminal tables."),
    as_json: bool = typer.Option(False, "--json", help="Print the report's path, sections and inputs as JSON."),
) -> None:
    """Build a self-contained HTML report: compare matrix, placement map, Gantt, frontier, latency, memory."""
    # imported here so that `tessera --help` and other verbs do not pay for matplotlib
    from tessera.report.data import (
        ReportData,
        evaluation_maps,
        load_compare,
        load_cost_accuracy,
        load_evaluation,
        load_sims,
        sims_of_plan,
    )
    from tessera.report.html import build_report
    from tessera.report.tables import compare_table, plan_summary_table, sim_table

    if compare is None and plan is None and not sim and evaluation is None:
        raise UserError("nothing to report: give at least one of --compare, --plan, --sim, --evaluation")
    if gantt is not None and not gantt.is_file():
        raise UserError(f"gantt image {gantt} does not exist")
    deployment = _load(plan, "plan", plan_from_dict) if plan is not None else None
    # the plan sections draw one cell: a pool's lead (fastest) cell; the first screen the whole pool
    pool = deployment if isinstance(deployment, PoolPlan) else None
    the_plan = deployment.lead if isinstance(deployment, PoolPlan) else deployment
    graphs = tuple(_load(g, "kernel graph", KernelGraph.from_dict) for g in graph)
    # the report's own command line; the inputs' commands are stated as far as the files record them
    cmds = [f"tessera compare --json > {shlex.quote(str(compare))}"] if compare is not None else []
    if the_plan is not None:
        gpus = [d.gpu for c in (pool.cells if pool else ()) for _ in range(c.count) for d in c.plan.devices] \
            if pool is not None else [d.gpu for d in the_plan.devices]
        where = "--pool POOL.toml" if len(gpus) > 2 else f"--gpus {','.join(gpus)} --link {the_plan.link}"
        cmds.append(f"tessera plan {shlex.quote(the_plan.model)} {where} -o {shlex.quote(str(plan))}")
    for g, path in zip(graphs, graph, strict=True):
        shape = " ".join(f"--{k} {v}" for k, v in g.shape.items() if k in ("batch", "seq", "context"))
        cmds.append(f"tessera trace {shlex.quote(g.model)} --phase {g.phase} {shape} -o {shlex.quote(str(path))}")
    sim_plan = shlex.quote(str(plan)) if plan is not None else "PLAN.json"
    cmds += [f"tessera simulate {sim_plan} --workload … --json > {shlex.quote(s.rpartition('=')[2])}" for s in sim]
    args = [*(["--compare", str(compare)] if compare else []), *(["--plan", str(plan)] if plan else []),
            *(x for g in graph for x in ("--graph", str(g))), *(x for s in sim for x in ("--sim", s)),
            *(x for s in sweep for x in ("--sweep", s)), *(["--gantt", str(gantt)] if gantt else []),
            *(["--evaluation", str(evaluation)] if evaluation else []),
            *(["--cost-accuracy", str(cost_accuracy)] if cost_accuracy else []), "--out-dir", str(out)]
    cmds.append(shlex.join(["tessera", "report", *args]))
    sims = tuple(r for s in sim for r in load_sims(s))
    sweeps = tuple(r for s in sweep for r in load_sims(s))
    if deployment is not None:  # runs shown beside a plan must be of it (or of another strategy's plan)
        sims, sweeps = sims_of_plan(deployment, plan, sims), sims_of_plan(deployment, plan, sweeps)
    data = ReportData(
        title=title,
        compare=load_compare(compare) if compare is not None else None,
        plan=the_plan, pool=pool, graphs=graphs or None, sims=sims or None,
        cost_accuracy=load_cost_accuracy(cost_accuracy) if cost_accuracy is not None else None,
        sweep=sweeps or None,
        gantt_png=gantt, commands=tuple(cmds),
        deploy=tuple(launch_lines(the_plan, str(plan))) if the_plan is not None and pool is None else (),
        evaluation=load_evaluation(evaluation) if evaluation is not None else None,
        evaluation_maps=evaluation_maps(evaluation) if evaluation is not None else (),
    )
    titles: list[str] = []
    with Steps("report") as step:  # one step per report section
        def section(title: str) -> None:
            titles.append(title)
            step(title)

        path = build_report(data, out, on_section=section)
    if as_json:
        print(json.dumps({"report": str(path), "sections": titles,
                          "figures": sorted(str(f) for f in (Path(out) / "figures").glob("*")),
                          "compare_cells": len(data.compare or ()), "plan": the_plan is not None,
                          "graphs": len(graphs), "sims": [s.label for s in data.sims or ()],
                          "commands": list(cmds)}))
        return
    con = stdout_console()
    if not quiet:
        if data.compare:
            con.print(compare_table(data.compare))
        if data.plan:
            con.print(plan_summary_table(data.plan, data.graphs))
        if data.sims:
            con.print(sim_table(data.sims))
        for line in data.deploy:
            con.print(line, highlight=False, soft_wrap=True, markup=False)
    con.print(f"report: {path}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
