"""Plans built by hand from closed-form step costs: for tests, benchmarks and what-if questions.

``hand_plan``: two-phase plans (prefill + decode, decode-only, denoise). ``mixed_plan``: serving-model plans
(Plan version 2: engine settings, one micro-batch's iteration on the full grid, the route).

A phase's step time is ``fixed_s + per_token_s·tokens + per_token_context_s·tokens·context`` (weights
read once per step, per-token work, attention over the context). That is bilinear in (tokens, context),
which the simulator's interpolation reproduces exactly between sampled points, so results can be worked
out by hand. Devices share each micro-batch's busy time by ``busy_share`` (the busiest has share 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.contracts.enums import Objective, Phase
from tessera.contracts.plan import (
    Device,
    EngineSettings,
    PhasePlan,
    Plan,
    PlanSlo,
    PlanWorkload,
    Segment,
    StepPoint,
)


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
            per_item = c.tokens_per_item if phase != Phase.PREFILL else max(ctx, 1)
            points.append(StepPoint(
                batch=max(1, tok // per_item), tokens=tok, context=ctx, microbatches=m,
                device_busy_s=tuple(step / m * f for f in c.busy_share), link_busy_s=(),
                latency_s=step / m, step_s=step))
    assignment = tuple(d for d, f in enumerate(c.busy_share) if f > 0)
    return PhasePlan(phase=phase, assignment=assignment, microbatches=m, points=tuple(points))


def hand_plan(*, phases: dict[str, PhaseCost], gpus: Sequence[str] = ("H100-SXM",), mem_bytes: int = 80 * 10**9,
              kv_capacity_tokens: int = 1_000_000, kv_bytes_per_token: int = 131072, usd_per_hour: float = 1.0,
              mode: Objective = Objective.THROUGHPUT, strategy: str = "tessera", replicas: int = 1,
              weight_bytes: int = 16 * 10**9, predict_context: float = 0.0, model: str = "hand") -> Plan:
    """A Plan whose steady-state prediction is the planner's: max decode batch / step_s at that batch."""
    pp = {n: phase_plan(n, c) for n, c in phases.items()}
    it = next((n for n in (Phase.DECODE, Phase.DENOISE) if n in phases), None)
    tput = img = None
    if it is not None:
        c = phases[it]
        b = max(c.tokens)
        step = c.step_s(b, predict_context)
        rate = b / c.tokens_per_item / step * replicas if step > 0 else None
        tput, img = (rate, None) if it == Phase.DECODE else (None, rate)
    kv_each = kv_capacity_tokens * kv_bytes_per_token // max(1, len(gpus))
    return Plan(model=model, strategy=strategy, mode=mode, link="pcie4",
                devices=tuple(Device(index=i, gpu=g, mem_bytes=mem_bytes) for i, g in enumerate(gpus)),
                replicas=replicas, phases=pp,
                memory_bytes=tuple({"weight": weight_bytes // len(gpus), "kv": kv_each, "activation": 10**9}
                                   for _ in gpus),
                kv_bytes_per_token=kv_bytes_per_token if it == Phase.DECODE else 0,
                kv_capacity_tokens=kv_capacity_tokens if it == Phase.DECODE else 0,
                throughput_tokens_per_s=tput, throughput_images_per_s=img, usd_per_hour=usd_per_hour)


@dataclass(frozen=True, kw_only=True)
class StretchCost:
    """One stretch of a mixed plan's route: kernels on ``device`` (``to`` None), or the values crossing the
    link ``device`` → ``to``. Its seconds in one micro-batch's iteration of n decode sequences and c chunk
    tokens at mean decode context x: ``fixed_s + per_decode_s·n + per_chunk_token_s·c +
    per_decode_context_s·n·x``, linear in each of n, c and x, which the mixed grid's interpolation reproduces
    exactly between samples."""

    device: int
    to: int | None = None
    fixed_s: float = 0.0
    per_decode_s: float = 0.0
    per_chunk_token_s: float = 0.0
    per_decode_context_s: float = 0.0

    def seconds(self, decode: float, chunk: float, context: float) -> float:
        return (self.fixed_s + self.per_decode_s * decode + self.per_chunk_token_s * chunk
                + self.per_decode_context_s * decode * context)


def mixed_plan(*, route: Sequence[StretchCost], engine: EngineSettings, prompt: int = 512, output: int = 128,
               gpus: Sequence[str] = ("H100-SXM",), extra_latency_s: float = 0.0,
               batches: Sequence[int] | None = None, chunks: Sequence[int] | None = None,
               contexts: Sequence[int] | None = None, write_route: bool = True,
               kv_capacity_tokens: int = 1_000_000, kv_bytes_per_token: int = 131072,
               usd_per_hour: float = 1.0,
               slo: PlanSlo | None = None, goodput_per_s: float | None = None,
               throughput_tokens_per_s: float | None = None, replicas: int = 1, model: str = "hand",
               strategy: str = "tessera") -> Plan:
    """A serving-model plan (a "mixed" phase, Plan version 2) whose micro-batch iteration walks ``route`` in
    order, each stretch costing its closed form; a point's latency is the stretches' seconds in sequence plus
    ``extra_latency_s``. Points on the contract's full grid unless given: decode sequences {1, ⌈b/2⌉, b} (b
    the engine's group_seqs), chunk tokens {0, ⌈K/2⌉, K} (K its token budget), contexts {P, P + O}. The
    route's shares are each stretch's part of its resource at the grid's largest point; ``write_route`` False
    leaves the route empty (the simulator's fallback: one stage per device in order)."""
    b, k = engine.group_seqs, engine.max_num_batched_tokens
    batches = sorted(set(batches or (1, -(-b // 2), b)))
    chunks = sorted(set(chunks or (0, -(-k // 2), k)))
    contexts = sorted(set(contexts or (prompt, prompt + output)))
    m, ndev = engine.microbatches, len(gpus)
    points = [_mixed_point(route, ndev, m, n, c, x, extra_latency_s)
              for n in batches for c in chunks for x in contexts]
    ref = (batches[-1], chunks[-1], contexts[-1])
    per = {}
    for s in route:
        per[(s.device, s.to)] = per.get((s.device, s.to), 0.0) + s.seconds(*ref)
    segs = tuple(Segment(device=s.device, to=s.to, share=s.seconds(*ref) / per[(s.device, s.to)]
                         if per[(s.device, s.to)] > 0 else 0.0) for s in route)
    assignment = tuple(dict.fromkeys(s.device for s in route if s.to is None))
    phase = PhasePlan(phase="mixed", assignment=assignment, microbatches=m, points=tuple(points),
                      route=segs if write_route else ())
    if throughput_tokens_per_s is None:  # m groups of b decodes, max(m·T, L) apart at the mean context
        p = _mixed_point(route, ndev, m, b, 0, prompt + output // 2, extra_latency_s)
        throughput_tokens_per_s = replicas * min(engine.max_num_seqs, m * b) / p.step_s
    kv_each = kv_capacity_tokens * kv_bytes_per_token // ndev
    return Plan(model=model, strategy=strategy, mode=Objective.THROUGHPUT, link="pcie4",
                devices=tuple(Device(index=i, gpu=g, mem_bytes=80 * 10**9) for i, g in enumerate(gpus)),
                replicas=replicas, phases={"mixed": phase},
                memory_bytes=tuple({"weight": 16 * 10**9 // ndev, "kv": kv_each, "activation": 10**9}
                                   for _ in gpus),
                kv_bytes_per_token=kv_bytes_per_token, kv_capacity_tokens=kv_capacity_tokens,
                throughput_tokens_per_s=throughput_tokens_per_s, usd_per_hour=usd_per_hour,
                workload=PlanWorkload(prompt=prompt, output=output), engine=engine, microbatches=m,
                slo=slo or PlanSlo(), goodput_per_s=goodput_per_s)


def _mixed_point(route: Sequence[StretchCost], ndev: int, m: int, n: int, c: int, x: int,
                 extra_latency_s: float) -> StepPoint:
    dev = [0.0] * ndev
    links: dict[tuple[int, int], float] = {}
    for s in route:
        sec = s.seconds(n, c, x)
        if s.to is None:
            dev[s.device] += sec
        else:
            links[(s.device, s.to)] = links.get((s.device, s.to), 0.0) + sec
    lat = sum(s.seconds(n, c, x) for s in route) + extra_latency_s
    top = max([*dev, *links.values()])
    return StepPoint(batch=n, tokens=n + c, context=x, microbatches=m, device_busy_s=tuple(dev),
                     link_busy_s=tuple((a, b, sec) for (a, b), sec in sorted(links.items())), latency_s=lat,
                     step_s=max(m * top, lat))
