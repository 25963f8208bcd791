"""Homogeneous on a mixed pool is a pool of *different* replicas: members, not N copies of one."""

from __future__ import annotations

import json

from tessera.plan.planner import plan_graphs
from tessera.plan.pool import Pool
from tessera.plan.types import Plan
from tessera.sim import LengthSpec, WorkloadSpec, simulate, simulate_pool

from .test_planner import CFG, W, _source


def test_homogeneous_mixed_pool_has_one_member_per_gpu_and_simulates_as_a_pool(tmp_path) -> None:
    r = plan_graphs("synth", ["prefill", "decode"], _source(CFG), Pool.parse("H100,L40S", "pcie5"),
                    workload=W, points=True)
    h = r.strategies["homogeneous"].plan
    assert h is not None and h.replicas == 1
    assert [m.devices[0].gpu for m in h.members] == ["H100-SXM", "L40S"]
    assert [d.gpu for d in h.devices] == ["H100-SXM", "L40S"]
    # headline throughput is the sum of the members' own predictions
    assert h.throughput_tokens_per_s is not None
    assert abs(h.throughput_tokens_per_s - sum(m.throughput_tokens_per_s or 0 for m in h.members)) < 1e-6
    p = tmp_path / "h.json"
    h.save(p)
    assert Plan.load(p) == h and json.loads(p.read_text())["members"][1]["devices"][0]["gpu"] == "L40S"
    wl = WorkloadSpec(kind="offline", requests=200, prompt=LengthSpec(lo=256, hi=256),
                      output=LengthSpec(lo=64, hi=64))
    a = simulate(h, wl, seed=3).to_json()
    b = simulate_pool([(m, 1) for m in h.members], wl, seed=3).to_json()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b
    # a members plan inside a pool is expanded too (fleet cells, failure bench), fastest member first
    assert h.members[0].throughput_tokens_per_s >= h.members[1].throughput_tokens_per_s
    c = simulate_pool([(h, 2)], wl, seed=3).to_json()
    d = simulate(h, wl, replicas=2, seed=3).to_json()
    assert c == d and h.kv_capacity_tokens == sum(m.kv_capacity_tokens for m in h.members)
