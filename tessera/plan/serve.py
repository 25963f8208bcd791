"""plan_serving: Tessera and every baseline for one model on one pool, each at its best operating point
under the serving model (serving.py), scored the same way. The steps, in order:

  shapes   one capture per model (a decode step at a reference batch, or an image step), rescaled to
           any micro-batch shape (shapes.iteration_graph);
  strategies  homogeneous (best tensor-parallel × replica split per GPU type), prefill/decode
           (rate-matched, DistServe), attention/FFN, layer pipeline, and the MILP (strategies.py);
  search   per strategy the batch and micro-batch count with the highest goodput under memory and SLO
           (serving.search);
  verify   every MILP answer re-scored by the independent verifier (strategies.milp);
  score    Tessera's answer is the best of its MILP plans and every baseline (each is a placement the
           MILP contains); ``chosen`` names which, so a kernel-level win is told from a tie.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.errors import UserError
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan import strategies as st
from tessera.plan.baselines import has_attention
from tessera.plan.bound import async_bound, period_floor
from tessera.plan.pool import Pool, resolve_gpu, resolve_link
from tessera.plan.problem import default_cost
from tessera.plan.serving import (
    IterShape,
    Point,
    Slo,
    Traffic,
    batch_ceiling,
    image_shape,
    score_point,
    search,
    steady_shape,
)
from tessera.plan.shapes import iteration_graph
from tessera.plan.types import Device, PhasePlan, Plan, StepPoint
from tessera.plan.units import UnitCost, make_unit

STRATEGIES = ("tessera", "homogeneous", "prefill_decode", "attention_ffn", "layer_pipeline")
MICROBATCHES = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """Everything the search is given, passed down explicitly."""

    traffic: Traffic = field(default_factory=Traffic)
    slo: Slo = field(default_factory=Slo)
    link: str = "pcie5"  # between the GPUs of the cell
    batch_cap: int | None = None  # largest batch (sequences / images in flight per cell) to consider
    microbatches: tuple[int, ...] = MICROBATCHES
    ref_batch: int = 64  # batch of the one capture every shape is rescaled from
    mip_rel_gap: float = 1e-2
    time_limit_s: float = 10.0  # per MILP solve
    max_tp: int = 8

    def __post_init__(self) -> None:
        if self.batch_cap is not None and self.batch_cap < 1:
            raise UserError(f"--batch {self.batch_cap} must be >= 1 (it caps the batch the planner chooses)")
        if not self.microbatches or any(m < 1 for m in self.microbatches):
            raise UserError(f"micro-batch counts {self.microbatches} must be positive")
        if self.ref_batch < 1:
            raise ValueError(f"ref_batch={self.ref_batch} must be >= 1")


@dataclass(frozen=True, kw_only=True)
class StrategyResult:
    name: str
    applicable: bool
    reason: str | None = None  # not applicable, nothing fits, or no point meets the SLO
    plan: Plan | None = None
    point: Point | None = None  # the cell's operating point (None for composite strategies)
    goodput: float = 0.0  # whole pool, output tokens/s (images/s) meeting the SLO
    usd_per_hour: float = 0.0
    tp: tuple[int, ...] = ()  # tensor-parallel degree of each device the strategy uses
    chosen: str | None = None  # Tessera: "milp" or the adopted baseline's name
    detail: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def feasible(self) -> bool:
        return self.goodput > 0

    @property
    def tokens_per_usd(self) -> float:
        return self.goodput * 3600 / self.usd_per_hour if self.usd_per_hour > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class ServingResult:
    model: str
    gpus: tuple[str, ...]
    link: str
    config: PlannerConfig
    images: bool
    strategies: dict[str, StrategyResult] = field(hash=False)
    solve_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tessera(self) -> StrategyResult:
        return self.strategies["tessera"]

    def to_json(self) -> dict[str, Any]:
        """The `tessera plan --json` contract."""
        from tessera.plan.report import result_json

        return result_json(self)


# ---- shapes ----------------------------------------------------------------------------------------------------


class Shapes:
    """The model's one capture per phase kind and its rescaled micro-batch graphs (cached)."""

    def __init__(self, model: str, source, cfg: PlannerConfig, images: bool) -> None:
        self.model, self.cfg, self.images = model, cfg, images
        r = cfg.ref_batch if not images else 1
        self.base = source("denoise" if images else "decode", r, 0, 16)
        self._cache: dict[IterShape, KernelGraph] = {}

    def shape(self, batch: int, m: int) -> IterShape:
        return image_shape(batch, m) if self.images else steady_shape(batch, m, self.cfg.traffic)

    def graph(self, batch: int, m: int) -> KernelGraph:
        return self.at(self.shape(batch, m))

    def at(self, shape: IterShape) -> KernelGraph:
        if shape not in self._cache:
            self._cache[shape] = iteration_graph(self.base, shape)
        return self._cache[shape]


def model_kind(model: str) -> tuple[bool, bool]:
    """(image model, has a prefill/decode split)."""
    from tessera.capture import model_phases

    phases = model_phases(model)
    images = "denoise" in phases
    return images, ("prefill" in phases and "decode" in phases)


# ---- entry point -----------------------------------------------------------------------------------------------


def plan_serving(model: str, gpus: list[str] | str, cfg: PlannerConfig | None = None, *, cost=None,
                 source=None, progress: Callable[[str], None] | None = None) -> ServingResult:
    """``progress``, when given, is called with the name of each step as it starts (tessera.progress.Steps)."""
    from tessera.plan.planner import capture_source

    cfg = cfg or PlannerConfig()
    names = [n for n in (gpus.split(",") if isinstance(gpus, str) else gpus) if n.strip()]
    if not names:
        raise UserError("the pool has no GPUs; give --gpus A,B")
    specs = tuple(resolve_gpu(n) for n in names)
    lk = resolve_link(cfg.link)
    cost = UnitCost.over(cost or default_cost())  # memoised: layers repeat kernels, the search repeats shapes
    images, pd_ok = model_kind(model)
    t0 = time.perf_counter()
    step = progress or (lambda _desc: None)
    step(f"capture {model} (decode step at batch {cfg.ref_batch})" if not images else f"capture {model}")
    shapes = Shapes(model, source or capture_source(model), cfg, images)
    _check_fits(model, shapes, specs, cfg)
    out: dict[str, StrategyResult] = {}
    step("homogeneous: TP degree and batch per GPU type")
    out["homogeneous"] = homogeneous(shapes, specs, lk, cost, cfg)
    step("prefill/decode: rate-matched pair")
    out["prefill_decode"] = (prefill_decode(shapes, specs, lk, cost, cfg) if pd_ok and len(specs) == 2 else
                             StrategyResult(name="prefill_decode", applicable=False, reason=(
                                 "no prefill/decode phases (an image model)" if not pd_ok else "needs a pair of GPUs")))
    solve_log: list[float] = []
    per_layout = []
    for units, ucost in layouts(specs, cost, cfg):
        step(f"attention/FFN, layer pipeline and the MILP on {' + '.join(u.name for u in units)}")
        per_layout.append(cell_strategies(shapes, units, ucost, lk, cfg, solve_log))
    for name in ("attention_ffn", "layer_pipeline", "milp"):
        out[name] = best_of([lay[name] for lay in per_layout])
    mil = out.pop("milp")
    out["tessera"] = adopt_best(mil, out)
    res = ServingResult(model=model, gpus=tuple(s.name for s in specs), link=lk.name, config=cfg, images=images,
                        strategies={n: out[n] for n in STRATEGIES}, solve_s=sum(solve_log),
                        wall_s=time.perf_counter() - t0)
    if not any(s.feasible for s in res.strategies.values()):
        raise UserError(no_point_message(res))
    return res


def _check_fits(model: str, shapes: Shapes, specs: tuple[GpuSpec, ...], cfg: PlannerConfig) -> None:
    need = sum(b.bytes for b in shapes.base.buffers if b.role == Role.WEIGHT)
    have = sum(s.mem_bytes for s in specs)
    if need > have:
        raise UserError(f"{model} does not fit {'+'.join(s.name for s in specs)} even with tensor parallelism: "
                        f"weights need {need / 1e9:.1f} GB, the pool has {have / 1e9:.1f} GB "
                        f"({(need - have) / 1e9:.1f} GB short)")


def no_point_message(res: ServingResult) -> str:
    why = "; ".join(f"{n}: {s.reason}" for n, s in res.strategies.items() if s.applicable and s.reason)
    c = res.config
    slo = (f"image latency ≤ {c.slo.image_s:g} s" if res.images else
           f"TTFT ≤ {c.slo.ttft_s:g} s and TPOT ≤ {c.slo.tpot_s * 1e3:g} ms")
    return f"no configuration of {res.model} on {'+'.join(res.gpus)} meets {slo}: {why}"


# ---- strategies over one cell ----------------------------------------------------------------------------------


MAX_SINGLE_UNITS = 4  # beyond this many GPUs a cell's devices are tensor-parallel groups per type only


def layouts(specs: tuple[GpuSpec, ...], cost, cfg: PlannerConfig) -> list[tuple[tuple[GpuSpec, ...], Any]]:
    """The ways a pool's GPUs form a cell's devices: every GPU its own device, and (where a type repeats)
    each type's GPUs as one tensor-parallel group (a power of two up to cfg.max_tp)."""
    out: list[tuple[tuple[GpuSpec, ...], Any]] = []
    if len(specs) <= MAX_SINGLE_UNITS:
        out.append((specs, cost))
    counts = Counter(s.name for s in specs)
    if max(counts.values()) > 1:
        by = {s.name: s for s in specs}
        if all(n & (n - 1) == 0 and n <= cfg.max_tp for n in counts.values()):
            groups = tuple((by[n], k) for n, k in counts.items())
            out.append((tuple(make_unit(g, k) for g, k in groups), UnitCost.over(cost, groups)))
    return out


def cell_strategies(shapes: Shapes, units: tuple[GpuSpec, ...], cost, lk: LinkSpec, cfg: PlannerConfig,
                    solve_log: list[float]) -> dict[str, StrategyResult]:
    """attention/FFN, layer pipeline and the MILP over one layout of the cell's devices."""
    cell = Pool(gpus=units, link=lk)
    out: dict[str, StrategyResult] = {}
    tp = tuple(cost.tp_of(u) if isinstance(cost, UnitCost) else 1 for u in units)
    pipe = st.memo(st.layer_pipeline(units, lk, cost))
    af = st.memo(st.attention_ffn(units, lk, cost))
    # one LP floor per shape, shared by the three searches: points it decides are not placed at all
    floor = st.memo(lambda g, b, m: period_floor(g, cell, cost, m)) if len(units) >= 2 else None
    if len(units) == 2 and has_attention(shapes.base):
        out["attention_ffn"] = cell_strategy("attention_ffn", af, shapes, cell, cost, cfg, floor=floor)
    else:
        out["attention_ffn"] = StrategyResult(name="attention_ffn", applicable=False, reason=(
            "needs two devices" if len(units) != 2 else "no attention kernels (e.g. a state-space model)"))
    if len(units) >= 2:
        out["layer_pipeline"] = cell_strategy("layer_pipeline", pipe, shapes, cell, cost, cfg, floor=floor)
        starts = [pipe] + ([af] if len(units) == 2 else [])
        placer = st.milp(cell, cost, starts=starts, mip_rel_gap=cfg.mip_rel_gap, time_limit_s=cfg.time_limit_s,
                         solve_log=solve_log)
        out["milp"] = cell_strategy("tessera", placer, shapes, cell, cost, cfg, bound=True, floor=floor)
    else:
        out["layer_pipeline"] = StrategyResult(name="layer_pipeline", applicable=False,
                                               reason="needs two or more devices")
        out["milp"] = StrategyResult(name="tessera", applicable=True, reason="one device: nothing to place")
    return {k: replace(v, tp=tp) if v.plan is not None else v for k, v in out.items()}


def best_of(results: list[StrategyResult]) -> StrategyResult:
    """The feasible result with the most goodput; else the first applicable one (its reason explains)."""
    ok = [r for r in results if r.feasible]
    if ok:
        return max(ok, key=lambda r: r.goodput)
    return next((r for r in results if r.applicable), results[0])


def cell_strategy(name: str, placer, shapes: Shapes, cell: Pool, cost, cfg: PlannerConfig, *,
                  bound: bool = False, floor: Callable[[KernelGraph, int, int], float] | None = None) -> StrategyResult:
    """``floor(graph, batch, m)``: a lower bound on the period of any placement there that fits memory
    (bound.period_floor), letting the search skip points it already decides."""
    units = cell.gpus
    ceiling = batch_ceiling(shapes.base, units, cfg.traffic, shapes.images, cfg.batch_cap)
    best, fit = search(shapes.graph, placer, units=units, link=cell.link, cost=cost, traffic=cfg.traffic,
                       slo=cfg.slo, ms=cfg.microbatches, ceiling=ceiling, floor=floor)
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


def homogeneous(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost, cfg: PlannerConfig) -> StrategyResult:
    """Each GPU type of the pool as vLLM users deploy it: the tensor-parallel degree (a power of two up to
    the type's count) with the most goodput, replicas = count / tp, each replica at its own best batch."""
    counts = Counter(s.name for s in specs)
    by_name = {s.name: s for s in specs}
    members: list[tuple[StrategyResult, int]] = []
    whys = []
    for name, n in counts.items():
        best_t: tuple[float, StrategyResult, int] | None = None
        for tp in (1, 2, 4, 8):
            if tp > n or n % tp or tp > cfg.max_tp:
                continue
            unit = make_unit(by_name[name], tp)
            ucost = UnitCost.over(cost, ((by_name[name], tp),))
            r = cell_strategy("homogeneous", st.uniform(0), shapes, Pool(gpus=(unit,), link=lk), ucost,
                              replace(cfg, microbatches=(1,)))
            r = replace(r, tp=(tp,))
            tot = r.goodput * (n // tp)
            if r.feasible and (best_t is None or tot > best_t[0]):
                best_t = (tot, r, n // tp)
            elif not r.feasible:
                whys.append(f"{name} TP={tp}: {r.reason}")
        if best_t is not None:
            members.append((best_t[1], best_t[2]))
    usd = sum(s.usd_per_hour for s in specs)
    if not members:
        return StrategyResult(name="homogeneous", applicable=True, usd_per_hour=usd,
                              reason="no GPU type holds a replica at any TP degree: " + "; ".join(whys))
    total = sum(r.goodput * k for r, k in members)
    members.sort(key=lambda x: -x[0].goodput)
    lead = members[0][0]
    assert lead.plan is not None

    def capacity(p: Plan) -> float:  # one replica's saturation throughput (a Plan's headline figure)
        return p.throughput_images_per_s if shapes.images else p.throughput_tokens_per_s

    plans = tuple(_times(r.plan, k, capacity(r.plan), shapes.images) for r, k in members if r.plan is not None)
    cap = sum(capacity(p) for p in plans)
    desc = ", ".join(f"{k}×{r.plan.devices[0].gpu} ({r.goodput:,.0f}/s each)" for r, k in members if r.plan)
    plan = replace(plans[0] if len(plans) == 1 else lead.plan, strategy="homogeneous",
                   members=plans if len(plans) > 1 else (), replicas=members[0][1] if len(plans) == 1 else 1,
                   usd_per_hour=usd, throughput_tokens_per_s=None if shapes.images else cap,
                   throughput_images_per_s=cap if shapes.images else None,
                   usd_per_million_tokens=usd / 3600 / cap * 1e6, notes=(f"independent replicas: {desc}",))
    tps = tuple(r.tp[0] for r, k in members for _ in range(k))
    return StrategyResult(name="homogeneous", applicable=True, plan=plan, point=lead.point, goodput=total,
                          usd_per_hour=usd, tp=tps, detail={"replicas": desc})


def _times(p: Plan, k: int, capacity: float, images: bool) -> Plan:
    """``p`` (one replica) as k identical replicas: price and capacity × k."""
    thr = capacity * k
    return replace(p, replicas=k, usd_per_hour=p.usd_per_hour * k,
                   throughput_tokens_per_s=None if images else thr, throughput_images_per_s=thr if images else None)


def prefill_decode(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost,
                   cfg: PlannerConfig) -> StrategyResult:
    """DistServe on a pair: prompts prefilled on one GPU (batches of whole prompts), decoded on the other,
    KV shipped once per request over the link; each side at its own best batch, the pair runs at the
    slower of prefill rate, decode rate and link rate (requests/s)."""
    from tessera.plan.pd import rate_matched

    return best_of([rate_matched(shapes, specs, a, b, lk, cost, cfg) for a, b in ((0, 1), (1, 0))])


def adopt_best(mil: StrategyResult, out: dict[str, StrategyResult]) -> StrategyResult:
    """Tessera's answer: the MILP's plan or, when a baseline beats it, that baseline's (its placement is one
    the MILP contains, or a replica split of the same GPUs); ``chosen`` says which."""
    best = mil
    for r in out.values():
        if r.feasible and r.goodput > best.goodput * (1 + 1e-9):
            best = r
    if best is mil:
        return replace(mil, chosen="milp", detail={**mil.detail, "idle": idle_reason(mil)})
    plan = replace(best.plan, strategy="tessera") if best.plan else None
    return replace(best, name="tessera", plan=plan, chosen=best.name,
                   detail={**best.detail, "milp_goodput": mil.goodput, "milp_reason": mil.reason})


def idle_reason(mil: StrategyResult) -> str | None:
    """Say why a device of the MILP plan does no work (never leave it silent)."""
    if mil.point is None or mil.plan is None:
        return None
    busy = mil.point.evaluation.device_busy_s
    idle = [i for i, b in enumerate(busy) if b == 0]
    if not idle:
        return None
    names = ", ".join(f"{mil.plan.devices[i].gpu} (device {i})" for i in idle)
    return (f"{names} unused: the MILP's best placement at batch {mil.point.batch}, m={mil.point.microbatches} "
            f"is faster without it (every placement using it is slower per iteration)")


# ---- the Plan file ---------------------------------------------------------------------------------------------


def make_plan(strategy: str, p: Point, shapes: Shapes, units: tuple[GpuSpec, ...], lk: LinkSpec, cost,
              cfg: PlannerConfig, *, bound_ratio: float | None = None, replicas: int = 1) -> Plan:
    """A Plan for the simulator and the report: the placement, the chosen operating point, and step points
    over point_grid on this placement."""
    from tessera.plan.verify import evaluate_cached

    t = cfg.traffic
    phase = "denoise" if shapes.images else "mixed"
    m = p.microbatches
    pts = []
    for b, chunk, ctx in point_grid(p, t, shapes.images):
        if shapes.images:
            sh = shapes.shape(b, m)
        else:  # b decode sequences and a chunk of `chunk` prompt tokens over the whole step, split m ways
            full = shapes.shape(b, m)
            c = math.ceil(chunk / m)
            sh = replace(full, context=ctx, chunk=c, chunk_len=min(c, t.prompt),
                         prefix=max(0, (t.prompt - c) // 2) if c < t.prompt else 0)
        ev = evaluate_cached(shapes.at(sh), p.assignment, units, lk, cost)
        pts.append(StepPoint(batch=b, tokens=b if shapes.images else b + chunk, context=ctx, microbatches=m,
                             device_busy_s=ev.device_busy_s, link_busy_s=ev.link_tuple(),
                             latency_s=ev.latency_s, step_s=max(m * ev.bottleneck_s, ev.latency_s)))
    usd = sum(u.usd_per_hour for u in units) * replicas
    thr = p.throughput * replicas
    busy = p.evaluation.device_busy_s
    frac = tuple(min(1.0, p.microbatches * b / p.period_s) for b in busy)
    return Plan(
        model=shapes.model, strategy=strategy, mode="throughput",
        devices=tuple(Device(index=i, gpu=u.name, mem_bytes=u.mem_bytes) for i, u in enumerate(units)),
        link=lk.name, replicas=replicas,
        phases={phase: PhasePlan(phase=phase, assignment=p.assignment, microbatches=p.microbatches,
                                 points=tuple(pts), graph_shape=dict(shapes.base.shape))},
        memory_bytes=p.memory_bytes, kv_bytes_per_token=kv_bytes_per_token(shapes),
        kv_capacity_tokens=kv_capacity(shapes, p, units),
        throughput_tokens_per_s=None if shapes.images else thr,
        throughput_images_per_s=thr if shapes.images else None,
        latency_s=p.period_s, usd_per_hour=usd, usd_per_million_tokens=usd / 3600 / thr * 1e6 if thr else None,
        bound_ratio=bound_ratio,
        workload={"batch": p.batch, "prompt": t.prompt, "output": t.output, "steps": t.steps},
        batch=p.batch, microbatches=p.microbatches, tpot_s=p.tpot_s, ttft_s=p.ttft_s,
        sync_throughput=(p.throughput * p.period_s / p.sync_period_s) * replicas,
        device_busy=frac, slo={"ttft_s": cfg.slo.ttft_s, "tpot_s": cfg.slo.tpot_s, "image_s": cfg.slo.image_s},
        notes=(f"batch {p.batch}, {p.microbatches} micro-batch{'es' if p.microbatches > 1 else ''}",))


def point_grid(p: Point, t: Traffic, images: bool) -> list[tuple[int, int, int]]:
    """(batch, chunk tokens, context) of the step points a Plan carries, whole step: batches ¼, ½ and 1 of
    the operating point's; for token models also chunks 0, ½ and 1 of its steady chunk C = B·P/O and
    contexts P and P + O, a full grid (the simulator interpolates in all three)."""
    m = p.microbatches
    batches = sorted({max(m, p.batch // 4), max(m, p.batch // 2), p.batch})
    if images:
        return [(b, 0, 0) for b in batches]
    c = math.ceil(p.batch * t.prompt / t.output)
    chunks = sorted({0, max(m, c // 2), c})
    return [(b, ch, ctx) for b in batches for ch in chunks for ctx in (t.prompt, t.prompt + t.output)]


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


__all__ = ["STRATEGIES", "PlannerConfig", "ServingResult", "StrategyResult", "plan_serving"]


def latency_variant(res: ServingResult, name: str = "tessera", *, cost=None, source=None) -> Plan | None:
    """The latency-oriented schedule of strategy ``name``'s plan for the online switch: the same placement
    (so no weight moves and one paged KV pool serves both), one micro-batch, a quarter of the batch: lower
    TPOT and TTFT, less throughput. None when the strategy has no single-cell plan."""
    from tessera.plan.planner import capture_source
    from tessera.plan.pool import resolve_gpu, resolve_link

    s = res.strategies[name]
    if s.plan is None or s.point is None or s.plan.members or len(s.plan.phases) != 1:
        return None
    cfg = res.config
    shapes = Shapes(res.model, source or capture_source(res.model), cfg, res.images)
    try:
        units = tuple(resolve_gpu(d.gpu) for d in s.plan.devices)
    except UserError:  # a TP group ("2xH100-SXM") is not a catalog name: no single-GPU latency variant
        return None
    lk = resolve_link(res.link)
    cost = cost or default_cost()
    b = max(1, s.point.batch // 4)
    g = shapes.graph(b, 1)
    p = score_point(g, s.point.assignment, batch=b, m=1, units=units, link=lk, cost=cost, traffic=cfg.traffic,
                    slo=cfg.slo)
    return replace(make_plan(s.plan.strategy, p, shapes, units, lk, cost, cfg), mode="latency")


def plan_graph(plan: Plan, *, source=None) -> KernelGraph:
    """The iteration graph a serving-model Plan's "mixed" (or "denoise") assignment refers to, rebuilt
    from the model's capture at the plan's operating point (for the runtime to align kernels with)."""
    from tessera.plan.planner import capture_source

    w = plan.workload
    phase = "mixed" if "mixed" in plan.phases else "denoise"
    if phase not in plan.phases or not plan.batch:
        raise UserError(f"plan for {plan.model} ({plan.strategy}) is not a serving-model cell plan "
                        f"(phases: {', '.join(sorted(plan.phases))})")
    ref = plan.phases[phase].graph_shape.get("batch", 64)
    cfg = PlannerConfig(traffic=Traffic(prompt=w.get("prompt", 1024), output=w.get("output", 256),
                                        steps=w.get("steps", 28)), ref_batch=ref)
    shapes = Shapes(plan.model, source or capture_source(plan.model), cfg, images=phase == "denoise")
    g = shapes.graph(plan.batch, plan.microbatches)
    if len(g.kernels) != len(plan.phases[phase].assignment):
        raise UserError(f"plan for {plan.model} places {len(plan.phases[phase].assignment)} kernels but its "
                        f"iteration graph has {len(g.kernels)}: made by another capture of the model")
    return g
