"""`tessera run`: execute a plan (or a simple placement of a model) on worker processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from tessera.runtime.placements import MILP, PLACEMENTS, carry_over, placements
from tessera.text import plural


def register(app: typer.Typer) -> None:
    register_serve(app)
    @app.command("run")
    def run_cmd(
        target: str = typer.Argument(..., help="PLAN.json, or a tiny model name / config.json"),
        devices: str = typer.Option("cpu,cpu", help="one worker per entry: cpu or cuda:N"),
        placement_name: str = typer.Option("layer_split", "--placement",
                                           help=f"for MODEL: {', '.join([*PLACEMENTS, MILP])}"),
        microbatches: int = typer.Option(2, help="micro-batches in flight (throughput mode)"),
        requests: int = typer.Option(2, help="requests to serve (one micro-batch each)"),
        batch: int = typer.Option(1, help="sequences per micro-batch"),
        seq: int = typer.Option(8, help="prompt (or image) tokens"),
        new_tokens: int = typer.Option(4, help="greedy tokens per sequence"),
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
        from tessera.runtime.steps import Job, capture_steps

        devs = tuple(d.strip() for d in devices.split(",") if d.strip())
        if target.endswith(".json") and Path(target).exists() and any(
                k in json.loads(Path(target).read_text()) for k in ("phases", "cells")):
            from tessera.plan.types import PoolPlan, read_plan_file

            plan = read_plan_file(target)
            if isinstance(plan, PoolPlan):
                raise ValueError(f"plan {target} is a pool of {plural(len(plan.cells), 'different cell')} "
                                 f"({plan.strategy}); each runs alone: plan one cell and run that")
            model = plan.model
            by_phase = {ph: tuple(p.assignment) for ph, p in plan.phases.items()}
            if len(plan.devices) != len(devs):
                raise ValueError(f"plan {target} has {plural(len(plan.devices), 'device')} but --devices names {len(devs)}")
        else:
            model, by_phase = target, {}
        job = Job(model=model, batch=batch, seq=seq, new_tokens=new_tokens)
        check_job(job)  # before any real weights exist: a model too big for this machine is one line
        programs = capture_steps(job)
        if by_phase:  # a Plan file: its graphs were captured by the planner (bf16, fake, fused view): align
            # its kernels with the program's fused view kernel by kernel, then run each on its fused kernel's device
            from tessera.capture import capture_model
            from tessera.capture.fuse import unfuse

            mixed = None
            if "mixed" in plan.phases:  # the serving model's iteration: its kernels align with both steps
                from tessera.plan.serve import plan_graph

                mixed = (plan_graph(plan), plan.phases["mixed"].assignment)
            for key, prog in programs.items():
                ph = key.split("@")[0]
                if mixed is not None:
                    g = prog.placement_graph
                    by_phase[ph] = unfuse(g, carry_over(mixed[0], tuple(mixed[1]), g))
                    continue
                pp = plan.phases.get(ph)
                if pp is not None and len(by_phase[ph]) != len(prog.ops):
                    shape = {k: v for k, v in pp.graph_shape.items() if k in ("batch", "seq", "context") and v}
                    g = prog.placement_graph
                    by_phase[ph] = unfuse(g, carry_over(capture_model(model, ph, **shape), tuple(pp.assignment), g))
        else:
            by_phase = placements(placement_name, placement_graphs(programs), len(devs), microbatches)
        spec = RunSpec(job=job, devices=devs, plans={"latency": by_phase, "throughput": by_phase},
                       microbatches=microbatches, requests=requests, weights_dir=str(weights) if weights else None,
                       trace=str(trace) if trace else None, recover=recover, replan=replan, transport=transport)
        try:
            out = run(spec, programs)
        except WorkerFailure as e:
            typer.echo(f"error: {e}", err=True)
            sys.exit(1)
        typer.echo(render(out, as_json=as_json))
        if verify and not out["verified"]:
            typer.echo(f"error: outputs differ from single-process execution (max |diff| {out['max_abs_diff']:.3g})",
                       err=True)
            sys.exit(1)


def register_serve(app: typer.Typer) -> None:
    @app.command("serve-run")
    def serve_run_cmd(
        target: str = typer.Argument(..., help="PLAN.json, or a tiny model name (llm, moe, ssm)"),
        devices: str = typer.Option("cpu,cpu", help="one CPU worker per entry"),
        placement_name: str = typer.Option("layer_split", "--placement",
                                           help=f"for MODEL: {', '.join([*PLACEMENTS, MILP])}"),
        workload: str = typer.Option("poisson", help="offline | poisson | bursty (tessera.sim's workloads)"),
        rate: float = typer.Option(20.0, help="mean arrivals per second (poisson, bursty)"),
        requests: int = typer.Option(8, help="requests in the stream"),
        prompt: str = typer.Option("4-8", help="prompt tokens: N, LO-HI or a length trace name"),
        output: str = typer.Option("2-6", help="generated tokens: N, LO-HI or a length trace name"),
        slots: int = typer.Option(8, help="KV/state slots on the workers (requests running at once)"),
        microbatches: int = typer.Option(2, help="groups of slots advancing independently (async)"),
        schedule: str = typer.Option("async", help="async | sync (every running request in lock-step)"),
        compare_sync: bool = typer.Option(False, help="also serve the same stream under --schedule sync"),
        prefills: int = typer.Option(0, help="prompts a group prefills at once (one chunk each per iteration); "
                                     "0 = no limit, every free slot admits the next arrival"),
        chunk: int = typer.Option(0, help="prompt tokens prefilled per iteration (a longer prompt is prefilled "
                                  "over several iterations); 0 = whole prompts"),
        seed: int = typer.Option(0, help="workload and prompt seed"),
        verify: bool = typer.Option(False, help="exit 1 unless every request equals its single-process run"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON result"),
        recover: bool = typer.Option(False, help="on a lost worker, re-plan onto the survivors and resume"),
        replan: str = typer.Option("layer_split", help=f"placement after a loss: {', '.join([*PLACEMENTS, MILP])}"),
        kill_at: int | None = typer.Option(None, help="fault injection: SIGKILL a worker when request N is admitted"),
        kill_rank: int = typer.Option(1, help="the worker --kill-at kills"),
        trace: Path | None = typer.Option(None, help="write a Chrome trace of the run here (the simulator's "
                                          "beside it, *.sim.json)"),
        repeats: int = typer.Option(1, help="serve the stream this many times per schedule (ABBA order); "
                                    "figures from the median run"),
    ) -> None:
        """Serve a request stream on worker processes: continuous batching, async micro-batches, verified."""
        from tessera.errors import UserError
        from tessera.runtime.cluster import WorkerFailure
        from tessera.runtime.serve_api import ServeRunSpec, serve_run
        from tessera.runtime.serving import Fault, ServeConfig
        from tessera.sim.workload import LengthSpec, WorkloadSpec

        devs = tuple(d.strip() for d in devices.split(",") if d.strip())
        plan = None
        if target.endswith(".json") and Path(target).exists():
            from tessera.plan.types import Plan

            plan = Plan.load(target)
            model = plan.model
        else:
            model = target
        wl = WorkloadSpec(kind=workload, requests=requests, rate_per_s=rate, prompt=LengthSpec.parse(prompt),
                          output=LengthSpec.parse(output))
        cfg = ServeConfig(slots=slots, microbatches=microbatches, schedule=schedule, prefills_per_iteration=prefills,
                          chunk_tokens=chunk)
        if kill_at is not None and not (0 <= kill_at < requests and 0 <= kill_rank < len(devs)):
            raise UserError(f"--kill-at {kill_at} / --kill-rank {kill_rank}: valid 0..{requests - 1} / "
                            f"0..{len(devs) - 1}")
        fault = Fault(at_request=kill_at, rank=kill_rank) if kill_at is not None else None
        spec = ServeRunSpec(model=model, devices=devs, workload=wl, serve=cfg, placement=placement_name, plan=plan,
                            compare_sync=compare_sync, seed=seed, recover=recover, replan=replan, fault=fault,
                            repeats=repeats, trace=str(trace) if trace else None)
        try:
            out = serve_run(spec)
        except WorkerFailure as e:
            typer.echo(f"error: {e}", err=True)
            sys.exit(1)
        typer.echo(out.to_json() if as_json else out.summary())
        if verify and not out.verified:
            typer.echo(f"error: requests differ from their single-process runs (max |diff| {out.max_abs_diff:.3g}, "
                       f"tokens identical {out.tokens_identical})", err=True)
            sys.exit(1)
