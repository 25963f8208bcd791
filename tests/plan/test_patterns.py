"""Layer patterns vs the flat MILP solved to optimality, fast and slow links (PLANNER.md, issue 5)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.cost import CostModel
from tessera.graph import Role
from tessera.hardware import LinkSpec
from tessera.plan.pool import Pool
from tessera.plan.solver.milp import TIE_BREAK, loads, solve_flat
from tessera.plan.solver.patterns import find_segments, polish, solve_patterns
from tessera.plan.solver.problem import build_problem
from tessera.plan.solver.solve import resident_bytes
from tessera.plan.synthetic import SynthConfig, llama_like

SMALL = SynthConfig(layers=4, hidden=512, ffn=1792, heads=8, kv_heads=2, vocab=4000)


def _pool(gb_per_s: float) -> Pool:
    base = Pool.parse("H100,L40S")
    return Pool(gpus=base.gpus, link=LinkSpec(name=f"{gb_per_s}GB/s", bytes_per_s=gb_per_s * 1e9, latency_s=10e-6))


def test_segments_cover_every_layer() -> None:
    p = build_problem(llama_like("decode", batch=8, context=1024, cfg=SMALL), _pool(50), CostModel())
    segs = find_segments(p)
    assert [s.layers for s in segs] == [[0, 1, 2, 3]]
    assert all(len(gs) == len(segs[0].groups[0]) for gs in segs[0].groups)


@pytest.mark.slow
@pytest.mark.parametrize("gb_per_s", [50.0, 5.0, 1.0])
def test_patterns_within_one_percent_of_flat_optimum(gb_per_s: float) -> None:
    p = build_problem(llama_like("decode", batch=8, context=1024, cfg=SMALL), _pool(gb_per_s))
    flat = solve_flat(p, mip_rel_gap=0.0, time_limit_s=60.0)
    assert flat.status == "optimal"
    segs = find_segments(p)
    pr = solve_patterns(p, segs, mip_rel_gap=0.0)
    gd = polish(p, segs, pr.group_dev, free_layers=0, mip_rel_gap=1e-3)
    dev, link = loads(p, gd)
    t_pattern = max(dev + list(link.values()))
    assert t_pattern <= flat.objective * 1.01
    # the flat optimum is a lower bound on T + ε·work (its objective, TIE_BREAK ε), so on T up to ε·Δwork
    work_flat = sum(loads(p, flat.group_dev)[0])
    assert t_pattern >= flat.objective - TIE_BREAK * (sum(dev) - work_flat) - 1e-6 * flat.objective


def test_preresident_weights_split_segments_and_the_counts_milp_stays_within_memory() -> None:
    """Prefill after decode: layers 0–2 keep their weights on device 0, layers 3–5 on device 1, and neither
    device has room for more. Identical layers that differ in where their weights already live form
    separate segments (the counts MILP prices bytes on one representative layer), and the placement the
    pattern MILP returns fits both devices."""
    cfg = SynthConfig(layers=6, hidden=512, ffn=1792, heads=8, kv_heads=2, vocab=4000)
    p0 = build_problem(llama_like("prefill", batch=2, seq=64, cfg=cfg), _pool(50), CostModel())
    layer = {g: {p0.graph.kernels[k].layer for k in ks} - {None} for g, ks in enumerate(p0.groups)}
    pre = {}
    for w in p0.residents:
        ls = set().union(*(layer[g] for g in w.groups))
        if w.role == Role.WEIGHT:  # prologue/epilogue weights on both, layer weights on one
            pre[w.name] = frozenset({0} if ls and max(ls) <= 2 else {1} if ls else {0, 1})
    w_res = sum(w.bytes for w in p0.residents if w.role == Role.WEIGHT)
    # 4 MB free each: room for three layers' kv (3 × 1 MB), not for three layers' weights (3 × 6.8 MB)
    held = tuple(int(p0.pool.gpus[d].mem_bytes - p0.act_bytes - 4e6) for d in range(2))
    p = replace(p0, preresident=pre, held_bytes=held)
    assert w_res > 40e6
    segs = find_segments(p)
    assert [s.layers for s in segs] == [[0, 1, 2], [3, 4, 5]]
    pr = solve_patterns(p, segs, mip_rel_gap=0.0)
    assert pr.status == "optimal"
    assert all(b <= p.free_bytes(d) for d, b in enumerate(resident_bytes(p, pr.group_dev)))
