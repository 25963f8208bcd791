"""Homogeneous replicas, as vLLM users deploy them: per GPU type of the pool, the tensor-parallel degree
(a power of two dividing the type's count) with the most goodput, the rest of the type's GPUs as
replicas, each at its own best batch; replicas of different types serve side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.cell import Shapes, cell_strategy
from tessera.plan.config import PlannerConfig, StrategyResult
from tessera.plan.pool import Pool
from tessera.plan.types import Plan, PoolCell, PoolPlan
from tessera.plan.units import UnitCost, make_unit


def uniform(device: int = 0) -> Callable[[KernelGraph, int, int], tuple[int, ...]]:
    """Every kernel on one device (a single-device replica, or one side of prefill/decode)."""
    return lambda g, b, m: (device,) * len(g.kernels)


def homogeneous(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost, cfg: PlannerConfig) -> StrategyResult:
    """Each GPU type of the pool as vLLM users deploy it: the tensor-parallel degree (a power of two up to
    the type's count) with the most goodput, replicas = count / tp, each replica at its own best batch. One GPU type is one cell (a Plan with
    replicas); several types are a PoolPlan of different cells with counts, the fastest first."""
    counts = Counter(s.name for s in specs)
    by_name = {s.name: s for s in specs}
    per_type: list[tuple[StrategyResult, int]] = []
    whys = []
    for name, n in counts.items():
        best_t: tuple[float, StrategyResult, int] | None = None
        for tp in (1, 2, 4, 8):
            if tp > n or n % tp or tp > cfg.max_tp:
                continue
            unit = make_unit(by_name[name], tp)
            ucost = UnitCost.over(cost, ((by_name[name], tp),))
            r = cell_strategy("homogeneous", uniform(0), shapes, Pool(gpus=(unit,), link=lk), ucost,
                              replace(cfg, microbatches=(1,)))
            r = replace(r, tp=(tp,))
            tot = r.goodput * (n // tp)
            if r.feasible and (best_t is None or tot > best_t[0]):
                best_t = (tot, r, n // tp)
            elif not r.feasible:
                whys.append(f"{name} TP={tp}: {r.reason}")
        if best_t is not None:
            per_type.append((best_t[1], best_t[2]))
    usd = sum(s.usd_per_hour for s in specs)
    if not per_type:
        return StrategyResult(name="homogeneous", applicable=True, usd_per_hour=usd,
                              reason="no GPU type holds a replica at any TP degree: " + "; ".join(whys))
    total = sum(r.goodput * k for r, k in per_type)
    per_type.sort(key=lambda x: -x[0].goodput)
    desc = ", ".join(f"{k}×{r.plan.devices[0].gpu} ({r.goodput:,.0f}/s each)" for r, k in per_type if r.plan)
    tps = tuple(r.tp[0] for r, k in per_type for _ in range(k))
    lead, k_lead = per_type[0]
    assert lead.plan is not None
    common = dict(name="homogeneous", applicable=True, point=lead.point, goodput=total, usd_per_hour=usd, tp=tps,
                  detail={"replicas": desc})
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


def _capacity(p: Plan, images: bool) -> float:
    """One replica's saturation throughput (a Plan's headline figure)."""
    return (p.throughput_images_per_s if images else p.throughput_tokens_per_s) or 0.0
