"""`tessera simulate`: a plan served by the discrete-event simulator (tessera.sim); registered by tessera.cli."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tessera.cli.plan_flags import check_context
from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan, PoolPlan, read_plan_file
from tessera.contracts.provenance import Provenance, fingerprint
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy
from tessera.sim.api import run
from tessera.sim.failure import Failure
from tessera.sim.knee import Knee, KneeConfig, find_knee
from tessera.sim.metrics import SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.trace import write_chrome_trace
from tessera.sim.traffic import images, mean_tokens, plan_goodput_per_s, plan_lengths, plan_slo
from tessera.sim.workload import LengthSpec, WorkloadSpec
from tessera.text import plural

GOODPUT_SHARE = 0.9  # default load: this share of the plan's goodput

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
    thr = (plan.throughput_per_s if not plan.images else None) if isinstance(plan, PoolPlan) \
        else plan.throughput_tokens_per_s
    if spec.kind == "offline" or not thr or spec.output.trace:
        return
    cap = thr * replicas / ((spec.output.lo + spec.output.hi) / 2)  # requests/s the plan predicts
    if spec.rate_per_s > 10 * cap:
        print(f"note: --rate {spec.rate_per_s:g} req/s is {spec.rate_per_s / cap:,.0f}× the plan's predicted "
              f"capacity ({cap:.2f} req/s): the queue grows for the whole run", file=sys.stderr)


def _failure(plan: Plan | PoolPlan, fail_at: float | None, fail_replica: int, replacement: str, replan_s: float,
             replicas: int = 1) -> list:
    if fail_at is None:
        return []
    if replacement not in ("none", "same"):
        raise UserError(f"unknown --fail-replacement {replacement!r}; valid: none, same")
    # "same": a spare cell of the lost replica's plan joins after the re-plan time; "none": one fewer replica
    lost = _replica_plan(plan, fail_replica, replicas)
    cell = (replace(lost, replicas=1), 1) if replacement == "same" else None
    return [Failure(at_s=fail_at, replica=fail_replica, replacement=cell, replan_s=replan_s)]


def _replica_plan(plan: Plan | PoolPlan, replica: int, replicas: int) -> Plan:
    """The cell plan serving replica index ``replica``: the simulator numbers replicas cell by cell, each
    cell count × replicas × plan.replicas times (an index past the end is the simulator's error to give)."""
    if isinstance(plan, Plan):
        return plan
    first = 0
    for c in plan.cells:
        first += c.count * replicas * c.plan.replicas
        if replica < first:
            return c.plan
    return plan.cells[-1].plan


def _workload(plan: Plan | PoolPlan, kind: str | None, rate: float | None, requests: int, prompt: LengthSpec,
              output: LengthSpec, burst: str, burst_cv: float, replicas: int, on_s: float = 10.0,
              off_s: float = 20.0) -> tuple[WorkloadSpec, str]:
    """The workload the flags ask for; a rate without --workload is poisson; neither (or an open workload
    without a rate) is poisson at 90% of the plan's goodput where it has one, offline otherwise. The second
    value says which default was taken ("" when none)."""
    note = ""
    if kind is None:
        kind = "poisson" if rate is not None else None
    if rate is None and kind != "offline":
        good = plan_goodput_per_s(plan)
        if good:
            mean_out = 1.0 if images(plan) else mean_tokens(output, 1)
            rate = GOODPUT_SHARE * good * replicas / mean_out
            kind = kind or "poisson"
            note = (f"{kind} arrivals at {GOODPUT_SHARE:.0%} of the plan's goodput "
                    f"({good * replicas:,.4g} {'images' if images(plan) else 'tokens'}/s): {rate:.4g} req/s")
        elif kind is None:
            kind = "offline"
    spec = WorkloadSpec(kind=kind, requests=requests, rate_per_s=rate or 0.0, prompt=prompt, output=output,
                        burst=burst, burst_cv=burst_cv, on_s=on_s, off_s=off_s)
    return spec, note


def _slo(plan: Plan | PoolPlan, ttft_ms: float | None, tpot_ms: float | None,
         e2e_ms: float | None) -> LatencyTargets | None:
    """The plan's SLO, each target the flags give replacing its own."""
    base = plan_slo(plan) or LatencyTargets()
    flags = (("ttft_s", ttft_ms, "--slo-ttft-ms"), ("tpot_s", tpot_ms, "--slo-tpot-ms"),
             ("e2e_s", e2e_ms, "--slo-e2e-ms"))
    for _, v, flag in flags:
        if v is not None and not v > 0:
            raise UserError(f"{flag} {v:g} must be a positive time in milliseconds")
    given = {k: v / 1e3 for k, v, _ in flags if v is not None}
    slo = replace(base, **given)
    return slo if slo.given else None


def provenance_of(plan: Plan | PoolPlan, prompt: LengthSpec, output: LengthSpec, slo: LatencyTargets | None,
                  *, workload: str | None, rate_per_s: float | None, seed: int | None,
                  target: float | None = None) -> Provenance:
    """What a simulation of ``plan`` was run with, for the file it writes."""
    return Provenance(model=plan.model, plan=fingerprint(plan), prompt=str(prompt), output=str(output),
                      output_per_request=1.0 if images(plan) else mean_tokens(output, 1),
                      slo_ttft_s=slo.ttft_s if slo else None, slo_tpot_s=slo.tpot_s if slo else None,
                      slo_e2e_s=slo.e2e_s if slo else None, slo_target=target, workload=workload,
                      rate_per_s=rate_per_s, seed=seed)


def _load(plan: Plan | PoolPlan, spec: WorkloadSpec, replicas: int) -> float | None:
    """Offered output tokens/s (images/s) over the plan's goodput × replicas."""
    good = plan_goodput_per_s(plan)
    if spec.kind == "offline" or not good:
        return None
    per_request = 1.0 if images(plan) else mean_tokens(spec.output, 1)
    return spec.rate_per_s * per_request / (good * replicas)


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


def _print_knee(k: Knee, json_out: bool, prov: Provenance) -> None:
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
        if chunked_prefill and any(Phase.MIXED in p.phases for p in _cell_plans(plan)):
            print("note: a serving-model (mixed) plan always prefills in chunks up to its token budget; "
                  "--chunked-prefill changes nothing for it", file=sys.stderr)
        target = knee_target(slo_target if slo_target is not None else old_target, knee)
        if knee:
            k = find_knee(plan, prompt=p_spec, output=o_spec, slo=slo, scheduler=cfg, replicas=replicas,
                          config=KneeConfig(target=target, requests=requests, seeds=(seed, seed + 1)))
            _print_knee(k, json_out, provenance_of(plan, p_spec, o_spec, slo, workload="poisson",
                                                   rate_per_s=k.rate_per_s, seed=seed, target=target))
            return
        window = _trace_window(trace_window_s) if trace is not None else None
        if window_s is not None and not window_s > 0:
            raise UserError(f"--window-s {window_s:g} must be a positive time in seconds")
        spec, note = _workload(plan, workload, rate, requests or 1000, p_spec, o_spec, burst, burst_cv,
                               replicas, on_s, off_s)
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
                failures=_failure(plan, fail_at, fail_replica, fail_replacement, fail_replan_s, replicas))
        res = r.result
        if trace is not None:
            events = write_chrome_trace(trace, {m: pm.plan for m, pm in r.models.items()}, r.trace, r.spans)
            if window is not None and window[0] >= res.sim_wall_s:
                print(f"note: --trace-window-s {trace_window_s} starts after the simulated span "
                      f"({res.sim_wall_s:.3g} s): {trace} holds {events} events", file=sys.stderr)
        if gantt is not None:
            _gantt(plan, r, spec, gantt)
        kv = max(p.kv_capacity_tokens for p in _cell_plans(plan))
        stranded = fail_at is not None and fail_replacement == "none" and res.replicas <= 1
        if res.lost == res.requests:
            raise UserError(f"all {res.requests} requests lost: {_lost_text(spec, kv, stranded)}"
                            + ("" if stranded else "; give shorter requests or a plan with more memory for KV"))
        if res.lost:
            print(f"note: {res.lost} of {res.requests} requests lost: {_lost_text(spec, kv, stranded)}",
                  file=sys.stderr)
        prov = provenance_of(plan, spec.prompt, spec.output, slo, workload=spec.kind, seed=seed,
                             rate_per_s=None if spec.kind == "offline" else spec.rate_per_s)
        if json_out:
            print(json.dumps({**(res.to_dict() if detail else res.to_json()), "provenance": prov.to_dict()}))
        else:
            kind = f" (pool of {plural(len(plan.cells), 'different cell')})" if isinstance(plan, PoolPlan) else ""
            rate_s = "" if spec.kind == "offline" else f" {spec.rate_per_s:.4g} req/s"
            out.print(_table(res, f"{plan.model} / {plan.strategy}{kind} / {spec.kind}{rate_s}, prompt "
                                  f"{spec.prompt}, output {spec.output}", _load(plan, spec, replicas)))


def _gantt(plan: Plan | PoolPlan, r, spec: WorkloadSpec, path: Path) -> None:
    """A few pipelined iterations of the first cell's iterative phase: a mixed plan's at its token budget,
    another's at its largest batch, at prompt + half the output of context."""
    from tessera.sim.gantt import plot_plan  # matplotlib is slow to import: only when a Gantt is asked for

    pm = r.models["throughput"]
    ctx = float(spec.prompt.lo or 0) + float(spec.output.lo or 0) / 2
    lead = plan.lead if isinstance(plan, PoolPlan) else plan
    tokens = None if pm.mixed else pm.max_batch * pm.iter.tokens_per_item
    plot_plan(lead, path, phase=pm.iter.phase, tokens=tokens, context=0.0 if pm.image else ctx)


def _cell_plans(plan: Plan | PoolPlan) -> list[Plan]:
    return [c.plan for c in plan.cells] if isinstance(plan, PoolPlan) else [plan]
