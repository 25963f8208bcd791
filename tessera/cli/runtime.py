"""`tessera run`: execute a plan (or a simple placement of a model) on worker processes."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tessera.runtime.placements import MILP, PLACEMENTS


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        target: str = typer.Argument(..., help="PLAN.json, or a tiny model name / config.json"),
        devices: str = typer.Option("cpu,cpu", help="one worker per entry: cpu or cuda:N"),
        placement_name: str = typer.Option("layer_split", "--placement",
                                           help=f"for MODEL: {', '.join([*PLACEMENTS, MILP])}"),
        microbatches: int = typer.Option(2, help="micro-batches in flight (throughput mode)"),
        requests: int = typer.Option(8, help="requests to serve, one micro-batch each (real runs: 8, as "
                                     "serve-run; simulate: 1000)"),
        batch: int = typer.Option(1, help="sequences per micro-batch"),
        prompt: int = typer.Option(8, help="prompt (or image) tokens per sequence"),
        output: int = typer.Option(4, help="output tokens per sequence (greedy)"),
        seq: int | None = typer.Option(None, hidden=True, help="old name of --prompt"),
        new_tokens: int | None = typer.Option(None, hidden=True, help="old name of --output"),
        verify: bool = typer.Option(False, help="fail unless outputs equal single-process execution"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result"),
        trace: Path | None = typer.Option(None, help="write a Perfetto/Chrome trace of the run here"),
        weights: Path | None = typer.Option(None, help="directory of safetensors weights to load"),
        recover: bool = typer.Option(False, help="on a lost worker, re-plan onto the survivors and finish"),
        replan: str = typer.Option("layer_split", help=f"placement after a loss: {', '.join([*PLACEMENTS, MILP])}"),
        transport: str = typer.Option("auto", help="auto (nccl for distinct GPUs, else gloo), gloo (CUDA "
                                      "workers stage through host memory), nccl"),
    ) -> None:
        """Run a plan for real on worker processes and compare with single-process execution."""
        # tessera.runtime.api imports torch (seconds): only when a run is asked for, not at `tessera --help`
        from tessera.runtime.api import RunRequest, render, run_job

        devs = tuple(d.strip() for d in devices.split(",") if d.strip())
        o = run_job(RunRequest(target=target, devices=devs, placement=placement_name,
                               microbatches=microbatches, requests=requests, batch=batch,
                               prompt=prompt if seq is None else seq,
                               output=output if new_tokens is None else new_tokens, verify=verify,
                               weights_dir=str(weights) if weights else None,
                               trace=str(trace) if trace else None, recover=recover, replan=replan,
                               transport=transport))
        if o.result is not None:
            typer.echo(render(o.result, as_json=as_json))
        if o.error is not None:
            typer.echo(f"error: {o.error}", err=True)
            sys.exit(1)
