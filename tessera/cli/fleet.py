"""CLI verbs: `tessera advise` and `tessera fleet plan`; `plan_pool_command` backs `tessera plan --pool`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.plan_flags import (
    IMAGE_S,
    OUTPUT,
    PROMPT,
    STEPS,
    TPOT_MS,
    TTFT_MS,
    BatchCap,
    DenoiseSteps,
    Output,
    Prompt,
    SloImageS,
    SloTpotMs,
    SloTtftMs,
    check_context,
    check_out_file,
    config_of,
)
from tessera.fleet.advise import Advice, MixChoice, advise, parse_have
from tessera.fleet.cells import cell_name
from tessera.fleet.fleet import FleetPlan, plan_pool_file
from tessera.hardware import AUTO
from tessera.plan import PlannerConfig
from tessera.progress import Steps

out = Console(width=None if Console().is_terminal else 140)


def fleet_table(fp: FleetPlan) -> Table:
    slo = fp.config.slo
    t = Table(title=f"{fp.model} on {', '.join(f'{n}x{g}' for g, n in fp.available)} ({fp.link}, objective "
                    f"{fp.objective}, SLO TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1e3:g} ms), planned in "
                    f"{fp.plan_s:.1f} s")
    for c in ("cell", "chosen", "count", f"{fp.unit} each", "$/h each", f"{fp.unit} total", "$/h total"):
        t.add_column(c, justify="left" if c in ("cell", "chosen") else "right")
    for c in fp.cells:
        t.add_row(cell_name(c.gpus), c.chosen or "", str(c.count), f"{c.goodput_per_s:,.1f}", f"{c.usd_per_hour:.2f}",
                  f"{c.count * c.goodput_per_s:,.1f}", f"{c.count * c.usd_per_hour:.2f}")
    per_m = f", {fp.usd_per_million_tokens:.3f} $/1M tok" if fp.usd_per_million_tokens else ""
    t.caption = (f"goodput at the SLO {fp.goodput_per_s:,.1f} {fp.unit}, {fp.usd_per_hour:.2f} $/h{per_m}; unused: "
                 f"{', '.join(f'{n}x{g}' for g, n in fp.unused.items()) or 'none'}; {fp.evaluated}/{fp.candidates} "
                 f"cells planned, gap to bound {fp.gap:.1%}")
    return t


def plan_pool_command(model: str, pool_path: Path | str, objective: str = "throughput", as_json: bool = False,
                      out_path: Path | str | None = None, cfg: PlannerConfig | None = None) -> FleetPlan:
    """What `tessera plan MODEL --pool pool.toml` and `tessera fleet plan` run."""
    with Steps(f"plan {model} on pool {pool_path}") as steps:
        fp = plan_pool_file(model, pool_path, cfg, objective=objective, progress=steps)
    if out_path is not None:
        fp.save(out_path)
        print(f"wrote {out_path} (the fleet's pool plan of {model}; `tessera simulate` and `tessera report "
              "--plan` read it)", file=sys.stderr)
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
        batch: BatchCap = None,
        prompt: Prompt = PROMPT,
        output: Output = OUTPUT,
        steps: DenoiseSteps = STEPS,
        slo_ttft_ms: SloTtftMs = TTFT_MS,
        slo_tpot_ms: SloTpotMs = TPOT_MS,
        slo_image_s: SloImageS = IMAGE_S,
        as_json: bool = typer.Option(False, "--json", help="print the fleet plan as JSON"),
        save: Path | None = typer.Option(None, "-o", "--out", help="write the fleet plan here"),
    ) -> None:
        """Form cells from the pool, replicate them, maximise goodput at the SLO or goodput per dollar."""
        cfg = config_of(batch, prompt, output, steps, slo_ttft_ms, slo_tpot_ms, slo_image_s)
        check_context(model, prompt, output)
        check_out_file(save)
        plan_pool_command(model, pool, objective, as_json, save, cfg)

    @app.command("advise")
    def advise_cmd(
        model: str = typer.Argument(..., help="zoo model name (tessera models) or a config.json"),
        budget: float = typer.Option(..., "--budget-usd-per-hour", help="what you spend per hour (with --have: "
                                     "on GPUs added to those; 0 asks what they serve alone)"),
        have: str | None = typer.Option(None, "--have", help="GPUs you already have, TYPE:COUNT,... e.g. "
                                        "H100:4,L40S:2: which to add for the budget"),
        batch: BatchCap = None,
        prompt: Prompt = PROMPT,
        output: Output = OUTPUT,
        steps: DenoiseSteps = STEPS,
        slo_ttft_ms: SloTtftMs = TTFT_MS,
        slo_tpot_ms: SloTpotMs = TPOT_MS,
        slo_image_s: SloImageS = IMAGE_S,
        gpus: str | None = typer.Option(None, "--gpus", help="catalog types to consider (default: all priced)"),
        link: str = typer.Option(AUTO, "--link", help="link between the two GPUs of a pair cell (catalog name); "
                                 "auto: the best each pair can have"),
        as_json: bool = typer.Option(False, "--json", help="print the advice as JSON"),
        save: Path | None = typer.Option(None, "-o", "--out", help="write the advised mix here as a pool plan "
                                         "(with the advice beside it): `tessera simulate` and `report` read it"),
    ) -> None:
        """Which GPU mix to rent for a budget, or which GPUs to add to those you have (--have), against the
        best homogeneous and prefill/decode mixes."""
        cfg = config_of(batch, prompt, output, steps, slo_ttft_ms, slo_tpot_ms, slo_image_s, link)
        check_context(model, prompt, output)
        check_out_file(save)
        types = [g for g in gpus.split(",") if g.strip()] if gpus else None
        with Steps(f"advise {model}") as progress:
            a = advise(model, cfg, budget, types, progress=progress, have=parse_have(have))
        if save is not None:
            a.save(save)
            print(f"wrote {save} (the advised mix's pool plan of {model}; `tessera simulate` and `tessera "
                  "report --plan` read it)", file=sys.stderr)
        if as_json:
            print(json.dumps(a.to_dict()))
            return
        print_advice(a, slo_ttft_ms, slo_tpot_ms)


def _choice_row(t: Table, c: MixChoice, owned: bool) -> None:
    cells = [c.group, c.label] + ([c.rent_label] if owned else [])
    t.add_row(*cells, f"{c.throughput_per_s:,.0f}", f"{c.usd_per_hour:.2f}",
              f"{c.per_dollar:,.1f}" if c.usd_per_hour > 0 else "-", f"{c.gap:.1%}")


def print_advice(a: Advice, slo_ttft_ms: float, slo_tpot_ms: float) -> None:
    have = f", having {', '.join(f'{n}x{g}' for g, n in a.have)}" if a.have else ""
    t = Table(title=f"{a.model}, budget {a.budget_usd_per_hour:.2f} $/h{have}, SLO TTFT ≤ {slo_ttft_ms:g} ms, "
                    f"TPOT ≤ {slo_tpot_ms:g} ms (advised in {a.advise_s:.1f} s)")
    cols = ("choice", "cells", *(("rent (added)",) if a.have else ()), "goodput/s",
            "$/h (rented)" if a.have else "$/h", "goodput/s per $/h", "gap")
    for c in cols:
        t.add_column(c, justify="left" if c in ("choice", "cells", "rent (added)") else "right")
    for c in (a.owned, a.mix, a.homogeneous, a.prefill_decode):
        if c is not None:
            _choice_row(t, c, bool(a.have))
    out.print(t)
    out.print(a.verdict, highlight=False)
    if a.sim:
        s = a.sim.result
        out.print(f"simulated at 90% of the predicted goodput: {s.throughput_tokens_per_s:,.0f} tokens/s, "
                  f"TTFT p50/p99 {s.ttft_s['p50']:.3f}/{s.ttft_s['p99']:.3f} s, TPOT p50/p99 "
                  f"{s.tpot_s['p50'] * 1e3:.1f}/{s.tpot_s['p99'] * 1e3:.1f} ms, lost {s.lost}"
                  + (f", SLO attainment {s.slo_attainment:.1%}" if s.slo_attainment is not None else ""),
                  highlight=False)
    out.print(f"types kept: {', '.join(a.kept_types)}; pruned: "
              f"{'; '.join(f'{t} ({why})' for t, why in a.pruned) or 'none'}", highlight=False)


__all__ = ["config_of", "fleet_table", "plan_pool_command", "print_advice", "register"]
