"""`tessera simulate`: a plan served by the discrete-event simulator (tessera.sim); registered by tessera.cli."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.plan_flags import check_context
from tessera.contracts.plan import PoolPlan
from tessera.errors import UserError
from tessera.sim.knee import MeasuredKnee
from tessera.sim.metrics import SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.request import SimOutcome, SimRequest, simulate_file
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
        dip = "-" if f.dip is None else f"{f.dip:.0%} of pre-failure"
        rec = "not within the run" if f.recovery_s is None else f"{f.recovery_s:.2f} s"
        t.add_row(f"failure of replica {f.replica} at {f.at_s:g} s",
                  f"{f.requeued} re-queued; min window {dip}; recovered after {rec}")
    return t


def _print_knee(k: MeasuredKnee) -> None:
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


def _title(o: SimOutcome) -> str:
    plan, spec = o.plan, o.workload
    assert spec is not None  # a simulation's outcome (not a knee's) carries its workload
    kind = f" (pool of {plural(len(plan.cells), 'different cell')})" if isinstance(plan, PoolPlan) else ""
    rate_s = "" if spec.kind == "offline" else f" {spec.rate_per_s:.4g} req/s"
    return (f"{plan.model} / {plan.strategy}{kind} / {spec.kind}{rate_s}, prompt {spec.prompt}, "
            f"output {spec.output}")


def _render(o: SimOutcome, *, json_out: bool, detail: bool) -> None:
    """The notes on stderr, then the refusal (a user error), the JSON or the table."""
    for note in o.notes:
        print(f"note: {note}", file=sys.stderr)
    if o.refusal is not None:
        raise UserError(o.refusal)
    if json_out:
        print(json.dumps(o.to_json(detail=detail)))
    elif o.knee is not None:
        _print_knee(o.knee)
    elif o.result is not None:
        out.print(_table(o.result, _title(o), o.load))


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
        req = SimRequest(plan_path=plan_path, workload=workload, rate_per_s=rate, requests=requests,
                         prompt=prompt, output=output, burst=burst, burst_cv=burst_cv, on_s=on_s, off_s=off_s,
                         seed=seed, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_e2e_ms=slo_e2e_ms,
                         replicas=replicas, knee=knee,
                         scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                                   max_num_batched_tokens=max_num_batched_tokens,
                                                   microbatches=microbatches, chunked_prefill=chunked_prefill,
                                                   router=router),
                         slo_target=slo_target if slo_target is not None else old_target, adaptive=adaptive,
                         latency_plan=latency_plan, switch_ms=switch_ms, high_load=high_load,
                         low_load=low_load,
                         trace=trace, trace_window_s=trace_window_s, gantt=gantt, fail_at_s=fail_at,
                         fail_replica=fail_replica, fail_replacement=fail_replacement,
                         fail_replan_s=fail_replan_s, window_s=window_s,
                         check_context=partial(check_context, known_only=True))
        _render(simulate_file(req), json_out=json_out, detail=detail)
