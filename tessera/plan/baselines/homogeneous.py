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
from tessera.plan.types import Plan
from tessera.plan.units import UnitCost, make_unit


def uniform(device: int = 0) -> Callable[[KernelGraph, int, int], tuple[int, ...]]:
    """Every kernel on one device (a single-device replica, or one side of prefill/decode)."""
    return lambda g, b, m: (device,) * len(g.kernels)


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
            r = cell_strategy("homogeneous", uniform(0), shapes, Pool(gpus=(unit,), link=lk), ucost,
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
