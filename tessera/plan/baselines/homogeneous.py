"""Homogeneous replicas, as vLLM and SGLang users deploy them: per GPU type of the pool, the group of k GPUs
(k a power of two dividing the type's count) and the way the group splits the model with the most goodput,
the rest of the type's GPUs as replicas, each at its own best batch; replicas of different types serve side
by side.

A group splits the model by tensor parallelism (every model), or, for a MoE model, by data-parallel
attention with the experts split by expert (EP) or by intermediate dimension (MoE TP), as DeepSeek-V3 is
served at scale (units.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from tessera.contracts.cost import KernelCosts
from tessera.contracts.plan import Device, Plan, PoolCell, PoolPlan
from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.config import PlannerConfig, StrategyResult
from tessera.plan.model.cell import Shapes, cell_strategy
from tessera.plan.model.knee import pooled_image_knee
from tessera.plan.model.serving import closeness
from tessera.plan.model.units import DP_LAYOUTS, UnitCost, gpu_weight_bytes, has_moe, make_dp_unit, make_unit
from tessera.plan.pool import Pool

GROUP_SIZES = (1, 2, 4, 8)
LAYOUT_WORDS = {"tp": "TP {k}", "dp-ep": "attention DP {k}, experts EP {k}",
                "dp-tp": "attention DP {k}, experts TP {k}"}


def uniform(device: int = 0) -> Callable[[KernelGraph, int, int], tuple[int, ...]]:
    """Every kernel on one device (a single-device replica, or one side of prefill/decode)."""
    return lambda g, b, m: (device,) * len(g.kernels)


def group_options(count: int, max_k: int, moe: bool) -> list[tuple[int, str]]:
    """(k, layout) of the groups ``count`` GPUs of one type split into: tensor parallel at every power of
    two dividing the count up to ``max_k``, and for a MoE model data-parallel attention at each k ≥ 2."""
    ks = [k for k in GROUP_SIZES if k <= min(count, max_k) and count % k == 0]
    return [(k, "tp") for k in ks] + [(k, lay) for k in ks if moe and k > 1 for lay in DP_LAYOUTS]


def group_result(shapes: Shapes, gpu: GpuSpec, k: int, layout: str, lk: LinkSpec, cost: KernelCosts,
                 cfg: PlannerConfig) -> StrategyResult:
    """One replica: a group of ``k`` × ``gpu`` split by ``layout``, at its best batch. One micro-batch: the
    group is one device running every kernel, so a micro-batch's latency is its busy time (L = T) and the
    period max(m·T, L) = m·T(B/m) ≥ T(B) (each micro-batch reads the weights again): more cannot help."""
    if layout == "tp":
        unit, ucost = make_unit(gpu, k), UnitCost.over(cost, ((gpu, k),))
    else:
        unit, ucost = make_dp_unit(gpu, k, layout, shapes.base), UnitCost.over(cost, ((gpu, k, layout),))
        if unit is None:
            w = gpu_weight_bytes(shapes.base, k, layout)
            return StrategyResult(name="homogeneous", applicable=True, usd_per_hour=gpu.usd_per_hour * k,
                                  reason=f"one GPU's share of the weights, {w / 1e9:.1f} GB, exceeds its "
                                         f"{gpu.mem_bytes / 1e9:.1f} GB")
    r = cell_strategy("homogeneous", uniform(0), shapes, Pool(gpus=(unit,), link=lk), ucost,
                      replace(cfg, microbatches=(1,)))
    words = LAYOUT_WORDS[layout].format(k=k) if k > 1 else "one GPU"
    r = replace(r, tp=(k,), detail={"layout": {gpu.name: words}})
    if layout != "tp" and r.plan is not None:
        r = replace(r, plan=group_memory(r.plan, gpu, k, gpu_weight_bytes(shapes.base, k, layout)))
    return r


def group_memory(plan: Plan, gpu: GpuSpec, k: int, w_gpu: int) -> Plan:
    """A data-parallel group's Plan with its memory as the group's GPUs hold it: k × one GPU's memory and
    k × one GPU's weights (make_dp_unit's capacity counts each replicated weight once); KV, state and
    activations as counted, the group's totals. KV capacity is unchanged (both leave k × one GPU's room)."""
    mem = {**plan.memory_bytes[0], "weight": k * w_gpu}
    dev = Device(index=0, gpu=plan.devices[0].gpu, mem_bytes=k * gpu.mem_bytes)
    return replace(plan, devices=(dev,), memory_bytes=(mem,))


def homogeneous(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost: KernelCosts,
                cfg: PlannerConfig) -> StrategyResult:
    """Each GPU type of the pool as users deploy it: the group (group_options) with the most goodput,
    replicas = count / k, each replica at its own best batch. One GPU type is one cell (a Plan with
    replicas); several types are a PoolPlan of different cells with counts, the fastest first."""
    counts = Counter(s.name for s in specs)
    by_name = {s.name: s for s in specs}
    moe = has_moe(shapes.base)
    per_type: list[tuple[StrategyResult, int]] = []
    whys = []
    misses: list[StrategyResult] = []  # groups that fit but meet no SLO point: the nearest says how far
    for name, n in counts.items():
        best_t: tuple[float, StrategyResult, int] | None = None
        for k, layout in group_options(n, cfg.max_tp, moe):
            r = group_result(shapes, by_name[name], k, layout, lk, cost, cfg)
            tot = r.goodput * (n // k)
            if r.feasible and (best_t is None or tot > best_t[0]):
                best_t = (tot, r, n // k)
            elif not r.feasible:
                whys.append(f"{name} {LAYOUT_WORDS[layout].format(k=k)}: {r.reason}")
                if r.point is not None and r.point.knee is not None:
                    misses.append(r)
        if best_t is not None:
            per_type.append((best_t[1], best_t[2]))
    usd = sum(s.usd_per_hour for s in specs)
    if not per_type:
        near = min(misses, key=lambda r: closeness(r.point, cfg.slo), default=None)
        return StrategyResult(name="homogeneous", applicable=True, usd_per_hour=usd,
                              point=near.point if near else None,
                              reason="no GPU type holds a replica at any group size: " + "; ".join(whys))
    return deployment(per_type, shapes, usd, cfg)


def deployment(per_type: list[tuple[StrategyResult, int]], shapes: Shapes, usd: float,
               cfg: PlannerConfig) -> StrategyResult:
    """The pool's replicas: one cell of identical copies, or a PoolPlan of each type's cell with its count.
    Token replicas add up; image replicas behind the router pool their load (pooled_goodput)."""
    total = sum(r.goodput * k for r, k in per_type)
    if shapes.images:
        total = max(total, pooled_goodput(per_type, cfg))
    per_type.sort(key=lambda x: -x[0].goodput)
    rate = "{:.3g}" if shapes.images else "{:,.0f}"  # images/s are fractions; tokens/s are not
    desc = ", ".join(f"{k}×{r.plan.devices[0].gpu} ({rate.format(r.goodput)}/s each)" for r, k in per_type if r.plan)
    tps = tuple(r.tp[0] for r, k in per_type for _ in range(k))
    layout = {g: w for r, _ in per_type for g, w in r.detail.get("layout", {}).items()}
    lead, k_lead = per_type[0]
    assert lead.plan is not None
    common = dict(name="homogeneous", applicable=True, point=lead.point, goodput=total, usd_per_hour=usd, tp=tps,
                  detail={"replicas": desc, "layout": layout})
    if len(per_type) == 1:  # one GPU type: one cell, its replicas identical copies
        cap = _capacity(lead.plan, shapes.images) * k_lead
        plan = replace(lead.plan, strategy="homogeneous", replicas=k_lead, usd_per_hour=usd,
                       throughput_tokens_per_s=None if shapes.images else cap,
                       throughput_images_per_s=cap if shapes.images else None,
                       usd_per_million_tokens=usd / 3600 / cap * 1e6, notes=(f"independent replicas: {desc}",))
        return StrategyResult(plan=plan, **common)
    # several GPU types: a pool of different cells, each one replica of its type, counted
    pool = PoolPlan(cells=tuple(PoolCell(plan=replace(r.plan, strategy="homogeneous"), count=k)
                                for r, k in per_type if r.plan is not None))
    return StrategyResult(plan=pool.lead, pool=pool, **common)


def pooled_goodput(per_type: list[tuple[StrategyResult, int]], cfg: PlannerConfig) -> float:
    """Images/s of the replicas behind a least-loaded router (knee.pooled_image_knee), each replica's share
    of the traffic in proportion to what it serves alone (the router's weights); 0 when one replica."""
    members = [(r.point.server, k, r.goodput) for r, k in per_type if r.point is not None and r.point.server]
    total = sum(k * g for _, k, g in members)
    if len(members) != len(per_type) or sum(k for _, k, _ in members) < 2 or total <= 0:
        return 0.0
    return pooled_image_knee([(srv, k, g / total) for srv, k, g in members], latency_slo_s=cfg.slo.image_s,
                             target=cfg.slo.target).rate_per_s


def _capacity(p: Plan, images: bool) -> float:
    """One replica's saturation throughput (a Plan's headline figure)."""
    return (p.throughput_images_per_s if images else p.throughput_tokens_per_s) or 0.0
