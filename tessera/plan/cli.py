"""CLI verbs of the plan stage: `tessera plan` and `tessera compare`; registered by tessera.cli."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.errors import UserError
from tessera.plan.planner import STRATEGIES, PlanResult, plan_model
from tessera.plan.pool import Workload

out = Console(width=None if Console().is_terminal else 140)


def result_table(r: PlanResult) -> Table:
    img = r.workload_is_images
    t = Table(title=f"{r.model} on {' + '.join(r.gpus)} ({r.link}, {r.mode}), solve {r.solve_s:.2f} s")
    for c in ("strategy", "images/s" if img else "tokens/s", "$/h", "$/1M tok" if not img else "$/1k img",
              "latency s", "memory GB per GPU", "bound", "note"):
        t.add_column(c, justify="right" if c not in ("strategy", "note") else "left", no_wrap=c == "strategy")
    for name in STRATEGIES:
        o = r.strategies[name]
        p = o.plan
        if not o.applicable or not o.feasible or p is None:
            t.add_row(name, "n/a" if not o.applicable else "infeasible", f"{p.usd_per_hour:.2f}" if p else "",
                      "", "", "", "", o.reason or "")
            continue
        thr = o.throughput
        usd = (f"{p.usd_per_million_tokens:.3f}" if not img else f"{p.usd_per_hour / 3.6 / thr:.3f}")
        mem = " / ".join(f"{sum(m.values()) / 1e9:.1f}" for m in p.memory_bytes)
        note = next((n.replace("chosen: the ", "= ").replace(" placement", "") for n in p.notes
                     if n.startswith("chosen") or n.startswith("micro")), "")
        t.add_row(name, f"{thr:,.1f}", f"{p.usd_per_hour:.2f}", usd, f"{p.latency_s:.3f}", mem,
                  f"{p.bound_ratio:.3f}" if p.bound_ratio else "", note)
    return t


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        model: str = typer.Argument(..., help="zoo model name (tessera models) or a config.json"),
        gpus: str | None = typer.Option(None, "--gpus", help="comma-separated catalog GPUs, e.g. H100,L40S"),
        pool: Path | None = typer.Option(None, "--pool", help="a many-GPU pool file (TOML, see README)"),
        objective: str = typer.Option("throughput", "--objective", help="with --pool: throughput | per_dollar"),
        link: str = typer.Option("pcie5", "--link", help="link between the GPUs (catalog name)"),
        mode: str = typer.Option("throughput", "--mode", help="throughput | latency"),
        batch: int = typer.Option(32, "--batch", help="sequences (images) in flight per GPU"),
        prompt: int = typer.Option(1024, "--prompt", help="prompt tokens"),
        output: int = typer.Option(256, "--output", help="output tokens"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON contract"),
        save: Path | None = typer.Option(None, "-o", "--out",
                                          help="write Tessera's Plan file here (with --pool: the fleet plan file)"),
    ) -> None:
        """Place every kernel of MODEL on the pool; Tessera against every baseline."""
        wl = Workload(batch=batch, prompt=prompt, output=output)
        if pool is not None:
            if gpus is not None:
                raise UserError("give either --gpus (one cell) or --pool (a many-GPU pool), not both")
            if mode != "throughput" or link != "pcie5":
                raise UserError("--pool plans in throughput mode with the link named in the pool file; "
                                "drop --mode/--link")
            from tessera.fleet.cli import plan_pool_command

            plan_pool_command(model, pool, objective, as_json, save, wl)
            return
        if gpus is None:
            raise UserError("missing --gpus A,B (one cell) or --pool pool.toml (a many-GPU pool)")
        r = plan_model(model, gpus, link=link, mode=mode,
                       workload=wl)
        if save is not None:
            if r.tessera is None:
                raise UserError(f"no feasible plan to write to {save}")
            r.tessera.save(save)
        if as_json:
            print(json.dumps(r.to_json()))
        else:
            out.print(result_table(r))

    @app.command("compare")
    def compare_cmd(
        as_json: bool = typer.Option(False, "--json", help="print the list of cells as JSON"),
        out_dir: Path = typer.Option(Path("bench/results"), "--out-dir", help="where compare.json/.md go"),
        batch: int = typer.Option(32, "--batch", help="sequences (images) in flight per GPU"),
    ) -> None:
        """Five GPU pairs x one model per family: writes compare.json and compare.md."""
        from tessera.plan.compare import run_compare

        cells, md = run_compare(out_dir=out_dir, workload=Workload(batch=batch))
        if as_json:
            print(json.dumps(cells))
        else:
            out.print(md, markup=False, highlight=False)
