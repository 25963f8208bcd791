"""Plans built by hand from closed-form step costs: for tests, benchmarks and what-if questions.

A phase's step time is ``fixed_s + per_token_s·tokens + per_token_context_s·tokens·context`` (weights
read once per step, per-token work, attention over the context). That is bilinear in (tokens, context),
which the simulator's interpolation reproduces exactly between sampled points, so results can be worked
out by hand. Devices share each micro-batch's busy time by ``busy_share`` (the busiest has share 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.plan.types import Device, PhasePlan, Plan, StepPoint


@dataclass(frozen=True, kw_only=True)
class PhaseCost:
    fixed_s: float
    per_token_s: float
    per_token_context_s: float = 0.0
    tokens: Sequence[int] = (1, 64, 128)  # sampled token counts
    contexts: Sequence[int] = (0,)  # sampled contexts
    busy_share: Sequence[float] = (1.0,)  # per device of the plan; 0 = device not used by the phase
    microbatches: int = 1
    tokens_per_item: int = 1  # decode: 1 token per sequence; prefill: prompt length = context

    def step_s(self, tokens: float, context: float) -> float:
        return self.fixed_s + self.per_token_s * tokens + self.per_token_context_s * tokens * context


def phase_plan(phase: str, c: PhaseCost) -> PhasePlan:
    points = []
    m = c.microbatches
    for ctx in c.contexts:
        for tok in c.tokens:
            step = c.step_s(tok, ctx)
            per_item = c.tokens_per_item if phase != "prefill" else max(ctx, 1)
            points.append(StepPoint(
                batch=max(1, tok // per_item), tokens=tok, context=ctx, microbatches=m,
                device_busy_s=tuple(step / m * f for f in c.busy_share), link_busy_s=(),
                latency_s=step / m, step_s=step))
    assignment = tuple(d for d, f in enumerate(c.busy_share) if f > 0)
    return PhasePlan(phase=phase, assignment=assignment, microbatches=m, points=tuple(points))


def hand_plan(*, phases: dict[str, PhaseCost], gpus: Sequence[str] = ("H100-SXM",), mem_bytes: int = 80 * 10**9,
              kv_capacity_tokens: int = 1_000_000, kv_bytes_per_token: int = 131072, usd_per_hour: float = 1.0,
              mode: str = "throughput", strategy: str = "tessera", replicas: int = 1,
              weight_bytes: int = 16 * 10**9, predict_context: float = 0.0, model: str = "hand") -> Plan:
    """A Plan whose steady-state prediction is the planner's: max decode batch / step_s at that batch."""
    pp = {n: phase_plan(n, c) for n, c in phases.items()}
    it = next((n for n in ("decode", "denoise") if n in phases), None)
    tput = img = None
    if it is not None:
        c = phases[it]
        b = max(c.tokens)
        step = c.step_s(b, predict_context)
        rate = b / c.tokens_per_item / step * replicas if step > 0 else None
        tput, img = (rate, None) if it == "decode" else (None, rate)
    kv_each = kv_capacity_tokens * kv_bytes_per_token // max(1, len(gpus))
    return Plan(model=model, strategy=strategy, mode=mode, link="pcie4",
                devices=tuple(Device(index=i, gpu=g, mem_bytes=mem_bytes) for i, g in enumerate(gpus)),
                replicas=replicas, phases=pp,
                memory_bytes=tuple({"weight": weight_bytes // len(gpus), "kv": kv_each, "activation": 10**9}
                                   for _ in gpus),
                kv_bytes_per_token=kv_bytes_per_token if it == "decode" else 0,
                kv_capacity_tokens=kv_capacity_tokens if it == "decode" else 0,
                throughput_tokens_per_s=tput, throughput_images_per_s=img, usd_per_hour=usd_per_hour)
