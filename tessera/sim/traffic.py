"""What a plan says about its own traffic: request lengths, SLO and goodput, the defaults of `tessera
simulate` and of the SLO knee (a PoolPlan: its first cell's traffic and SLO, the sum of its cells'
goodput)."""

from __future__ import annotations

from dataclasses import replace

from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.provenance import Provenance, fingerprint
from tessera.contracts.slo import LatencyTargets
from tessera.sim.workload import LengthSpec, WorkloadSpec, traces

DEFAULT_PROMPT, DEFAULT_OUTPUT = 512, 128  # tokens, for a plan that names no traffic


def _lead(plan: Plan | PoolPlan) -> Plan:
    return plan.lead if isinstance(plan, PoolPlan) else plan


def images(plan: Plan | PoolPlan) -> bool:
    return plan.images if isinstance(plan, PoolPlan) else plan.throughput_images_per_s is not None or \
        "denoise" in plan.phases


def plan_lengths(plan: Plan | PoolPlan) -> tuple[LengthSpec, LengthSpec]:
    """(prompt, output) the plan was made for: ``workload.prompt`` and ``.output`` (an image plan's output is
    its denoising ``.steps``); 512 and 128 tokens where the plan names none."""
    w = _lead(plan).workload

    def spec(n: int | None, default: int) -> LengthSpec:
        n = default if n is None else n
        return LengthSpec(lo=n, hi=n)

    return spec(w.prompt, DEFAULT_PROMPT), spec(w.steps if images(plan) else w.output, DEFAULT_OUTPUT)


def plan_slo(plan: Plan | PoolPlan) -> LatencyTargets | None:
    """The SLO the plan was made under (``Plan.slo``): TTFT and TPOT, or an image plan's latency per image;
    None where it names none."""
    s = _lead(plan).slo

    def seconds(v: float | None) -> float | None:
        return None if v is None else float(v)

    slo = (LatencyTargets(e2e_s=seconds(s.image_s)) if images(plan)
           else LatencyTargets(ttft_s=seconds(s.ttft_s), tpot_s=seconds(s.tpot_s)))
    return slo if slo.given else None


def plan_goodput_per_s(plan: Plan | PoolPlan) -> float | None:
    """The planner's goodput (output tokens/s, images/s), all replicas and cells; None unless every cell has
    one."""
    cells = [(c.plan, c.count) for c in plan.cells] if isinstance(plan, PoolPlan) else [(plan, 1)]
    if any(p.goodput_per_s is None for p, _ in cells):
        return None
    return sum(n * (p.goodput_per_s or 0.0) for p, n in cells)


def plan_capacity_per_s(plan: Plan | PoolPlan) -> float | None:
    """The planner's steady-state rate before any SLO (output tokens/s, images/s), all replicas and cells."""
    if isinstance(plan, PoolPlan):
        return plan.throughput_per_s or None
    return (plan.throughput_images_per_s if images(plan) else plan.throughput_tokens_per_s) or None


def mean_tokens(spec: LengthSpec, column: int) -> float:
    """Mean of a length spec; a trace's is the mean of its rows' ``column`` (0 prompt, 1 output)."""
    if spec.trace:
        return float(traces()[spec.trace][:, column].mean())
    return (spec.lo + spec.hi) / 2


GOODPUT_SHARE = 0.9  # `tessera simulate`'s default load: this share of the plan's goodput


def cell_plans(plan: Plan | PoolPlan) -> list[Plan]:
    """The plan of each different cell (a lone Plan: itself)."""
    return [c.plan for c in plan.cells] if isinstance(plan, PoolPlan) else [plan]


def default_workload(plan: Plan | PoolPlan, kind: str | None, rate_per_s: float | None, *, requests: int,
                     prompt: LengthSpec, output: LengthSpec, replicas: int, burst: str = "gamma",
                     burst_cv: float = 3.0, on_s: float = 10.0,
                     off_s: float = 20.0) -> tuple[WorkloadSpec, str]:
    """The workload asked for, its gaps filled from the plan: a rate without a kind is poisson; neither (or
    an open kind without a rate) is poisson at GOODPUT_SHARE of the plan's goodput × replicas where it has
    one, offline otherwise. The second value says which default was taken ("" when none)."""
    note = ""
    if kind is None:
        kind = "poisson" if rate_per_s is not None else None
    if rate_per_s is None and kind != "offline":
        good = plan_goodput_per_s(plan)
        if good:
            mean_out = 1.0 if images(plan) else mean_tokens(output, 1)
            rate_per_s = GOODPUT_SHARE * good * replicas / mean_out
            kind = kind or "poisson"
            unit = "images" if images(plan) else "tokens"
            note = (f"{kind} arrivals at {GOODPUT_SHARE:.0%} of the plan's goodput "
                    f"({good * replicas:,.4g} {unit}/s): {rate_per_s:.4g} req/s")
        elif kind is None:
            kind = "offline"
    spec = WorkloadSpec(kind=kind, requests=requests, rate_per_s=rate_per_s or 0.0, prompt=prompt,
                        output=output, burst=burst, burst_cv=burst_cv, on_s=on_s, off_s=off_s)
    return spec, note


def targets_with(plan: Plan | PoolPlan, *, ttft_s: float | None = None, tpot_s: float | None = None,
                 e2e_s: float | None = None) -> LatencyTargets | None:
    """The plan's SLO, each target given replacing its own; None where no target is left."""
    given = {k: v for k, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("e2e_s", e2e_s)) if v is not None}
    slo = replace(plan_slo(plan) or LatencyTargets(), **given)
    return slo if slo.given else None


def predicted_requests_per_s(plan: Plan | PoolPlan, spec: WorkloadSpec, replicas: int) -> float | None:
    """Requests/s the plan's throughput (× replicas) serves at the workload's mean output range; None for an
    offline or traced workload, or a plan without a throughput (a pool of image cells)."""
    thr = (plan.throughput_per_s if not plan.images else None) if isinstance(plan, PoolPlan) \
        else plan.throughput_tokens_per_s
    if spec.kind == "offline" or not thr or spec.output.trace:
        return None
    return thr * replicas / ((spec.output.lo + spec.output.hi) / 2)


def offered_load(plan: Plan | PoolPlan, spec: WorkloadSpec, replicas: int) -> float | None:
    """Offered output tokens/s (images/s) over the plan's goodput × replicas; None offline, or for a plan
    without a goodput."""
    good = plan_goodput_per_s(plan)
    if spec.kind == "offline" or not good:
        return None
    per_request = 1.0 if images(plan) else mean_tokens(spec.output, 1)
    return spec.rate_per_s * per_request / (good * replicas)


def simulation_provenance(plan: Plan | PoolPlan, prompt: LengthSpec, output: LengthSpec,
                          slo: LatencyTargets | None, *, workload: str | None, rate_per_s: float | None,
                          seed: int | None, target: float | None = None) -> Provenance:
    """What a simulation of ``plan`` was run with, for the file it writes."""
    return Provenance(model=plan.model, plan=fingerprint(plan), prompt=str(prompt), output=str(output),
                      output_per_request=1.0 if images(plan) else mean_tokens(output, 1),
                      slo_ttft_s=slo.ttft_s if slo else None, slo_tpot_s=slo.tpot_s if slo else None,
                      slo_e2e_s=slo.e2e_s if slo else None, slo_target=target, workload=workload,
                      rate_per_s=rate_per_s, seed=seed)
