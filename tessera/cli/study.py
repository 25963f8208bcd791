"""CLI verbs of the study: `tessera compare` (the compare matrix) and `tessera evaluate` (the evaluation
study); each plans, simulates and writes JSON and markdown that `tessera report` renders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from tessera.cli.plan_flags import (
    IMAGE_S,
    OUTPUT,
    PROMPT,
    STEPS,
    TPOT_MS,
    TTFT_MS,
    DenoiseSteps,
    Output,
    Prompt,
    SloImageS,
    SloTpotMs,
    SloTtftMs,
    config_of,
)
from tessera.hardware import AUTO
from tessera.study.compare import check_matrix_context, run_compare
from tessera.study.evaluate import Shard, evaluate_study
from tessera.text import stdout_console


def evaluate(
    quick: bool = typer.Option(False, "--quick", help="a subset of 8 cells (a few minutes): eval.quick.*"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    out_dir: Path = typer.Option(Path("bench/results"), "--out-dir", help="where eval[.quick].json/.md go"),
    fresh: bool = typer.Option(False, "--fresh", help="forget cells of an earlier run instead of resuming"),
    limit: int | None = typer.Option(None, "--limit", min=0, help="run at most this many new cells (0: only rebuild the summary from the cells there)"),
    no_sim: bool = typer.Option(False, "--no-sim", help="skip the planner–simulator check at 95% load"),
    shard: str = typer.Option("1/1", "--shard", metavar="K/N",
                              help="run every N-th cell still to run, from the K-th: N processes side by side"),
) -> None:
    """Model families × workload shapes × pools of 2-16 GPUs: Tessera vs every baseline (resumable)."""
    study = evaluate_study(out_dir=out_dir, quick=quick, fresh=fresh, simulate_plans=not no_sim, limit=limit,
                           shard=Shard.parse(shard))
    if as_json:
        print(json.dumps(study.summary.to_dict()))
    else:
        stdout_console().print(study.markdown, markup=False, highlight=False)


def compare(
    quick: bool = typer.Option(False, "--quick", help="one model per family on three pairs (a few minutes)"),
    as_json: bool = typer.Option(False, "--json", help="print the cells as JSON"),
    out_dir: Path = typer.Option(Path("bench/results"), "--out-dir", help="where compare.json/.md go"),
    prompt: Prompt = PROMPT,
    output: Output = OUTPUT,
    steps: DenoiseSteps = STEPS,
    slo_ttft_ms: SloTtftMs = TTFT_MS,
    slo_tpot_ms: SloTpotMs = TPOT_MS,
    slo_image_s: SloImageS = IMAGE_S,
    link: str = typer.Option(AUTO, "--link", help="link between the GPUs of each pair (catalog name); auto: "
                                                 "the best each pair can have"),
    knee: bool = typer.Option(True, "--knee/--no-knee", help="check every strategy's goodput against the "
                                                           "simulator's SLO knee (a few seconds each)"),
    jobs: int = typer.Option(os.cpu_count() or 1, "--jobs", min=1, help="processes planning models side by "
                                                                    "side (default: one per CPU core)"),
) -> None:
    """Tessera vs every baseline at equal SLO, one model per family on GPU pairs: compare.json and compare.md
    (compare.quick.* with --quick)."""
    cfg = config_of(None, prompt, output, steps, slo_ttft_ms, slo_tpot_ms, slo_image_s, link)
    check_matrix_context(prompt, output)
    cells, md = run_compare(out_dir=out_dir, cfg=cfg, quick=quick, knee=knee, jobs=jobs)
    if as_json:
        print(json.dumps({"cells": [c.to_dict() for c in cells]}))
    else:
        stdout_console().print(md, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
    app.command("evaluate")(evaluate)
