"""`tessera report`: the HTML report (and terminal tables) from the JSON files the other stages write."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from tessera.progress import Steps
from tessera.report.data import ReportData
from tessera.report.tables import compare_table, plan_summary_table, sim_table
from tessera.text import stdout_console


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
    from tessera.report.html import FIGURES, build_report
    from tessera.study.report_facts import gather

    data = gather(compare=compare, plan=plan, graph=graph, sim=sim, sweep=sweep, gantt=gantt, evaluation=evaluation,
                  cost_accuracy=cost_accuracy, title=title, out=out)
    titles: list[str] = []
    with Steps("report") as step:  # one step per report section
        def section(title: str) -> None:
            titles.append(title)
            step(title)

        path = build_report(data, out, on_section=section)
    if as_json:
        print(json.dumps({"report": str(path), "sections": titles,
                          "figures": sorted(str(f) for f in (Path(out) / FIGURES).glob("*")),
                          "compare_cells": len(data.compare or ()), "plan": data.plan is not None,
                          "graphs": len(data.graphs or ()), "sims": [s.label for s in data.sims or ()],
                          "commands": list(data.commands)}))
        return
    con = stdout_console()
    if not quiet:
        show_tables(data)
    con.print(f"report: {path}", highlight=False, soft_wrap=True)


def show_tables(data: ReportData) -> None:
    """The terminal side of `tessera report`: the compare matrix, the plan's summary and the simulations
    (those given), then the deployment lines."""
    con = stdout_console()
    if data.compare:
        con.print(compare_table(data.compare))
    if data.plan:
        con.print(plan_summary_table(data.plan, data.graphs))
    if data.sims:
        con.print(sim_table(data.sims))
    for line in data.deploy:
        con.print(line, highlight=False, soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
