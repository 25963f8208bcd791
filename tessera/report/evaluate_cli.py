"""`tessera evaluate`: the evaluation study from one command (registered beside `compare`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def evaluate(
    quick: bool = typer.Option(False, "--quick", help="a subset of 8 cells (a few minutes): eval.quick.*"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    out_dir: Path = typer.Option(Path("bench/results"), "--out-dir", help="where eval[.quick].json/.md go"),
    fresh: bool = typer.Option(False, "--fresh", help="forget cells of an earlier run instead of resuming"),
    limit: int | None = typer.Option(None, "--limit", min=0, help="run at most this many new cells (0: only rebuild the summary from the cells there)"),
    no_sim: bool = typer.Option(False, "--no-sim", help="skip the planner–simulator check at 95% load"),
) -> None:
    """Model families × workload shapes × pools of 2-16 GPUs: Tessera vs every baseline (resumable)."""
    from tessera.report.evaluate import placement_maps, run_evaluate
    from tessera.text import stdout_console

    data = run_evaluate(out_dir=out_dir, quick=quick, fresh=fresh, simulate_plans=not no_sim, limit=limit)
    placement_maps(data, out_dir, "eval.quick" if quick else "eval")
    if as_json:
        print(json.dumps(data["summary"]))
    else:
        stem = "eval.quick" if quick else "eval"
        stdout_console().print((out_dir / f"{stem}.md").read_text(), markup=False, highlight=False)
