"""`tessera run`: execute a plan (or a simple placement of a model) on worker processes."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tessera.contracts.enums import Objective
from tessera.runtime.placements import MILP, PLACEMENTS, placements, plan_placements
from tessera.text import plural


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
        from tessera.runtime.api import RunSpec, render, run
        from tessera.runtime.budget import check_job
        from tessera.runtime.cluster import WorkerFailure
        from tessera.runtime.recovery import placement_graphs
        from tessera.runtime.state import weight_files
        from tessera.runtime.steps import Job, capture_steps
        from tessera.runtime.target import run_target

        devs = tuple(d.strip() for d in devices.split(",") if d.strip())
        if weights is not None:
            weight_files(str(weights))  # a wrong path: one line now, before capture and workers
        plan = run_target(target)
        if plan is not None:
            model = plan.model
            if len(plan.devices) != len(devs):
                raise ValueError(f"plan {target} has {plural(len(plan.devices), 'device')} but --devices names {len(devs)}")
        else:
            model = target
        job = Job(model=model, batch=batch, seq=prompt if seq is None else seq,
                  new_tokens=output if new_tokens is None else new_tokens)
        check_job(job)  # before any real weights exist: a model too big for this machine is one line
        programs = capture_steps(job)
        if plan is not None:
            by_phase = plan_placements(plan, programs)
        else:
            by_phase = placements(placement_name, placement_graphs(programs), len(devs), microbatches)
        spec = RunSpec(job=job, devices=devs,
                       plans={Objective.LATENCY: by_phase, Objective.THROUGHPUT: by_phase},
                       microbatches=microbatches, requests=requests, weights_dir=str(weights) if weights else None,
                       trace=str(trace) if trace else None, recover=recover, replan=replan, transport=transport)
        try:
            out = run(spec, programs)
        except WorkerFailure as e:
            typer.echo(f"error: {e}", err=True)
            sys.exit(1)
        typer.echo(render(out, as_json=as_json))
        if verify and not out.verified:
            typer.echo("error: outputs differ from single-process execution "
                       f"(max |diff| {out.max_abs_diff:.3g})",
                       err=True)
            sys.exit(1)
