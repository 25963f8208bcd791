"""CLI verbs: `tessera advise` and `tessera fleet plan`; `plan_pool_command` backs `tessera plan --pool`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.errors import UserError
from tessera.fleet.cells import cell_name
from tessera.fleet.fleet import FleetPlan, plan_fleet
from tessera.fleet.spec import FleetSpec
from tessera.plan.pool import Workload
from tessera.progress import Steps

out = Console(width=None if Console().is_terminal else 140)


def fleet_table(fp: FleetPlan) -> Table:
    t = Table(title=f"{fp.model} on {', '.join(f'{n}x{g}' for g, n in fp.pool)} ({fp.link}, objective "
                    f"{fp.objective}), planned in {fp.plan_s:.1f} s")
    for c in ("cell", "count", f"{fp.unit} each", "$/h each", f"{fp.unit} total", "$/h total"):
        t.add_column(c, justify="left" if c == "cell" else "right")
    for c in fp.cells:
        t.add_row(cell_name(c.gpus), str(c.count), f"{c.throughput_per_s:,.1f}", f"{c.usd_per_hour:.2f}",
                  f"{c.count * c.throughput_per_s:,.1f}", f"{c.count * c.usd_per_hour:.2f}")
    per_m = f", {fp.usd_per_million_tokens:.3f} $/1M tok" if fp.usd_per_million_tokens else ""
    t.caption = (f"total {fp.throughput_per_s:,.1f} {fp.unit}, {fp.usd_per_hour:.2f} $/h{per_m}; unused: "
                 f"{', '.join(f'{n}x{g}' for g, n in fp.unused.items()) or 'none'}; {fp.evaluated}/{fp.candidates} "
                 f"cells planned, gap to bound {fp.gap:.1%}")
    return t


def plan_pool_command(model: str, pool_path: Path | str, objective: str = "throughput", as_json: bool = False,
                      out_path: Path | str | None = None, workload: Workload | None = None) -> FleetPlan:
    """What `tessera plan MODEL --pool pool.toml` runs."""
    spec = FleetSpec.load(pool_path)
    with Steps(f"plan {model} on pool {pool_path}") as steps:
        fp = plan_fleet(model, spec, objective=objective, workload=workload, progress=steps)
    if out_path is not None:
        fp.save(out_path)
    if as_json:
        print(json.dumps(fp.to_dict()))
    else:
        out.print(fleet_table(fp))
        for n in fp.notes:
            out.print(f"note: {n}", highlight=False)
    return fp


def register(app: typer.Typer) -> None:
    fleet_app = typer.Typer(no_args_is_help=True, help="Plan a fleet of cells over a many-GPU pool.")
    app.add_typer(fleet_app, name="fleet")

    @fleet_app.command("plan")
    def fleet_plan_cmd(
        model: str = typer.Argument(..., help="zoo model name"),
        pool: Path = typer.Option(..., "--pool", help="pool file (TOML: link, [[gpu]] type + count)"),
        objective: str = typer.Option("throughput", "--objective", help="throughput | per_dollar"),
        batch: int = typer.Option(32, "--batch", help="sequences in flight per GPU"),
        prompt: int = typer.Option(1024, "--prompt", help="prompt tokens"),
        output: int = typer.Option(256, "--output", help="output tokens"),
        as_json: bool = typer.Option(False, "--json", help="print the fleet plan as JSON"),
        save: Path | None = typer.Option(None, "-o", "--out", help="write the fleet plan here"),
    ) -> None:
        """Form cells from the pool, replicate them, maximise throughput or throughput per dollar."""
        plan_pool_command(model, pool, objective, as_json, save, Workload(batch=batch, prompt=prompt, output=output))

    @app.command("advise")
    def advise_cmd(
        model: str = typer.Argument(..., help="zoo model name"),
        budget: float = typer.Option(..., "--budget-usd-per-hour", help="what you spend per hour"),
        batch: int = typer.Option(32, "--batch", help="sequences in flight per GPU"),
        prompt: int = typer.Option(1024, "--prompt", help="prompt tokens"),
        output: int = typer.Option(256, "--output", help="output tokens"),
        slo_ttft_ms: float | None = typer.Option(None, "--slo-ttft-ms", help="time-to-first-token SLO"),
        slo_tpot_ms: float | None = typer.Option(None, "--slo-tpot-ms", help="time-per-output-token SLO"),
        gpus: str | None = typer.Option(None, "--gpus", help="catalog types to consider (default: all priced)"),
        as_json: bool = typer.Option(False, "--json", help="print the advice as JSON"),
    ) -> None:
        """Which GPU mix to rent for a budget, against the best homogeneous and prefill/decode mixes."""
        from tessera.fleet.advise import advise
        from tessera.sim import SLO

        slo = None
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            slo = SLO(ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                      tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)
        types = [g for g in gpus.split(",") if g.strip()] if gpus else None
        with Steps(f"advise {model}") as steps:
            a = advise(model, Workload(batch=batch, prompt=prompt, output=output), budget, slo, types,
                       progress=steps)
        if as_json:
            print(json.dumps(a.to_dict()))
            return
        t = Table(title=f"{model}, budget {budget:.2f} $/h (advised in {a.advise_s:.1f} s)")
        for c in ("choice", "cells", "tokens/s", "$/h", "tokens/s per $/h", "gap"):
            t.add_column(c, justify="left" if c in ("choice", "cells") else "right")
        for c in (a.mix, a.homogeneous, a.prefill_decode):
            if c is not None:
                t.add_row(c.group, c.label, f"{c.throughput_per_s:,.0f}", f"{c.usd_per_hour:.2f}",
                          f"{c.per_dollar:,.1f}", f"{c.gap:.1%}")
        out.print(t)
        out.print(a.verdict, highlight=False)
        if a.sim:
            s = a.sim
            out.print(f"simulated: {s['throughput_tokens_per_s']:,.0f} tokens/s, TTFT p50/p99 "
                      f"{s['ttft_s']['p50']:.3f}/{s['ttft_s']['p99']:.3f} s, TPOT p50/p99 {s['tpot_s']['p50'] * 1e3:.1f}/"
                      f"{s['tpot_s']['p99'] * 1e3:.1f} ms, lost {s['lost']}"
                      + (f", SLO attainment {s['slo_attainment']:.1%}" if s["slo_attainment"] is not None else ""),
                      highlight=False)
        out.print(f"types kept: {', '.join(a.kept_types)}; pruned: "
                  f"{'; '.join(f'{t} ({why})' for t, why in a.pruned)}", highlight=False)


__all__ = ["UserError", "fleet_table", "plan_pool_command", "register"]
