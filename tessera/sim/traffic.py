"""What a plan says about its own traffic: request lengths, SLO and goodput, the defaults of `tessera
simulate` and of the SLO knee (a PoolPlan: its first cell's traffic and SLO, the sum of its cells'
goodput)."""

from __future__ import annotations

from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.slo import LatencyTargets
from tessera.sim.workload import LengthSpec, traces

DEFAULT_PROMPT, DEFAULT_OUTPUT = 512, 128  # tokens, for a plan that names no traffic


def _lead(plan: Plan | PoolPlan) -> Plan:
    return plan.lead if isinstance(plan, PoolPlan) else plan


def images(plan: Plan | PoolPlan) -> bool:
    return plan.images if isinstance(plan, PoolPlan) else plan.throughput_images_per_s is not None or \
        "denoise" in plan.phases


def plan_lengths(plan: Plan | PoolPlan) -> tuple[LengthSpec, LengthSpec]:
    """(prompt, output) the plan was made for: ``workload["prompt"]`` and ``["output"]`` (an image plan's
    output is its denoising ``["steps"]``); 512 and 128 tokens where the plan names none."""
    w = _lead(plan).workload
    out_key = "steps" if images(plan) else "output"

    def spec(key: str, default: int) -> LengthSpec:
        v = w.get(key)
        n = round(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1 else default
        return LengthSpec(lo=n, hi=n)

    return spec("prompt", DEFAULT_PROMPT), spec(out_key, DEFAULT_OUTPUT)


def plan_slo(plan: Plan | PoolPlan) -> LatencyTargets | None:
    """The SLO the plan was made under (``Plan.slo``): TTFT and TPOT, or an image plan's latency per image;
    None where it names none."""
    s = _lead(plan).slo

    def pos(key: str) -> float | None:
        v = s.get(key)
        return float(v) if isinstance(v, int | float) and v > 0 else None

    slo = (LatencyTargets(e2e_s=pos("image_s")) if images(plan)
           else LatencyTargets(ttft_s=pos("ttft_s"), tpot_s=pos("tpot_s")))
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
