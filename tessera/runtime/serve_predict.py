"""What the planner's serving model and tessera.sim predict for a serving run, from kernel times.

Inputs: every program's kernel times (a ``KernelTimes``: either the CPU profile, timed in one process, 1
thread, the workers' dispatch path, median per kernel; or the same run's own kernel events, see
``serve_calibrate``), each program's partition, and the gloo link. Per program (one request's step):
per-device busy seconds (kernel times plus what the worker spends around them, each transfer's CPU cost
charged to both ends) and its latency through the placement (tessera.plan's pipelined schedule of one
request, step_costs).

A request holds its slot for S = chunks + O − 1 steps (its prompt's chunks, then a decode per further
token) and runs one step per iteration of its group. With every slot busy, a group of n = B/m slots costs
each device n·b̄ per iteration (b̄: the mean busy time of a step over all steps of all requests); T = the
busiest device's; latency L = a step's mean latency + (T − its bottleneck)·f/its bottleneck, f what each
further request adds to the group's latency (the others follow the first through the pipeline: f = the
bottleneck for a two-stage chain, otherwise what the workers' policy makes of the placement; tessera.plan's
pipelined schedule of the group's n requests) + the driver's control round trip (outputs back, next inputs
out). The serving model
(tessera.plan.serving): m groups in flight, period = max(m·T, L) = TPOT, or where the run measured how
much its steps vary, the expectation of that max (iteration_s); throughput = B·(ΣO/ΣS)/period.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tessera.hardware import gpu
from tessera.plan.serving import expected_period_s
from tessera.plan.types import Device, EngineSettings, PhasePlan, Plan, StepPoint
from tessera.plan.verify import evaluate, pipelined_latency_s
from tessera.runtime.measure import LinkModel, ProfileCost, charged_kernel_s
from tessera.runtime.partition import Partition
from tessera.runtime.program import Program
from tessera.runtime.serving import Request
from tessera.runtime.steps import LocalExecutor
from tessera.sim.model import SchedulerConfig
from tessera.sim.workload import WorkloadSpec


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """One request's step under the placement: seconds per device and first kernel to last."""

    busy_s: tuple[float, ...]
    latency_s: float
    # what each further request of a group adds to its latency; None: bottleneck_s (a two-stage chain)
    follow_s: float | None = None

    @property
    def bottleneck_s(self) -> float:
        return max(self.busy_s)

    def group_latency_s(self, load_s: float) -> float:
        """Latency of a group whose requests load the busiest device ``load_s`` seconds in all: one
        request's latency, then ``follow_s`` per further bottleneck's worth. A two-stage chain adds its
        bottleneck per request (follow = bottleneck); a placement that crosses between workers several
        times per step may add less (a request computes while another's data travels) or more (one
        request's run of kernels holds up another's)."""
        rate = 1.0 if self.follow_s is None or self.bottleneck_s <= 0 else self.follow_s / self.bottleneck_s
        return self.latency_s + (load_s - self.bottleneck_s) * rate


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """What an iteration pays outside the kernels' step costs, and how much it varies: the control round
    trip (driver -> workers -> driver, outside the workers' steps); per device, the gap between two queued
    steps (see iteration_s); the iteration-to-iteration spread (a standard deviation without rare stalls)
    of each device's busy time per step of a group and of the control round trip. Seconds; zeros where not
    measured (the single-process profile)."""

    control_s: float = 0.0
    gap_s: tuple[float, ...] = ()
    step_sd_s: tuple[float, ...] = ()
    control_sd_s: float = 0.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) and x >= 0 for x in (self.control_s, self.control_sd_s, *self.gap_s,
                                                         *self.step_sd_s)):
            raise ValueError(f"overheads must be finite and >= 0: control_s={self.control_s}, gap_s={self.gap_s}, "
                             f"step_sd_s={self.step_sd_s}, control_sd_s={self.control_sd_s}")


@dataclass(frozen=True, kw_only=True)
class KernelTimes:
    """Where a prediction's kernel times come from: per program key, seconds per kernel (op); per program,
    the fixed cost of one micro-batch's step (storage set-up, outputs), charged to each device's first
    kernel; per device, seconds the worker spends per kernel outside it (dispatch), added to each kernel;
    what each iteration pays outside the steps (``Overheads``); the link's latency where the run measured
    it."""

    kernel_s: dict[str, list[float]] = field(hash=False)
    setup_s: dict[str, float] = field(default_factory=dict, hash=False)
    dispatch_s: tuple[float, ...] = ()
    overheads: Overheads = Overheads()
    link_latency_s: float | None = None  # a transfer's latency seen in the run; None: the start-up probe's
    source: str = "profile"

    def __post_init__(self) -> None:
        if any(d < 0 for d in self.dispatch_s):
            raise ValueError(f"negative dispatch times: {self.dispatch_s}")
        if self.link_latency_s is not None and not (math.isfinite(self.link_latency_s) and self.link_latency_s >= 0):
            raise ValueError(f"link latency {self.link_latency_s!r} s must be a finite number >= 0")


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


def profiled_times(local: LocalExecutor) -> KernelTimes:
    """The single-process profile: median per kernel, median set-up per step."""
    med = statistics.median
    return KernelTimes(kernel_s={k: [med(v) if v else 0.0 for v in ks] for k, ks in local.kernel_s.items()},
                       setup_s={k: med(v) if v else 0.0 for k, v in local.overhead_s.items()})


def step_costs(programs: dict[str, Program], parts: dict[tuple[str, str], Partition], plan: str,
               times: KernelTimes, link: LinkModel, group: int = 1) -> dict[str, StepCost]:
    """Per program: each device's busy seconds and the latency of one request's step; with ``group`` ≥ 2
    requests per group, also what each further one adds to the group's latency ((latency of the group − of
    one)/(group − 1)). Both latencies are tessera.plan's pipelined schedule, in which a message's latency
    does not hold its link (evaluate's list schedule holds it for the whole transfer time: on the gloo
    link, whose latency is milliseconds, the values crossing at one boundary would queue their latencies
    one behind another, which the workers' transfers do not)."""
    out = {}
    for key, prog in programs.items():
        part = parts[(key, plan)]
        ks = list(times.kernel_s[key])
        if times.dispatch_s:
            ks = [t + times.dispatch_s[part.assignment[k]] for k, t in enumerate(ks)]
        ks = charged_kernel_s(part, ks, link, times.setup_s.get(key, 0.0))
        cpus = tuple(gpu("cpu") for _ in range(part.devices))
        cost = ProfileCost(ks, link)
        on = (prog.graph, part.assignment, cpus, link.spec(), cost)
        ev = evaluate(*on)  # type: ignore[arg-type]
        one = pipelined_latency_s(*on, 1)  # type: ignore[arg-type]
        follow = None
        if group >= 2:  # what each further request of the group adds
            follow = (pipelined_latency_s(*on, group) - one) / (group - 1)  # type: ignore[arg-type]
        out[key] = StepCost(busy_s=ev.device_busy_s, latency_s=one, follow_s=follow)
    return out


def iteration_s(decode: StepCost, prefill: StepCost, n_decode: float, n_prefill: float, m: int,
                over: Overheads = Overheads()) -> float:
    """The serving model's period with m groups in flight, each iterating n_decode decode steps and
    n_prefill prefill steps (fractions: a prompt every O tokens); the control round trip adds to the
    latency.

    ``over.gap_s``: per device, the worker's time between two steps when the next is already queued (taking
    its command off the queue, handing the last outputs back). With groups queued back to back (m·T bounds
    the period) each device pays it once per iteration; when the latency bounds the period it lies inside
    the control round trip, which already counts it.

    With m ≥ 2 groups and spreads measured, the period is tessera.plan.serving.expected_period_s of the two
    terms: m·T varies as the sum of the bottleneck's m steps (σ = √m·σ_step), L as one step on every device
    plus the control round trip (σ = √(Σ_d σ_step,d² + σ_control²)); the two share the group's own step on
    the bottleneck (covariance σ_step,top²). One group waits only for itself: its period is its latency."""
    queued, lat = group_terms(decode, prefill, n_decode, n_prefill, over)
    sd = over.step_sd_s or (0.0,) * len(queued)
    if len(sd) != len(queued):
        raise ValueError(f"{len(sd)} step spreads for {len(queued)} devices: {sd}")
    if m < 2:
        return max(max(queued), lat)
    top = max(range(len(queued)), key=queued.__getitem__)
    return expected_period_s(m * queued[top], lat, math.sqrt(m) * sd[top], math.hypot(*sd, over.control_sd_s),
                             covariance=sd[top] ** 2)


def group_terms(decode: StepCost, prefill: StepCost, n_decode: float, n_prefill: float,
                over: Overheads = Overheads()) -> tuple[list[float], float]:
    """One group's iteration of n_decode decode steps and n_prefill prefill steps: per device its busy
    seconds when queued behind another group's (its steps plus the gap between queued steps, iteration_s),
    and its latency through the placement plus the control round trip."""
    busy = [n_decode * d + n_prefill * p for d, p in zip(decode.busy_s, prefill.busy_s, strict=True)]
    t = max(busy)
    queued = [b + g for b, g in zip(busy, over.gap_s or [0.0] * len(busy), strict=True)]
    lat = decode.group_latency_s(t) if n_decode else prefill.group_latency_s(t)
    return queued, lat + over.control_s


@dataclass(frozen=True, kw_only=True)
class StreamMix:
    """The stream's steps in aggregate: mean step (busy per device, latency), mean decode step, mean prompt
    (all its chunks summed), tokens per step, mean prompt and output lengths."""

    step: StepCost
    decode: StepCost
    prompt: StepCost
    tokens_per_step: float
    prompt_tokens: float
    output_tokens: float


def _sum(costs: Sequence[StepCost], n: int = 1) -> StepCost:
    """The costs summed (one request's chunks), over n (a mean); follow_s only where every cost has one."""
    follows = [c.follow_s for c in costs]
    return StepCost(busy_s=tuple(sum(c.busy_s[d] for c in costs) / n for d in range(len(costs[0].busy_s))),
                    latency_s=sum(c.latency_s for c in costs) / n,
                    follow_s=None if None in follows else sum(follows) / n)  # type: ignore[arg-type]


def _mean(costs: Sequence[StepCost]) -> StepCost:
    return _sum(costs, len(costs))


def stream_mix(costs: dict[str, StepCost], requests: Sequence[Request]) -> StreamMix:
    steps = [costs[r.key(i)] for r in requests for i in range(r.steps)]
    decodes = [costs[r.key(i)] for r in requests for i in range(r.chunks, r.steps)]
    prompts = [_sum([costs[r.key(i)] for i in range(r.chunks)]) for r in requests]
    return StreamMix(step=_mean(steps), decode=_mean(decodes or steps), prompt=_mean(prompts),
                     tokens_per_step=sum(r.output_tokens for r in requests) / len(steps),
                     prompt_tokens=statistics.mean(r.prompt.shape[1] for r in requests),
                     output_tokens=statistics.mean(r.output_tokens for r in requests))


def predicted_period_s(mix: StreamMix, slots: int, m: int, over: Overheads = Overheads()) -> float:
    """The serving model's period (TPOT) with every slot busy: m groups of B/m slots, each slot one step of
    the stream's mean mix per iteration."""
    return iteration_s(mix.step, mix.step, slots / m, 0, m, over)


def predicted_tokens_per_s(mix: StreamMix, w: WorkloadSpec, slots: int, m: int, over: Overheads = Overheads()
                           ) -> float:
    """B·(tokens per step) per period at capacity, capped by the offered load (arrival rate · mean output)
    for an open stream."""
    capacity = slots * mix.tokens_per_step / predicted_period_s(mix, slots, m, over)
    return min(capacity, w.rate_per_s * mix.output_tokens) if w.kind != "offline" else capacity


def profile_plan(model: str, mix: StreamMix, slots: int, m: int, over: Overheads = Overheads(),
                 budget_tokens: int | None = None) -> Plan:
    """A serving-model Plan (version 2: a "mixed" phase) priced by these costs, for tessera.sim. A point is
    one group's iteration of n decode steps and c prompt tokens (c/P mean prompts, all their chunks) at the
    contract's grid: n in {1, ⌈b/2⌉, b} (b = ⌈slots/m⌉), c in {0, ⌈K/2⌉, K}, context P and P + O (the mean
    prompt and output); K = ``budget_tokens``, default b·⌈P⌉ (every slot of a group taking a whole mean
    prompt). Per device its queued busy seconds, latency the group's (group_terms). Where the run measured
    how much its steps vary, the expected period over m groups (iteration_s) exceeds max(m·T, L): the excess
    goes to the term that bounds it (the bottleneck's busy seconds, or the latency), so that m groups of the
    shape settle at the expected period in the simulator too. Engine settings: ``slots`` sequences, K, m."""
    p, o = mix.prompt_tokens, mix.output_tokens
    b = -(-slots // m)
    k = budget_tokens or b * math.ceil(p)
    points = [_profile_point(mix, n, c, x, m, over) for n in sorted({1, -(-b // 2), b})
              for c in sorted({0, -(-k // 2), k}) for x in sorted({int(p), int(p + o)})]
    n_dev = len(mix.decode.busy_s)
    phase = PhasePlan(phase="mixed", assignment=tuple(range(n_dev)), microbatches=m, points=tuple(points))
    return Plan(model=model, strategy="runtime-profile", mode="throughput", link="gloo-local",
                devices=tuple(Device(index=i, gpu="cpu", mem_bytes=1 << 34) for i in range(n_dev)),
                phases={"mixed": phase}, memory_bytes=tuple({} for _ in range(n_dev)), batch=slots,
                microbatches=m, workload={"prompt": p, "output": o},
                engine=EngineSettings(max_num_seqs=slots, max_num_batched_tokens=k, microbatches=m))


def _profile_point(mix: StreamMix, n: int, c: int, context: int, m: int, over: Overheads) -> StepPoint:
    """profile_plan's point of one group: n decode steps and c prompt tokens."""
    n_pre = c / mix.prompt_tokens
    queued, lat = group_terms(mix.decode, mix.prompt, n, n_pre, over)
    period = iteration_s(mix.decode, mix.prompt, n, n_pre, m, over)
    top = max(range(len(queued)), key=queued.__getitem__)
    excess = period - max(m * queued[top], lat)  # what the steps' spread costs (0 without spreads, or m = 1)
    if m * queued[top] >= lat:
        queued[top] += excess / m
    else:
        lat += excess
    return StepPoint(batch=n, tokens=n + c, context=context, microbatches=m, device_busy_s=tuple(queued),
                     link_busy_s=(), latency_s=lat, step_s=period)


def run_scheduler(slots: int, groups: int, prefills: int, chunk_tokens: int) -> SchedulerConfig:
    """The runtime's admission and chunking in the simulator's terms: ``slots`` requests at once (decoding
    or prefilling) over ``groups`` groups; a request prefills at most ``chunk_tokens`` prompt tokens per
    iteration; each group prefills at most ``prefills`` prompts at a time (0: no limit, every slot may be in
    its prompt). The token budget of a group's iteration is then what such a group can carry at most: p
    prompts' chunks and its other slots' decodes, b − p + p·chunk (b = ⌈slots/groups⌉,
    p = min(b, prefills))."""
    b = -(-slots // groups)
    p = min(b, prefills or b)
    return SchedulerConfig(max_num_seqs=slots, max_num_batched_tokens=b - p + p * chunk_tokens,
                           microbatches=groups, chunk_tokens=chunk_tokens,
                           max_partial_prefills=prefills or None)


def simulated(plan: Plan, w: WorkloadSpec, seed: int, scheduler: SchedulerConfig, trace: str | None = None
              ) -> dict[str, object]:
    """tessera.sim serving the same workload (same seed: the same arrivals and lengths) on the plan under
    the runtime's admission (``run_scheduler``); ``trace``: write the simulator's Chrome trace there."""
    from tessera.sim.api import run
    from tessera.sim.trace import write_chrome_trace

    got = run(plan, w, seed=seed, config=scheduler, trace_window_s=(0.0, math.inf) if trace else None)
    if trace:
        write_chrome_trace(trace, {m: pm.plan for m, pm in got.models.items()}, got.trace, got.spans)
    r = got.result
    return {"throughput_tokens_per_s": r.throughput_tokens_per_s, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
            "completed": r.completed}


__all__ = ["KernelTimes", "Overheads", "StepCost", "StreamMix", "group_terms", "iteration_s",
           "predicted_period_s", "predicted_tokens_per_s",
           "profile", "profile_plan", "profiled_times", "run_scheduler", "simulated", "step_costs", "stream_mix"]
