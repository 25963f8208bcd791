"""Layer pipeline: contiguous layer ranges, one per device, sized by each device's speed on the graph's
layers (or evenly, when a fast device cannot hold its speed share of weights), in every device order,
with asynchronous micro-batches; the best placement that fits memory."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from tessera.graph import KernelGraph
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.baselines.common import best_fitting


def layer_ranges(n_layers: int, speeds: list[float]) -> list[int]:
    """Layer counts per stage in proportion to speed (largest remainder), every stage at least one layer
    when there are enough layers."""
    tot = sum(speeds)
    raw = [n_layers * s / tot for s in speeds]
    cnt = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - cnt[i], reverse=True)[: n_layers - sum(cnt)]:
        cnt[i] += 1
    if n_layers >= len(speeds):
        for i in range(len(cnt)):
            if cnt[i] == 0:
                j = max(range(len(cnt)), key=lambda j: cnt[j])
                cnt[j] -= 1
                cnt[i] += 1
    return cnt


def layer_pipeline(g: KernelGraph, order: list[int], counts: list[int]) -> tuple[int, ...]:
    """Contiguous layer ranges: stage i (device order[i]) runs the next counts[i] layers; the prologue
    runs on the first stage, the epilogue on the last."""
    layers = sorted({k.layer for k in g.kernels if k.layer is not None})
    stage_of: dict[int, int] = {}
    i = 0
    for st, c in enumerate(counts):
        for lay in layers[i:i + c]:
            stage_of[lay] = order[st]
        i += c
    first_layer_kernel = min((k.id for k in g.kernels if k.layer is not None), default=0)
    out = []
    for k in g.kernels:
        if k.layer is not None:
            out.append(stage_of[k.layer])
        else:
            out.append(order[0] if k.id < first_layer_kernel else order[-1])
    return tuple(out)


def layer_seconds(g: KernelGraph, times: list[list[float]]) -> list[float]:
    """Per-device seconds of all layers' kernels (times[k][d]); speed of a stage is 1 / this."""
    n_dev = len(times[0]) if times else 0
    return [sum(times[k.id][d] for k in g.kernels if k.layer is not None) for d in range(n_dev)]


def rule(units: tuple[GpuSpec, ...], link: LinkSpec, cost) -> Callable:
    """The placement rule (graph, batch, m) -> assignment."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        times = [[cost.kernel_time_s(k, u) for u in units] for k in g.kernels]
        speeds = [1.0 / max(s, 1e-12) for s in layer_seconds(g, times)]
        cands = []
        for perm in itertools.permutations(range(len(units))):
            counts = layer_ranges(g.layers, [speeds[d] for d in perm])
            cands.append(layer_pipeline(g, list(perm), counts))
            # memory-lean variant: equal layer counts (a fast device may not hold its speed share of weights)
            even = layer_ranges(g.layers, [1.0] * len(units))
            cands.append(layer_pipeline(g, list(perm), even))
        return best_fitting(g, list(dict.fromkeys(cands)), m, units, link, cost)
    return place
