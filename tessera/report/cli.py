"""`tessera report`: the HTML report (and terminal tables) from the JSON files the other stages write."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from tessera.errors import UserError
from tessera.graph.ir import KernelGraph
from tessera.plan.types import Plan
from tessera.report.data import ReportData, load_compare, load_sim, read_json
from tessera.report.html import build_report
from tessera.report.tables import compare_table, plan_summary_table, sim_table

T = TypeVar("T")


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


def report(
    compare: Path | None = typer.Option(None, "--compare", help="`tessera compare --json` (or plan --json) output."),
    plan: Path | None = typer.Option(None, "--plan", help="Plan file (tessera plan -o plan.json)."),
    graph: list[Path] = typer.Option([], "--graph", help="Kernel graph of a plan phase; repeat per phase."),
    sim: list[str] = typer.Option([], "--sim", help="Simulator JSON, as LABEL=path or path (label: file stem)."),
    gantt: Path | None = typer.Option(None, "--gantt", help="Pipeline Gantt PNG written by the simulator."),
    title: str = typer.Option("Tessera placement report", "--title", help="Report title."),
    out: Path = typer.Option(Path("out"), "-o", "--out", help="Output folder for report.html and figures/."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print the terminal tables."),
) -> None:
    """Build a self-contained HTML report: compare matrix, placement map, Gantt, frontier, latency, memory."""
    if compare is None and plan is None and not sim:
        raise UserError("nothing to report: give at least one of --compare, --plan, --sim")
    if gantt is not None and not gantt.is_file():
        raise UserError(f"gantt image {gantt} does not exist")
    data = ReportData(
        title=title,
        compare=load_compare(compare) if compare is not None else None,
        plan=_load(plan, "plan", Plan.from_dict) if plan is not None else None,
        graphs=tuple(_load(g, "kernel graph", KernelGraph.from_dict) for g in graph) or None,
        sims=tuple(load_sim(s) for s in sim) or None,
        gantt_png=gantt,
    )
    path = build_report(data, out)
    con = Console()
    if not quiet:
        if data.compare:
            con.print(compare_table(data.compare))
        if data.plan:
            con.print(plan_summary_table(data.plan, data.graphs))
        if data.sims:
            con.print(sim_table(data.sims))
    con.print(f"report: {path}")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
