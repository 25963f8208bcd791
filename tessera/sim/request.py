"""`tessera simulate` as one call: a SimRequest (the command's flags) in, a SimOutcome out.

`simulate_file` reads the plan file, fills what the request leaves open from the plan (traffic, SLO,
arrival rate), simulates the workload or finds the SLO knee, writes the trace and Gantt files asked for,
and returns the result with the notes the command prints on stderr and the provenance of its JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan, PoolPlan, read_plan_file
from tessera.contracts.provenance import Provenance
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy
from tessera.sim.api import Run, run
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

# (model, prompt tokens, output tokens) -> None, or a UserError when they exceed the model's context window;
# None for a length that is not one number (a trace). The caller's: the simulator reads no model config.
ContextCheck = Callable[[str, int | None, int | None], None]

DEFAULT_REQUESTS = 1000  # a simulation's requests when --requests is not given (the knee sizes its own)
OVERLOAD = 10  # a rate above this many times the plan's predicted capacity is said out loud


def trace_window(text: str) -> tuple[float, float]:
    """``"START:END"`` in simulated seconds, 0 <= START < END."""
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--trace-window-s {text!r} is not START:END in simulated seconds, "
                        "e.g. 0:2") from None
    if not 0 <= a < b:
        raise UserError(f"--trace-window-s {text!r}: START must be >= 0 and below END, e.g. 0:2")
    return a, b


def knee_target(given: float | None, knee: bool) -> float:
    """The share of requests the knee must serve within the SLO (--slo-target, 0.9 unless given); given
    without --knee it would change nothing, and is refused."""
    if given is None:
        return 0.9
    if not knee:
        raise UserError(f"--slo-target {given:g} sets the share the SLO knee must meet (--knee); a "
                        "simulation reports the share it met: add --knee or drop --slo-target")
    if not 0 < given <= 1:
        raise UserError(f"--slo-target {given:g} must be a share of requests in (0, 1], e.g. 0.9")
    return given


@dataclass(frozen=True, kw_only=True)
class SimRequest:
    """What `tessera simulate` was asked: each field a flag of the same name (times in the flags' units);
    None takes the plan's own value (traffic, SLO) or the default docs/sim.md names."""

    plan_path: Path
    workload: str | None = None  # offline | poisson | bursty
    rate_per_s: float | None = None  # requests/s
    requests: int | None = None
    prompt: str | None = None  # N, LO-HI or a trace name (LengthSpec.parse)
    output: str | None = None
    burst: str = "gamma"
    burst_cv: float = 3.0
    on_s: float = 10.0
    off_s: float = 20.0
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    replicas: int = 1
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    knee: bool = False
    slo_target: float | None = None  # --knee only
    adaptive: bool = False
    latency_plan: Path | None = None  # --adaptive: the latency-mode plan
    switch_ms: float | None = None
    high_load: int | None = None  # outstanding requests
    low_load: int | None = None
    trace: Path | None = None  # Chrome trace file to write
    trace_window_s: str = "0:2"  # START:END, simulated seconds
    gantt: Path | None = None  # Gantt PNG to write
    fail_at_s: float | None = None  # lose a replica at this simulated second
    fail_replica: int = 0
    fail_replacement: str = "none"  # none | same
    fail_replan_s: float = 0.0
    window_s: float | None = None  # throughput series / failure window
    check_context: ContextCheck | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for text in (self.prompt, self.output):
            if text is not None:
                LengthSpec.parse(text)  # a length that does not parse: one line, before the plan is read
        for flag, v in (("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-tpot-ms", self.slo_tpot_ms),
                        ("--slo-e2e-ms", self.slo_e2e_ms)):
            if v is not None and not v > 0:
                raise UserError(f"{flag} {v:g} must be a positive time in milliseconds")
        knee_target(self.slo_target, self.knee)
        if self.trace is not None:
            trace_window(self.trace_window_s)
        if self.window_s is not None and not self.window_s > 0:
            raise UserError(f"--window-s {self.window_s:g} must be a positive time in seconds")
        if self.adaptive and self.latency_plan is None:
            raise UserError("--adaptive needs --latency-plan P.json (PLAN is the throughput-mode plan)")
        if self.fail_at_s is not None and self.fail_replacement not in ("none", "same"):
            raise UserError(f"unknown --fail-replacement {self.fail_replacement!r}; valid: none, same")

    @property
    def prompt_spec(self) -> LengthSpec | None:
        return None if self.prompt is None else LengthSpec.parse(self.prompt)

    @property
    def output_spec(self) -> LengthSpec | None:
        return None if self.output is None else LengthSpec.parse(self.output)

    @property
    def slo_s(self) -> dict[str, float]:
        """The SLO targets given, in seconds, by LatencyTargets field."""
        given = (("ttft_s", self.slo_ttft_ms), ("tpot_s", self.slo_tpot_ms), ("e2e_s", self.slo_e2e_ms))
        return {k: v / 1e3 for k, v in given if v is not None}


@dataclass(frozen=True, kw_only=True)
class SimOutcome:
    """What `tessera simulate` found: a simulation's ``result`` (with its ``workload`` and the offered
    ``load``, the rate over the plan's goodput) or the SLO ``knee``; the ``notes`` to say on stderr, one
    line each without the "note: " prefix; the ``provenance`` of the JSON; and a ``refusal`` when the run
    cannot stand as a result (every request lost), which the command ends with as a user error after the
    notes."""

    plan: Plan | PoolPlan
    provenance: Provenance
    notes: tuple[str, ...] = ()
    result: SimResult | None = None
    workload: WorkloadSpec | None = None
    load: float | None = None
    knee: MeasuredKnee | None = None
    refusal: str | None = None

    def __post_init__(self) -> None:
        if (self.result is None) == (self.knee is None) or (self.result is None) != (self.workload is None):
            raise ValueError("SimOutcome holds a result with its workload, or a knee, not both nor neither")

    def to_json(self, *, detail: bool = False) -> dict[str, Any]:
        """`tessera simulate --json`: the knee's fields or SimResult's contract (``detail``: its to_dict),
        with the provenance."""
        body = self.knee.to_dict() if self.knee is not None else \
            self.result.to_dict() if detail else self.result.to_json()  # type: ignore[union-attr]
        return {**body, "provenance": self.provenance.to_dict()}


def simulate_file(req: SimRequest) -> SimOutcome:
    """`tessera simulate PLAN.json ...`: the plan file served as ``req`` asks (docs/sim.md)."""
    plan = read_plan_file(req.plan_path)
    p_def, o_def = plan_lengths(plan)
    prompt = p_def if req.prompt_spec is None else req.prompt_spec
    output = o_def if req.output_spec is None else req.output_spec
    if not images(plan) and req.check_context is not None:
        req.check_context(plan.model, None if prompt.trace else prompt.hi,
                          None if output.trace else output.hi)
    slo = targets_with(plan, **req.slo_s)
    notes = chunked_prefill_notes(plan, req.scheduler)
    if req.knee:
        return knee_outcome(plan, req, prompt, output, slo, notes)
    spec, note = default_workload(plan, req.workload, req.rate_per_s,
                                  requests=req.requests or DEFAULT_REQUESTS, prompt=prompt, output=output,
                                  replicas=req.replicas, burst=req.burst, burst_cv=req.burst_cv,
                                  on_s=req.on_s, off_s=req.off_s)
    notes += (f"simulating {note}",) if note else ()
    notes += overload_notes(plan, spec, req.replicas)
    r = run(plan, spec, replicas=req.replicas, policy=adaptive_policy(req), seed=req.seed, slo=slo,
            config=req.scheduler, trace_window_s=trace_window(req.trace_window_s) if req.trace else None,
            window_s=req.window_s, failures=failures(plan, req))
    notes += write_files(plan, r, spec, req)
    lost, refusal = lost_notes(plan, r.result, spec, req)
    return SimOutcome(plan=plan, result=r.result, workload=spec, load=offered_load(plan, spec, req.replicas),
                      notes=notes + lost, refusal=refusal,
                      provenance=simulation_provenance(
                          plan, spec.prompt, spec.output, slo, workload=spec.kind, seed=req.seed,
                          rate_per_s=None if spec.kind == "offline" else spec.rate_per_s))


def knee_outcome(plan: Plan | PoolPlan, req: SimRequest, prompt: LengthSpec, output: LengthSpec,
                 slo: LatencyTargets | None, notes: tuple[str, ...]) -> SimOutcome:
    """The SLO knee: poisson rates bisected over seeds S and S+1."""
    target = knee_target(req.slo_target, req.knee)
    k = find_knee(plan, prompt=prompt, output=output, slo=slo, scheduler=req.scheduler, replicas=req.replicas,
                  config=KneeConfig(target=target, requests=req.requests, seeds=(req.seed, req.seed + 1)))
    prov = simulation_provenance(plan, prompt, output, slo, workload="poisson", rate_per_s=k.rate_per_s,
                                 seed=req.seed, target=target)
    return SimOutcome(plan=plan, knee=k, notes=notes, provenance=prov)


def chunked_prefill_notes(plan: Plan | PoolPlan, cfg: SchedulerConfig) -> tuple[str, ...]:
    """--chunked-prefill on a serving-model plan is allowed but changes nothing: said."""
    if cfg.chunked_prefill and any(Phase.MIXED in p.phases for p in cell_plans(plan)):
        return ("a serving-model (mixed) plan always prefills in chunks up to its token budget; "
                "--chunked-prefill changes nothing for it",)
    return ()


def overload_notes(plan: Plan | PoolPlan, spec: WorkloadSpec, replicas: int) -> tuple[str, ...]:
    """A rate far beyond what the plan serves is allowed (a saturation test) but said out loud."""
    cap = predicted_requests_per_s(plan, spec, replicas)
    if cap is not None and spec.rate_per_s > OVERLOAD * cap:
        return (f"--rate {spec.rate_per_s:g} req/s is {spec.rate_per_s / cap:,.0f}× the plan's predicted "
                f"capacity ({cap:.2f} req/s): the queue grows for the whole run",)
    return ()


def adaptive_policy(req: SimRequest) -> AdaptivePolicy | None:
    if not req.adaptive or req.latency_plan is None:
        return None
    switch_s = None if req.switch_ms is None else req.switch_ms / 1e3
    return AdaptivePolicy(latency_plan=Plan.load(req.latency_plan), high_load=req.high_load,
                          low_load=req.low_load, switch_s=switch_s)


def failures(plan: Plan | PoolPlan, req: SimRequest) -> list[Failure]:
    if req.fail_at_s is None:
        return []
    # "same": a spare cell of the lost replica's plan joins after the re-plan time; "none": one fewer replica
    return [replica_loss(plan, at_s=req.fail_at_s, replica=req.fail_replica,
                         spare=req.fail_replacement == "same", replan_s=req.fail_replan_s,
                         replicas=req.replicas)]


def write_files(plan: Plan | PoolPlan, r: Run, spec: WorkloadSpec, req: SimRequest) -> tuple[str, ...]:
    """The Chrome trace and the Gantt asked for; a note when the trace window misses the run."""
    notes: tuple[str, ...] = ()
    if req.trace is not None:
        events = write_chrome_trace(req.trace, {m: pm.plan for m, pm in r.models.items()}, r.trace, r.spans)
        if trace_window(req.trace_window_s)[0] >= r.result.sim_wall_s:
            notes = (f"--trace-window-s {req.trace_window_s} starts after the simulated span "
                     f"({r.result.sim_wall_s:.3g} s): {req.trace} holds {events} events",)
    if req.gantt is not None:
        from tessera.sim.gantt import plot_run  # matplotlib is slow to import: only for a Gantt

        plot_run(plan, r, spec, req.gantt)
    return notes


def lost_notes(plan: Plan | PoolPlan, res: SimResult, spec: WorkloadSpec,
               req: SimRequest) -> tuple[tuple[str, ...], str | None]:
    """(notes, refusal) for lost requests: a note when some were lost, a refusal when all were."""
    if not res.lost:
        return (), None
    kv = max(p.kv_capacity_tokens for p in cell_plans(plan))
    stranded = req.fail_at_s is not None and req.fail_replacement == "none" and res.replicas <= 1
    why = lost_text(spec, kv, stranded)
    if res.lost == res.requests:
        return (), f"all {res.requests} requests lost: {why}" + (
            "" if stranded else "; give shorter requests or a plan with more memory for KV")
    return (f"{res.lost} of {res.requests} requests lost: {why}",), None


def lost_text(spec: WorkloadSpec, kv: int, stranded: bool) -> str:
    """Why requests were lost: a failure left no replica to serve them (``stranded``), or they exceed the
    KV capacity (tokens per cell)."""
    if stranded:
        return ("the failure left no replica to serve them (--fail-replacement same adds a spare cell, "
                "--replicas more copies)")
    return (f"prompt + output ({spec.prompt} + {spec.output} tokens) exceed the plan's KV capacity of {kv:,} "
            "tokens per cell")
