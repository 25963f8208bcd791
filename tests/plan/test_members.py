"""Homogeneous on a mixed pair is a pool of *different* replicas: a Plan with members, which PoolPlan turns
into cells with counts; the simulator serves both spellings alike."""

from __future__ import annotations

import json

import pytest

from tessera.plan.planner import capture_source
from tessera.plan.pool import resolve_gpu, resolve_link
from tessera.plan.problem import default_cost
from tessera.plan.serve import PlannerConfig, Shapes, homogeneous
from tessera.plan.types import PoolCell, PoolPlan
from tessera.sim import LengthSpec, WorkloadSpec, simulate, simulate_pool


@pytest.fixture(scope="module")
def mixed():
    cfg = PlannerConfig(batch_cap=32)
    shapes = Shapes("llama-tiny", capture_source("llama-tiny"), cfg, False)
    specs = (resolve_gpu("H100"), resolve_gpu("L40S"))
    return homogeneous(shapes, specs, resolve_link("pcie5"), default_cost(), cfg).plan


def test_pool_plan_from_a_members_plan(tmp_path, mixed) -> None:
    h = mixed
    assert h is not None and sorted(m.devices[0].gpu for m in h.members) == ["H100-SXM", "L40S"]
    pool = PoolPlan.from_plan(h)
    assert [c.plan for c in pool.cells] == list(h.members) and [c.count for c in pool.cells] == [1, 1]
    # the pool's capacity is the sum of its cells' own predictions × count; the members plan's headline (its
    # goodput at the SLO) is within it
    caps = [m.throughput_tokens_per_s for m in h.members]
    assert PoolPlan.from_plan(h, 3).throughput_per_s == pytest.approx(3 * (caps[0] + caps[1]))
    assert h.throughput_tokens_per_s <= pool.throughput_per_s * (1 + 1e-9)
    assert pool.usd_per_hour == pytest.approx(resolve_gpu("H100").usd_per_hour + resolve_gpu("L40S").usd_per_hour)
    p = tmp_path / "pool.json"
    pool.save(p)
    on_disk = json.loads(p.read_text())["cells"]
    assert PoolPlan.load(p) == pool and [c["plan"]["devices"][0]["gpu"] for c in on_disk] == [
        m.devices[0].gpu for m in h.members]
    assert PoolPlan.from_plan(h, 3).sim_cells() == [(m, 3) for m in h.members]


def test_pool_plan_simulates_as_the_members_plan(mixed) -> None:
    wl = WorkloadSpec(kind="offline", requests=200, prompt=LengthSpec(lo=256, hi=256), output=LengthSpec(lo=64, hi=64))
    a = simulate(mixed, wl, seed=3).to_json()
    b = simulate_pool(PoolPlan.from_plan(mixed).sim_cells(), wl, seed=3).to_json()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


def test_pool_plan_rejects_what_is_not_a_pool(mixed) -> None:
    with pytest.raises(ValueError, match="not a plan of independent replicas"):
        PoolCell(plan=mixed, count=1)
    with pytest.raises(ValueError, match="count=0"):
        PoolCell(plan=mixed.members[0], count=0)
    with pytest.raises(ValueError, match="at least one cell"):
        PoolPlan(cells=())
    with pytest.raises(ValueError, match="version"):
        PoolPlan.from_dict({"version": 99, "cells": []})
