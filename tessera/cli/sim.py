"""`tessera simulate`: a plan served by the discrete-event simulator (tessera.sim); registered by tessera.cli."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.plan_flags import check_context
from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan, PoolPlan, read_plan_file
from tessera.contracts.provenance import Provenance
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy
from tessera.sim.api import run
from tessera.sim.failure import Failure, replica_loss
from tessera.sim.knee import KneeConfig, MeasuredKnee, find_knee
from tessera.sim.metrics import SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.trace import write_chrome_trace
from tessera.sim.traffic import (
    cell_plans,
    default_workload,
    images,
    offered_load,
    plan_lengths,
    predicted_requests_per_s,
    simulation_provenance,
    targets_with,
)
from tessera.sim.workload import LengthSpec, WorkloadSpec
from tessera.text import plural

out = Console()


def _ms(d: dict) -> str:
    return " / ".join("-" if d[k] is None else f"{d[k] * 1e3:.1f}" for k in ("p50", "p90", "p99"))


def _table(r: SimResult, title: str, load: float | None = None) -> Table:
    """``load``: the offered rate over the plan's goodput (None: offline, or a plan without one)."""
    t = Table(title=title, show_header=False)
    t.add_row("requests (completed / lost)", f"{r.requests} ({r.completed} / {r.lost})")
    t.add_row("simulated span", f"{r.sim_wall_s:.2f} s  ({plural(r.replicas, 'replica')}, ran in {r.runtime_s:.2f} s)")
    if r.images_per_s:
        t.add_row("throughput", f"{r.images_per_s:.3f} images/s, {r.requests_per_s:.2f} req/s")
    else:
        t.add_row("throughput", f"{r.throughput_tokens_per_s:,.0f} tokens/s, {r.requests_per_s:.2f} req/s")
    t.add_row("TTFT p50/p90/p99 (ms)", _ms(r.ttft_s))
    t.add_row("TPOT p50/p90/p99 (ms)", _ms(r.tpot_s))
    t.add_row("E2E p50/p90/p99 (ms)", _ms(r.e2e_s))
    if r.slo_attainment is not None:
        t.add_row("SLO attainment", f"{r.slo_attainment:.1%}")
    if r.usd_per_million_tokens is not None:
        t.add_row("cost", f"${r.usd_per_million_tokens:.3f} per million tokens")
    if load is not None:
        t.add_row("offered load", f"{load:.1%} of the plan's goodput")
    # busy, not utilised: a device running a small batch is busy for nearly as long as with a full one
    t.add_row("device busy (share of the span)", ", ".join(f"{u:.0%}" for u in r.device_utilisation))
    t.add_row("preemptions / switches", f"{r.preemptions} / {r.switches}")
    for f in r.failures:
        dip = "-" if f["dip"] is None else f"{f['dip']:.0%} of pre-failure"
        rec = "not within the run" if f["recovery_s"] is None else f"{f['recovery_s']:.2f} s"
        t.add_row(f"failure of replica {f['replica']} at {f['at_s']:g} s",
                  f"{f['requeued']} re-queued; min window {dip}; recovered after {rec}")
    return t


def _warn_overload(plan: Plan | PoolPlan, spec: WorkloadSpec, replicas: int) -> None:
    """A rate far beyond what the plan serves is allowed (a saturation test) but said out loud."""
    cap = predicted_requests_per_s(plan, spec, replicas)
    if cap is not None and spec.rate_per_s > 10 * cap:
        print(f"note: --rate {spec.rate_per_s:g} req/s is {spec.rate_per_s / cap:,.0f}× the plan's predicted "
              f"capacity ({cap:.2f} req/s): the queue grows for the whole run", file=sys.stderr)


def _failures(plan: Plan | PoolPlan, fail_at: float | None, fail_replica: int, replacement: str,
              replan_s: float, replicas: int = 1) -> list[Failure]:
    if fail_at is None:
        return []
    if replacement not in ("none", "same"):
        raise UserError(f"unknown --fail-replacement {replacement!r}; valid: none, same")
    # "same": a spare cell of the lost replica's plan joins after the re-plan time; "none": one fewer replica
    return [replica_loss(plan, at_s=fail_at, replica=fail_replica, spare=replacement == "same",
                         replan_s=replan_s, replicas=replicas)]


def _slo(plan: Plan | PoolPlan, ttft_ms: float | None, tpot_ms: float | None,
         e2e_ms: float | None) -> LatencyTargets | None:
    """The plan's SLO, each target the flags give replacing its own."""
    flags = (("ttft_s", ttft_ms, "--slo-ttft-ms"), ("tpot_s", tpot_ms, "--slo-tpot-ms"),
             ("e2e_s", e2e_ms, "--slo-e2e-ms"))
    for _, v, flag in flags:
        if v is not None and not v > 0:
            raise UserError(f"{flag} {v:g} must be a positive time in milliseconds")
    return targets_with(plan, **{k: v / 1e3 for k, v, _ in flags if v is not None})


def _trace_window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--trace-window-s {text!r} is not START:END in simulated seconds, e.g. 0:2") from None
    if not 0 <= a < b:
        raise UserError(f"--trace-window-s {text!r}: START must be >= 0 and below END, e.g. 0:2")
    return a, b


def _lost_text(spec: WorkloadSpec, kv: int, stranded: bool) -> str:
    """Why requests were lost: a failure left no replica to serve them (``stranded``), or they exceed the
    KV capacity."""
    if stranded:
        return ("the failure left no replica to serve them (--fail-replacement same adds a spare cell, "
                "--replicas more copies)")
    return (f"prompt + output ({spec.prompt} + {spec.output} tokens) exceed the plan's KV capacity of {kv:,} "
            "tokens per cell")


def knee_target(given: float | None, knee: bool) -> float:
    """The share of requests the knee must serve within the SLO (--slo-target, 0.9 unless given); given
    without --knee it would change nothing, and is refused."""
    if given is None:
        return 0.9
    if not knee:
        raise UserError(f"--slo-target {given:g} sets the share the SLO knee must meet (--knee); a simulation "
                        "reports the share it met: add --knee or drop --slo-target")
    if not 0 < given <= 1:
        raise UserError(f"--slo-target {given:g} must be a share of requests in (0, 1], e.g. 0.9")
    return given


def _print_knee(k: MeasuredKnee, json_out: bool, prov: Provenance) -> None:
    if json_out:
        print(json.dumps({**k.to_dict(), "provenance": prov.to_dict()}))
        return
    t = Table(title="SLO knee (bisection over the Poisson arrival rate)", show_header=False)
    slo = ", ".join(f"{n} {v * 1e3:g} ms" for n, v in (("TTFT", k.slo["ttft_s"]), ("TPOT", k.slo["tpot_s"]),
                                                        ("E2E", k.slo["e2e_s"])) if v is not None)
    t.add_row("traffic / SLO",
              f"prompt {k.prompt}, output {k.output}; {slo}; target {k.target:.0%} of requests")
    t.add_row("knee", f"{k.rate_per_s:.4g} req/s = {k.per_s:,.4g} {k.unit}" + (
        "" if k.attainment is None else f" (attainment {k.attainment:.1%})"))
    if k.above_rate_per_s is not None:
        t.add_row("just above", f"{k.above_rate_per_s:.4g} req/s (attainment {k.above_attainment:.1%})")
    if k.planner_per_s is not None:
        ratio = f" (knee / plan {k.per_s / k.planner_per_s:.2f})" if k.planner_per_s > 0 else ""
        t.add_row("plan's goodput", f"{k.planner_per_s:,.4g} {k.unit}{ratio}")
    t.add_row("search", f"{k.rates} rates x {plural(len(k.seeds), 'seed')} x {k.requests:,} requests "
                        f"(first {k.warmup:.0%} not judged), bracket {k.rel_tol:.0%}, {k.wall_s:.1f} s")
    if k.note:
        t.add_row("note", k.note)
    out.print(t)


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        plan_path: Path = typer.Argument(..., metavar="PLAN.json", help="plan file from `tessera plan -o` (one "
                                         "cell's plan, or a pool plan of different cells)"),
        workload: str | None = typer.Option(None, help="offline | poisson | bursty (default: poisson with "
                                            "--rate; without it poisson at 90% of the plan's goodput, else "
                                            "offline)"),
        rate: float | None = typer.Option(None, help="mean arrival rate, requests/s (poisson, bursty)"),
        requests: int | None = typer.Option(None, help="number of requests (default 1000; --knee: per rate "
                                            "and seed, 10 x the sequences the pool runs at once, >= 2000)"),
        prompt: str | None = typer.Option(None, help="prompt tokens: N, LO-HI, or azure_conv_2023 / "
                                          "azure_code_2023 (default: the plan's traffic, else 512)"),
        output: str | None = typer.Option(None, help="output tokens (denoising steps for image plans): as "
                                          "--prompt (default: the plan's traffic, else 128)"),
        burst: str = typer.Option("gamma", help="bursty shape: gamma | onoff"),
        burst_cv: float = typer.Option(3.0, help="gamma: coefficient of variation of inter-arrival times"),
        on_s: float = typer.Option(10.0, help="onoff: seconds of arrivals"),
        off_s: float = typer.Option(20.0, help="onoff: seconds without arrivals"),
        seed: int = typer.Option(0, help="random seed (same seed, same metrics; --knee: seeds S and S+1)"),
        slo_ttft_ms: float | None = typer.Option(None, help="TTFT target (default: the plan's SLO)"),
        slo_tpot_ms: float | None = typer.Option(None, help="TPOT target (default: the plan's SLO)"),
        slo_e2e_ms: float | None = typer.Option(None, help="end-to-end target, an image plan's latency per "
                                                "image (default: the plan's SLO)"),
        replicas: int = typer.Option(1, help="copies of the plan behind the router"),
        router: str = typer.Option("least_loaded", help="least_loaded | round_robin"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", "--max-batch", help="sequences "
                                                "running at once per replica (default: the plan's engine "
                                                "settings)"),
        max_num_batched_tokens: int | None = typer.Option(None, help="token budget of one micro-batch's "
                                                          "iteration (two-phase plans: of a prefill "
                                                          "iteration; default: the plan's engine settings)"),
        microbatches: int | None = typer.Option(None, help="serving-model plans: groups advancing "
                                                "independently (default: the plan's engine settings)"),
        chunked_prefill: bool = typer.Option(False, help="two-phase plans: split prompts into chunks mixed "
                                             "with decode (serving-model plans always do)"),
        knee: bool = typer.Option(False, help="find the SLO knee: the highest poisson rate at which "
                                  "--slo-target of requests meet the SLO"),
        slo_target: float | None = typer.Option(None, help="--knee: share of requests that must meet the SLO "
                                                "(default 0.9, as plan)"),
        old_target: float | None = typer.Option(None, "--target", hidden=True, help="old name of --slo-target"),
        adaptive: bool = typer.Option(False, help="switch between --latency-plan and PLAN by queue depth"),
        latency_plan: Path | None = typer.Option(None, help="latency-mode plan for --adaptive"),
        switch_ms: float | None = typer.Option(None, help="switch cost (default: one pipeline fill)"),
        high_load: int | None = typer.Option(None, help="adaptive: outstanding requests -> throughput mode "
                                             "(default: latency plan's largest batch)"),
        low_load: int | None = typer.Option(None, help="adaptive: outstanding requests -> latency mode "
                                            "(default: half of --high-load)"),
        json_out: bool = typer.Option(False, "--json", help="print the JSON contract"),
        detail: bool = typer.Option(False, help="with --json: add a detail object"),
        trace: Path | None = typer.Option(None, help="write a Chrome trace (Perfetto) of a time window"),
        trace_window_s: str = typer.Option("0:2", help="trace window START:END in simulated seconds"),
        gantt: Path | None = typer.Option(None, help="write a Gantt PNG of a few pipelined iterations"),
        fail_at: float | None = typer.Option(None, help="what-if: lose a replica at this simulated second"),
        fail_replica: int = typer.Option(0, help="with --fail-at: index of the lost replica (cell)"),
        fail_replacement: str = typer.Option("none", help="with --fail-at: none (one fewer replica from then "
                                             "on) | same (a spare cell of the plan joins after --fail-replan-s)"),
        fail_replan_s: float = typer.Option(0.0, help="with --fail-at: seconds until the replacement joins"),
        window_s: float | None = typer.Option(None, help="throughput series / failure window (default: "
                                              "simulated span / 100)"),
    ) -> None:
        """Serve a workload on a plan (discrete-event simulation) and report serving metrics, or its SLO knee.
        Traffic, SLO and engine settings default to the plan's own."""
        plan = read_plan_file(plan_path)
        p_def, o_def = plan_lengths(plan)
        p_spec = LengthSpec.parse(prompt) if prompt is not None else p_def
        o_spec = LengthSpec.parse(output) if output is not None else o_def
        if not images(plan):
            check_context(plan.model, p_spec.hi if not p_spec.trace else None,
                          o_spec.hi if not o_spec.trace else None, known_only=True)
        slo = _slo(plan, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)
        cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              microbatches=microbatches, chunked_prefill=chunked_prefill, router=router)
        if chunked_prefill and any(Phase.MIXED in p.phases for p in cell_plans(plan)):
            print("note: a serving-model (mixed) plan always prefills in chunks up to its token budget; "
                  "--chunked-prefill changes nothing for it", file=sys.stderr)
        target = knee_target(slo_target if slo_target is not None else old_target, knee)
        if knee:
            k = find_knee(plan, prompt=p_spec, output=o_spec, slo=slo, scheduler=cfg, replicas=replicas,
                          config=KneeConfig(target=target, requests=requests, seeds=(seed, seed + 1)))
            _print_knee(k, json_out, simulation_provenance(plan, p_spec, o_spec, slo, workload="poisson",
                                                           rate_per_s=k.rate_per_s, seed=seed, target=target))
            return
        window = _trace_window(trace_window_s) if trace is not None else None
        if window_s is not None and not window_s > 0:
            raise UserError(f"--window-s {window_s:g} must be a positive time in seconds")
        spec, note = default_workload(plan, workload, rate, requests=requests or 1000, prompt=p_spec,
                                      output=o_spec, replicas=replicas, burst=burst, burst_cv=burst_cv,
                                      on_s=on_s, off_s=off_s)
        if note:
            print(f"note: simulating {note}", file=sys.stderr)
        _warn_overload(plan, spec, replicas)
        policy = None
        if adaptive:
            if latency_plan is None:
                raise UserError("--adaptive needs --latency-plan P.json (PLAN is the throughput-mode plan)")
            policy = AdaptivePolicy(latency_plan=Plan.load(latency_plan), high_load=high_load,
                                    low_load=low_load, switch_s=None if switch_ms is None else switch_ms / 1e3)
        r = run(plan, spec, replicas=replicas, policy=policy, seed=seed, slo=slo, config=cfg,
                trace_window_s=window, window_s=window_s,
                failures=_failures(plan, fail_at, fail_replica, fail_replacement, fail_replan_s, replicas))
        res = r.result
        if trace is not None:
            events = write_chrome_trace(trace, {m: pm.plan for m, pm in r.models.items()}, r.trace, r.spans)
            if window is not None and window[0] >= res.sim_wall_s:
                print(f"note: --trace-window-s {trace_window_s} starts after the simulated span "
                      f"({res.sim_wall_s:.3g} s): {trace} holds {events} events", file=sys.stderr)
        if gantt is not None:
            from tessera.sim.gantt import plot_run  # matplotlib is slow to import: only for a Gantt

            plot_run(plan, r, spec, gantt)
        kv = max(p.kv_capacity_tokens for p in cell_plans(plan))
        stranded = fail_at is not None and fail_replacement == "none" and res.replicas <= 1
        if res.lost == res.requests:
            raise UserError(f"all {res.requests} requests lost: {_lost_text(spec, kv, stranded)}"
                            + ("" if stranded else "; give shorter requests or a plan with more memory for KV"))
        if res.lost:
            print(f"note: {res.lost} of {res.requests} requests lost: {_lost_text(spec, kv, stranded)}",
                  file=sys.stderr)
        prov = simulation_provenance(plan, spec.prompt, spec.output, slo, workload=spec.kind, seed=seed,
                             rate_per_s=None if spec.kind == "offline" else spec.rate_per_s)
        if json_out:
            print(json.dumps({**(res.to_dict() if detail else res.to_json()), "provenance": prov.to_dict()}))
        else:
            kind = f" (pool of {plural(len(plan.cells), 'different cell')})" if isinstance(plan, PoolPlan) else ""
            rate_s = "" if spec.kind == "offline" else f" {spec.rate_per_s:.4g} req/s"
            out.print(_table(res, f"{plan.model} / {plan.strategy}{kind} / {spec.kind}{rate_s}, prompt "
                                  f"{spec.prompt}, output {spec.output}", offered_load(plan, spec, replicas)))

