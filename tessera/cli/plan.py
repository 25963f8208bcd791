"""`tessera plan`: one cell through the plan stage (plan_serving), or with --pool a many-GPU pool through the
fleet stage; it joins the two, so it lives above both; registered by tessera.cli."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from tessera.cli.fleet import plan_pool_command
from tessera.cli.plan_flags import (
    IMAGE_S,
    OUTPUT,
    PROMPT,
    STEPS,
    TARGET,
    TPOT_MS,
    TTFT_MS,
    UTILIZATION,
    BatchCap,
    DenoiseSteps,
    ImageTokens,
    MemoryUtilization,
    Output,
    Prompt,
    SloImageS,
    SloTarget,
    SloTpotMs,
    SloTtftMs,
    TokenBudget,
    check_context,
    check_out_file,
    config_of,
)
from tessera.errors import UserError
from tessera.hardware import AUTO
from tessera.plan import plan_serving, result_json, result_table, save_deployment
from tessera.progress import Steps

out = Console(width=None if Console().is_terminal else 140)


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        model: str = typer.Argument(..., help="zoo model name (tessera models) or a config.json"),
        gpus: str | None = typer.Option(None, "--gpus", help="comma-separated catalog GPUs, e.g. H100,L40S"),
        pool: Path | None = typer.Option(None, "--pool", help="a many-GPU pool file (TOML, see README)"),
        objective: str | None = typer.Option(None, "--objective", help="with --pool: throughput (default) | "
                                             "per_dollar"),
        link: str = typer.Option(AUTO, "--link", help="link between the GPUs (catalog name); auto: the best "
                                 "the cell can have (NVLink where its GPUs share it, else PCIe of the lowest "
                                 "generation among them)"),
        batch: BatchCap = None,
        prompt: Prompt = PROMPT,
        output: Output = OUTPUT,
        steps: DenoiseSteps = STEPS,
        slo_ttft_ms: SloTtftMs = TTFT_MS,
        slo_tpot_ms: SloTpotMs = TPOT_MS,
        slo_image_s: SloImageS = IMAGE_S,
        slo_target: SloTarget = TARGET,
        budget: TokenBudget = None,
        utilization: MemoryUtilization = UTILIZATION,
        image_tokens: ImageTokens = 0,
        as_json: bool = typer.Option(False, "--json", help="print the JSON contract"),
        save: Path | None = typer.Option(None, "-o", "--out", help="write Tessera's plan file here (with --pool: "
                                         "the fleet plan, which `tessera simulate` and `report` read too)"),
        jobs: int = typer.Option(min(2, os.cpu_count() or 1), "--jobs", min=1, help="processes sharing one "
                                 "cell's search (--gpus); the answer is the same, only sooner"),
    ) -> None:
        """Place every kernel of MODEL on the pool under the serving model (continuous batching, async
        micro-batches, batch chosen by memory and SLO); Tessera against every baseline at its best."""
        cfg = config_of(batch, prompt, output, steps, slo_ttft_ms, slo_tpot_ms, slo_image_s, link, image_tokens,
                        slo_target=slo_target, budget=budget, utilization=utilization)
        check_context(model, prompt, output)
        check_out_file(save)
        if pool is not None:
            if gpus is not None:
                raise UserError("give either --gpus (one cell) or --pool (a many-GPU pool), not both")
            if link != AUTO:
                raise UserError("--pool plans with the link named in the pool file (its `link = ...` line); "
                                "drop --link")
            plan_pool_command(model, pool, objective or "throughput", as_json, save, cfg)
            return
        if gpus is None:
            raise UserError("missing --gpus A,B (one cell) or --pool pool.toml (a many-GPU pool)")
        if objective is not None:
            raise UserError("--objective chooses among a pool's cells (--pool); one cell (--gpus) is planned "
                            "for goodput at the SLO: drop --objective")
        with Steps(f"plan {model} on {gpus}") as step:
            r = plan_serving(model, gpus, cfg, progress=step, workers=jobs)
        if save is not None:
            print("\n".join(save_deployment(r, save)), file=sys.stderr)
        if as_json:
            print(result_json(r, cfg))
        else:
            out.print(result_table(r))
