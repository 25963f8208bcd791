"""One cell's search, shared by Tessera and every baseline: the model's shapes (one capture, rescaled),
a strategy's best operating point under memory and SLO (serving.search), and the Plan file the
simulator and the runtime read."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import Objective
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
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.config import PlannerConfig, StrategyResult
from tessera.plan.model.serving import (
    IterShape,
    Point,
    Searched,
    SearchSpace,
    Traffic,
    batch_ceiling,
    chunk_shape,
    group_sizes,
    image_shape,
    search,
    steady_shape,
    sync_period_s,
)
from tessera.plan.model.shapes import iteration_graph
from tessera.plan.pool import Pool
from tessera.plan.solver.bound import async_bound
from tessera.plan.solver.verify import RESIDENT_ROLES, evaluate_cached


class Shapes:
    """The model's one capture per phase kind and its rescaled micro-batch graphs (cached)."""

    def __init__(self, model: str, source, cfg: PlannerConfig, images: bool) -> None:
        self.model, self.cfg, self.images = model, cfg, images
        r = cfg.ref_batch if not images else 1
        self.base = source("denoise" if images else "decode", r, 0, 16)
        self.encoder = vision_tower(model, source, cfg.traffic.image_tokens) if not images else None
        self._cache: dict[IterShape, KernelGraph] = {}

    def shape(self, batch: int, m: int) -> IterShape:
        return image_shape(batch, m) if self.images else steady_shape(batch, m, self.cfg.traffic)

    def graph(self, batch: int, m: int) -> KernelGraph:
        return self.at(self.shape(batch, m))

    def at(self, shape: IterShape) -> KernelGraph:
        if shape not in self._cache:
            self._cache[shape] = iteration_graph(self.base, shape, self.encoder)
        return self._cache[shape]


def vision_tower(model: str, source, image_tokens: int) -> KernelGraph | None:
    """A VLM's vision tower on one image of ``image_tokens`` LM tokens (an encode capture), or None when the
    prompts hold no image; a UserError when the model has no vision tower."""
    if not image_tokens:
        return None
    from tessera.capture import image_patches

    return source("encode", 1, image_patches(model, image_tokens), 0)


def model_kind(model: str) -> tuple[bool, bool]:
    """(image model, has a prefill/decode split)."""
    from tessera.capture import model_phases

    phases = model_phases(model)
    images = "denoise" in phases
    return images, ("prefill" in phases and "decode" in phases)


def best_of(results: list[StrategyResult]) -> StrategyResult:
    """The feasible result with the most goodput; else the first applicable one (its reason explains)."""
    ok = [r for r in results if r.feasible]
    if ok:
        return max(ok, key=lambda r: r.goodput)
    return next((r for r in results if r.applicable), results[0])


def strategy_space(placer, shapes: Shapes, cell: Pool, cost: KernelCosts, cfg: PlannerConfig, *,
                   floor: Callable[[KernelGraph, int, int], float] | None = None) -> SearchSpace:
    """What a strategy's search over one cell is given (serving.search)."""
    return SearchSpace(graph_at=shapes.graph, placer=placer, at=shapes.at, units=cell.gpus, link=cell.link,
                       cost=cost, traffic=cfg.traffic, slo=cfg.slo, budgets=cfg.budgets, floor=floor,
                       ceiling=batch_ceiling(shapes.base, cell.gpus, cfg.traffic, shapes.images, cfg.batch_cap))


def cell_strategy(name: str, placer, shapes: Shapes, cell: Pool, cost: KernelCosts, cfg: PlannerConfig, *,
                  bound: bool = False, floor: Callable[[KernelGraph, int, int], float] | None = None,
                  parts: list[Searched] | None = None) -> StrategyResult:
    """``floor(graph, batch, m)``: a lower bound on the period of any placement there that fits memory
    (bound.period_floor), letting the search skip points it already decides. ``parts``: the search's
    answer per micro-batch count of cfg.microbatches (serving.search_m), found elsewhere."""
    units = cell.gpus
    best, fit = search(strategy_space(placer, shapes, cell, cost, cfg, floor=floor), cfg.microbatches, parts)
    if best is None:
        reason = fit.reason if fit is not None else "no placement fits memory at any batch"
        return StrategyResult(name=name, applicable=True, reason=reason, usd_per_hour=cell.usd_per_hour,
                              tp=(1,) * len(units), point=fit)
    bound_ratio = None
    if bound:
        b = async_bound(shapes.graph(best.batch, best.microbatches), cell, cost, best.microbatches)
        bound_ratio = min(1.0, b / best.period_s) if b and math.isfinite(b) else None
    plan = make_plan(name, best, shapes, units, cell.link, cost, cfg, bound_ratio=bound_ratio)
    return StrategyResult(name=name, applicable=True, plan=plan, point=best, goodput=best.goodput,
                          usd_per_hour=cell.usd_per_hour, tp=(1,) * len(units), chosen="milp" if bound else None)


def make_plan(strategy: str, p: Point, shapes: Shapes, units: tuple[GpuSpec, ...], lk: LinkSpec,
              cost: KernelCosts, cfg: PlannerConfig, *, bound_ratio: float | None = None,
              replicas: int = 1) -> Plan:
    """A Plan for the simulator, the runtime and the report: the placement, the engine settings, step
    points over a full grid of one micro-batch's iteration shapes (step_points) and the route."""
    t = cfg.traffic
    phase = "denoise" if shapes.images else "mixed"
    m = p.microbatches
    g = shapes.graph(p.batch, m)  # the operating point's placement shape
    usd = sum(u.usd_per_hour for u in units) * replicas
    thr = p.throughput * replicas
    frac = tuple(min(1.0, m * b / p.period_s) for b in p.evaluation.device_busy_s)
    sync_s = sync_period_s(g, p, units, lk, cost)
    engine = EngineSettings(max_num_seqs=p.batch, max_num_batched_tokens=p.budget or p.batch, microbatches=m)
    return Plan(
        model=shapes.model, strategy=strategy, mode=Objective.THROUGHPUT,
        devices=tuple(Device(index=i, gpu=u.name, mem_bytes=u.mem_bytes) for i, u in enumerate(units)),
        link=lk.name, replicas=replicas,
        phases={phase: PhasePlan(phase=phase, assignment=p.assignment, microbatches=m,
                                 points=step_points(p, shapes, units, lk, cost, t),
                                 graph_shape=dict(shapes.base.shape),
                                 route=route(g, p.assignment, units, lk, cost))},
        memory_bytes=p.memory_bytes, kv_bytes_per_token=kv_bytes_per_token(shapes),
        kv_capacity_tokens=kv_capacity(shapes, p, units),
        throughput_tokens_per_s=None if shapes.images else thr,
        throughput_images_per_s=thr if shapes.images else None,
        latency_s=p.period_s, usd_per_hour=usd, usd_per_million_tokens=usd / 3600 / thr * 1e6 if thr else None,
        bound_ratio=bound_ratio,
        workload=PlanWorkload(batch=p.batch, prompt=t.prompt, output=t.output, steps=t.steps,
                              image_tokens=t.image_tokens),
        batch=p.batch, microbatches=m, tpot_s=p.tpot_s, ttft_s=p.ttft_s,
        sync_throughput=thr * p.period_s / sync_s, engine=engine, goodput_per_s=p.goodput * replicas,
        device_busy=frac, slo=PlanSlo.of(cfg.slo),
        notes=(f"batch {p.batch}, {m} micro-batch{'es' if m > 1 else ''}"
               + (f", {p.budget} tokens per iteration" if p.budget else ""),))


def step_points(p: Point, shapes: Shapes, units: tuple[GpuSpec, ...], lk: LinkSpec, cost: KernelCosts,
                t: Traffic) -> tuple[StepPoint, ...]:
    """Token models: one micro-batch's iteration on a full grid of decode sequences n ∈ {1, ½, all of a
    group's}, chunk tokens {0, ½K, and K − n for each n} and contexts {P, P + O} (the simulator interpolates
    in all three). Each n's full iteration, n decodes and a K − n chunk, is a grid point: kernel costs are
    not linear in tokens (tile and wave steps), and the engine runs full iterations while prefill is
    queued. Image models: whole steps with every micro-batch at 1, ½ and all of its images."""
    m = p.microbatches
    sizes = group_sizes(-(-p.batch // m))
    chunks = sorted({0, -(-p.budget // 2), *(max(0, p.budget - n) for n in sizes)})
    out = []
    if shapes.images:  # every group at 1, ½ and all of its images (what the knee samples), labelled with
        # the images the step then holds, n·m: a batch that does not divide by m is interpolated between
        for n in sizes:
            b = n * m
            ev = evaluate_cached(shapes.graph(b, m), p.assignment, units, lk, cost)
            out.append(StepPoint(batch=b, tokens=b, context=0, microbatches=m, device_busy_s=ev.device_busy_s,
                                 link_busy_s=ev.link_tuple(), latency_s=ev.latency_s,
                                 step_s=max(m * ev.bottleneck_s, ev.latency_s)))
        return tuple(out)
    for n in sizes:
        for chunk in chunks:
            for ctx in (t.prompt, t.prompt + t.output):
                sh = replace(chunk_shape(n, chunk, t, p.batch, m), context=ctx)
                g = shapes.at(sh)
                # a VLM's shape without a chunk has no vision tower, whose kernels come first in the graph
                ev = evaluate_cached(g, p.assignment[len(p.assignment) - len(g.kernels):], units, lk, cost,
                                     memory=False)
                out.append(StepPoint(batch=n, tokens=n + chunk, context=ctx, microbatches=m,
                                     device_busy_s=ev.device_busy_s, link_busy_s=ev.link_tuple(),
                                     latency_s=ev.latency_s, step_s=max(m * ev.bottleneck_s, ev.latency_s)))
    return tuple(out)


def route(g: KernelGraph, a: tuple[int, ...], units: tuple[GpuSpec, ...], lk: LinkSpec,
          cost: KernelCosts) -> tuple[Segment, ...]:
    """One micro-batch's path through the placement in program order: runs of kernels on one device and the
    values crossing a link between them, each with its share of that device's (link's) busy seconds. A
    value crosses once per (producer, destination device), as the verifier counts it."""
    segs: list[list] = []  # [device, to, seconds]
    writer: dict[int, int] = {}
    sent: set[tuple[int, int, int]] = set()

    def add(dev: int, to: int | None, sec: float) -> None:
        if segs and segs[-1][0] == dev and segs[-1][1] == to:
            segs[-1][2] += sec
        else:
            segs.append([dev, to, sec])

    for k in g.kernels:
        d = a[k.id]
        for b in k.touches:
            w = writer.get(b)
            if w is None or g.buffers[b].role in RESIDENT_ROLES or a[w] == d or (w, b, d) in sent:
                continue
            sent.add((w, b, d))
            add(a[w], d, cost.transfer_time_s(g.buffers[b].bytes, lk))
        add(d, None, cost.kernel_time_s(k, units[d]))
        for b in k.writes:
            writer[b] = k.id
    total: dict[tuple[int, int | None], float] = {}
    for dev, to, sec in segs:
        total[dev, to] = total.get((dev, to), 0.0) + sec
    return tuple(Segment(device=dev, to=to, share=sec / total[dev, to] if total[dev, to] > 0 else 0.0)
                 for dev, to, sec in segs)


def kv_bytes_per_token(shapes: Shapes) -> int:
    if shapes.images:
        return 0
    g = shapes.base
    slots = g.shape.get("batch", 1) * (g.shape.get("context", 0) + 1)
    return int(sum(b.bytes for b in g.buffers if b.role == Role.KV) // max(1, slots))


def kv_capacity(shapes: Shapes, p: Point, units: tuple[GpuSpec, ...]) -> int:
    """Tokens of KV the cell holds beside weights and activations (the simulator's admission limit)."""
    per = kv_bytes_per_token(shapes)
    if not per:
        return 0
    free = sum(u.mem_bytes - md["weight"] - md["activation"] - md.get("state", 0)
               for u, md in zip(units, p.memory_bytes, strict=True) if md["kv"] > 0 or len(units) == 1)
    return int(max(0, free) // per)
