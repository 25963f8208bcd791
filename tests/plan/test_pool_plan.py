"""A pool served by several *different* cells is a PoolPlan (cells with counts); a Plan is always one cell.
Homogeneous on a mixed pair is such a pool; its headline figures are the sums of its cells'."""

from __future__ import annotations

import json

import pytest

from tessera.contracts.plan import Plan, PoolCell, PoolPlan, plan_from_dict, read_plan_file
from tessera.hardware import catalog
from tessera.plan.captures import capture_source
from tessera.plan.config import StrategyResult
from tessera.plan.pool import resolve_gpu, resolve_link
from tessera.plan.search import PlannerConfig, Shapes, adopt_best, homogeneous
from tessera.plan.solver.problem import default_cost
from tessera.sim import LengthSpec, WorkloadSpec, simulate, simulate_pool
from tessera.sim.handplan import PhaseCost, hand_plan

# decode step: 20 ms + 100 µs per sequence (fast) and twice that (slow), sampled up to batch 128; prefill
# 10 ms + 20 µs per token (the simulator needs both phases of a token model)
FAST = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128))
SLOW = PhaseCost(fixed_s=0.04, per_token_s=2e-4, tokens=(1, 64, 128))
PREFILL = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,))


def hand_pool() -> PoolPlan:
    """2 × a fast H100 cell at $3/h + 1 × a slow L40S cell at $1/h."""
    fast = hand_plan(phases={"prefill": PREFILL, "decode": FAST}, gpus=("H100-SXM",), usd_per_hour=3.0, strategy="homogeneous")
    slow = hand_plan(phases={"prefill": PREFILL, "decode": SLOW}, gpus=("L40S",), usd_per_hour=1.0, strategy="homogeneous")
    return PoolPlan(cells=(PoolCell(plan=fast, count=2), PoolCell(plan=slow, count=1)))


def test_pool_figures_are_the_sums_of_its_cells_by_hand() -> None:
    pool = hand_pool()
    # a fast cell: 128 sequences / (0.02 + 128 × 1e-4 s) = 128 / 0.0328 = 3902.44 tokens/s; slow: 128 / 0.0656
    # = 1951.22; the pool: 2 × 3902.44 + 1951.22 = 9756.10 tokens/s at 2 × $3 + $1 = $7/h
    assert pool.throughput_per_s == pytest.approx(9756.10, abs=0.01)
    assert pool.usd_per_hour == pytest.approx(7.0)
    assert pool.replicas == 3 and pool.lead.devices[0].gpu == "H100-SXM" and pool.strategy == "homogeneous"
    assert PoolPlan.of(pool, 2).throughput_per_s == pytest.approx(2 * 9756.10, abs=0.02)
    assert PoolPlan.of(pool.lead, 3).sim_cells() == [(pool.lead, 3)]


def test_pool_round_trips_and_files_are_told_apart_by_content(tmp_path) -> None:
    pool = hand_pool()
    path = tmp_path / "pool.json"
    pool.save(path)
    assert PoolPlan.load(path) == pool and read_plan_file(path) == pool
    lead = tmp_path / "plan.json"
    pool.lead.save(lead)
    assert read_plan_file(lead) == pool.lead
    with pytest.raises(ValueError, match="pool plan"):
        Plan.load(path)
    (tmp_path / "junk.json").write_text('{"model": "x"}')
    with pytest.raises(ValueError, match=r"junk.json: it is neither a plan .* nor a pool plan"):
        read_plan_file(tmp_path / "junk.json")
    (tmp_path / "cut.json").write_text("{")
    with pytest.raises(ValueError, match="cut.json: not JSON"):
        read_plan_file(tmp_path / "cut.json")


def test_an_old_members_file_is_read_as_the_pool_it_describes() -> None:
    pool = hand_pool()
    fast, slow = (c.plan for c in pool.cells)
    # before PoolPlan, a plan carried its independent replicas of different cells as "members", each a Plan
    # with its own replicas; the outer plan was the lead's with the summed figures
    old = {**fast.to_dict(), "members": [{**fast.to_dict(), "replicas": 2}, slow.to_dict()]}
    got = plan_from_dict(json.loads(json.dumps(old)))
    assert isinstance(got, PoolPlan) and [c.count for c in got.cells] == [1, 1]
    assert [c.plan.replicas for c in got.cells] == [2, 1]
    # the same replicas behind the router, so the same capacity and price as the pool it describes
    assert got.replicas == pool.replicas
    with pytest.raises(ValueError, match="members"):
        Plan.from_dict(old)
    # a plan file from before PoolPlan always carried "members": [] — it stays one cell's plan
    assert plan_from_dict({**fast.to_dict(), "members": []}) == fast


def test_the_simulator_serves_a_pool() -> None:
    pool = hand_pool()
    wl = WorkloadSpec(kind="offline", requests=300, prompt=LengthSpec(lo=128, hi=128), output=LengthSpec(lo=16, hi=16))
    r = simulate(pool, wl, seed=1)
    assert r.completed == 300 and r.lost == 0 and r.replicas == 3
    assert r.usd_per_million_tokens is not None and r.usd_per_million_tokens > 0
    twice = simulate(pool, wl, seed=1, replicas=2)
    assert twice.replicas == 6
    a, b = twice.to_json(), simulate_pool([(c.plan, 2 * c.count) for c in pool.cells], wl, seed=1).to_json()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


def test_pool_plan_rejects_what_is_not_a_pool() -> None:
    pool = hand_pool()
    with pytest.raises(ValueError, match="count=0"):
        PoolCell(plan=pool.lead, count=0)
    with pytest.raises(ValueError, match="at least one cell"):
        PoolPlan(cells=())
    with pytest.raises(ValueError, match="version"):
        PoolPlan.from_dict({"version": 99, "cells": []})
    with pytest.raises(ValueError, match="lead cell"):
        StrategyResult(name="homogeneous", applicable=True, plan=pool.cells[1].plan, pool=pool)


@pytest.fixture(scope="module")
def mixed() -> StrategyResult:
    cfg = PlannerConfig(batch_cap=32)
    shapes = Shapes("llama-tiny", capture_source("llama-tiny"), cfg, False)
    specs = (resolve_gpu("H100"), resolve_gpu("L40S"))
    return homogeneous(shapes, specs, resolve_link("pcie5"), default_cost(), cfg)


def test_homogeneous_on_a_mixed_pair_is_a_pool_of_one_replica_per_type(mixed) -> None:
    pool = mixed.pool
    assert pool is not None and mixed.deployment is pool and mixed.plan == pool.lead
    assert sorted(c.plan.devices[0].gpu for c in pool.cells) == ["H100-SXM", "L40S"]
    assert [c.count for c in pool.cells] == [1, 1] and all(c.plan.replicas == 1 for c in pool.cells)
    # each cell is one GPU at its own catalog price; the strategy's $/h is the pool's
    prices = {g: catalog.gpu(g).usd_per_hour for g in ("H100-SXM", "L40S")}
    assert [c.plan.usd_per_hour for c in pool.cells] == [prices[c.plan.devices[0].gpu] for c in pool.cells]
    assert mixed.usd_per_hour == pytest.approx(pool.usd_per_hour)
    assert pool.usd_per_hour == pytest.approx(prices["H100-SXM"] + prices["L40S"])
    # goodput at the SLO is at most the cells' summed capacity; the lead is the faster cell
    assert 0 < mixed.goodput <= pool.throughput_per_s * (1 + 1e-9)
    caps = [c.plan.throughput_tokens_per_s for c in pool.cells]
    assert caps[0] >= caps[1]


def test_tessera_adopting_the_pool_is_saved_as_a_pool(tmp_path, mixed) -> None:
    nothing = StrategyResult(name="tessera", applicable=True, reason="one device: nothing to place")
    t = adopt_best(nothing, {"homogeneous": mixed})
    assert t.chosen == "homogeneous" and t.pool is not None and t.plan == t.pool.lead
    assert {c.plan.strategy for c in t.pool.cells} == {"tessera"}
    assert t.goodput == mixed.goodput and t.usd_per_hour == mixed.usd_per_hour
    t.deployment.save(tmp_path / "t.json")
    assert read_plan_file(tmp_path / "t.json") == t.pool
