"""Layer patterns vs the flat MILP solved to optimality, fast and slow links (PLANNER.md, issue 5)."""

from __future__ import annotations

import pytest

from tessera.cost import CostModel
from tessera.hardware import LinkSpec
from tessera.plan.milp import TIE_BREAK, loads, solve_flat
from tessera.plan.patterns import find_segments, polish, solve_patterns
from tessera.plan.pool import Pool
from tessera.plan.problem import build_problem
from tessera.plan.synthetic import SynthConfig, llama_like

SMALL = SynthConfig(layers=4, hidden=512, ffn=1792, heads=8, kv_heads=2, vocab=4000)


def _pool(gb_per_s: float) -> Pool:
    base = Pool.parse("H100,L40S", "pcie5")
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
