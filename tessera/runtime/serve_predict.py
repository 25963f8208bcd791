"""What the planner's serving model and tessera.sim predict for a serving run, from CPU profiles.

Inputs: every program's kernels timed in one process (the per-request reference, 1 thread, the workers'
dispatch path; median per kernel), each program's partition, and the gloo link measured at start-up.
Per program (one request's step): per-device busy seconds (kernel times, each transfer's CPU cost charged
to both ends, the per-step set-up cost) and the latency of tessera.plan's list-schedule evaluation.

An iteration of a group holds n requests (micro-batches of one sequence each, interleaved as data
arrives): T = its busiest device's summed busy time, latency L = one request's latency + T − that
request's own bottleneck (the others follow it through the pipeline). The serving model (tessera.plan
.serving): m groups in flight, period = max(m·T, L), each running request emits one token per period.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from tessera.hardware import gpu
from tessera.plan.types import Device, PhasePlan, Plan, StepPoint
from tessera.plan.verify import evaluate
from tessera.runtime.measure import LinkModel, ProfileCost, charged_kernel_s
from tessera.runtime.partition import Partition
from tessera.runtime.program import Program
from tessera.runtime.runner import phase_of
from tessera.runtime.steps import LocalExecutor
from tessera.sim.model import SchedulerConfig
from tessera.sim.workload import WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """One request's step under the placement: seconds per device and first kernel to last."""

    busy_s: tuple[float, ...]
    latency_s: float

    @property
    def bottleneck_s(self) -> float:
        return max(self.busy_s)


def profile(local: LocalExecutor, programs: dict[str, Program], repeats: int = 5) -> None:
    """Time every program ``repeats`` more times (from its captured inputs), so that a program few
    requests ran still has a median over several samples (the reference's own runs count too)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' intra-op thread count
    try:
        for key in programs:
            for _ in range(repeats):
                local.step(key, "profile", [{}], reset=True)
    finally:
        torch.set_num_threads(saved)


def step_costs(programs: dict[str, Program], parts: dict[tuple[str, str], Partition], plan: str,
               local: LocalExecutor, link: LinkModel) -> dict[str, StepCost]:
    med = statistics.median
    out = {}
    for key, prog in programs.items():
        part = parts[(key, plan)]
        times = [med(v) if v else 0.0 for v in local.kernel_s[key]]
        setup_s = med(local.overhead_s[key]) if local.overhead_s[key] else 0.0
        ks = charged_kernel_s(part, times, link, setup_s)
        cpus = tuple(gpu("cpu") for _ in range(part.devices))
        ev = evaluate(prog.graph, part.assignment, cpus, link.spec(), ProfileCost(ks, link))  # type: ignore[arg-type]
        out[key] = StepCost(busy_s=ev.device_busy_s, latency_s=ev.latency_s)
    return out


def iteration_s(decode: StepCost, prefill: StepCost, n_decode: float, n_prefill: float, m: int) -> float:
    """The serving model's period with m groups in flight, each iterating n_decode decode steps and
    n_prefill prefill steps (fractions: a prompt every O tokens)."""
    busy = [n_decode * d + n_prefill * p for d, p in zip(decode.busy_s, prefill.busy_s, strict=True)]
    t = max(busy)
    lat = decode.latency_s + t - decode.bottleneck_s if n_decode else prefill.latency_s + t - prefill.bottleneck_s
    return max(m * t, lat)


def _nearest(costs: dict[str, StepCost], phase: str, n: float) -> StepCost:
    keys = [k for k in costs if phase_of(k) == phase]
    return costs[min(keys, key=lambda k: abs(int(k.split("@")[1]) - n))]


def _means(w: WorkloadSpec) -> tuple[float, float]:
    """Mean prompt and output lengths of the workload (LO-HI uniform; a trace: its rows' means)."""
    from tessera.sim.workload import traces

    def mean(spec: object, col: int) -> float:
        if spec.trace:  # type: ignore[attr-defined]
            return float(traces()[spec.trace][:, col].mean())  # type: ignore[attr-defined]
        return (spec.lo + spec.hi) / 2  # type: ignore[attr-defined]

    return mean(w.prompt, 0), mean(w.output, 1)


def predicted_period_s(costs: dict[str, StepCost], w: WorkloadSpec, slots: int, m: int) -> float:
    """The serving model's TPOT with every slot busy: B = slots requests in m groups of B/m, each
    request prefilling once per O tokens, at the workload's mean prompt P and mean context P + O/2."""
    p, o = _means(w)
    dec, pre = _nearest(costs, "decode", p + o / 2), _nearest(costs, "prefill", p)
    n = slots / m
    return iteration_s(dec, pre, n, n / o, m)


def predicted_tokens_per_s(costs: dict[str, StepCost], w: WorkloadSpec, slots: int, m: int) -> float:
    """B tokens per period at capacity, capped by the offered load (arrival rate · mean output) for an
    open stream."""
    capacity = slots / predicted_period_s(costs, w, slots, m)
    return min(capacity, w.rate_per_s * _means(w)[1]) if w.kind != "offline" else capacity


def profile_plan(model: str, costs: dict[str, StepCost], w: WorkloadSpec, slots: int, m: int) -> Plan:
    """A serving-model Plan ("mixed" phase) priced by these profiles, for tessera.sim: a point per token
    count t at the workload's mean context, t = decode tokens (up to B) then prompt tokens."""
    p, o = _means(w)
    dec, pre = _nearest(costs, "decode", p + o / 2), _nearest(costs, "prefill", p)
    chunk = math.ceil(slots * p / o)
    points = []
    for t in sorted({1, max(1, slots // 2), slots, slots + chunk, 2 * (slots + chunk)}):
        n_dec = min(t, slots)
        n_pre = (t - n_dec) / p
        step = iteration_s(dec, pre, n_dec / m, n_pre / m, m)
        busy = tuple((n_dec * d + n_pre * q) / m for d, q in zip(dec.busy_s, pre.busy_s, strict=True))
        points.append(StepPoint(batch=max(1, n_dec), tokens=t, context=int(p + o / 2), microbatches=m,
                                device_busy_s=busy, link_busy_s=(), latency_s=dec.latency_s, step_s=step))
    n_dev = len(dec.busy_s)
    phase = PhasePlan(phase="mixed", assignment=tuple(range(n_dev)), microbatches=m, points=tuple(points))
    return Plan(model=model, strategy="runtime-profile", mode="throughput", link="gloo-local",
                devices=tuple(Device(index=i, gpu="cpu", mem_bytes=1 << 34) for i in range(n_dev)),
                phases={"mixed": phase}, memory_bytes=tuple({} for _ in range(n_dev)), batch=slots,
                microbatches=m, workload={"prompt": p, "output": o})


def simulated(plan: Plan, w: WorkloadSpec, seed: int, trace: str | None = None) -> dict[str, object]:
    """tessera.sim serving the same workload (same seed: the same arrivals and lengths) on the plan;
    ``trace``: write the simulator's Chrome trace of the whole stream there."""
    from tessera.sim.api import run
    from tessera.sim.trace import write_chrome_trace

    got = run(plan, w, seed=seed, config=SchedulerConfig(max_batch=plan.batch),
              trace_window_s=(0.0, math.inf) if trace else None)
    if trace:
        write_chrome_trace(trace, {m: pm.plan for m, pm in got.models.items()}, got.trace)
    r = got.result
    return {"throughput_tokens_per_s": r.throughput_tokens_per_s, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
            "completed": r.completed}


__all__ = ["StepCost", "iteration_s", "predicted_period_s", "predicted_tokens_per_s", "profile", "profile_plan", "simulated", "step_costs"]
