"""The serving model's period over per-program costs, worked out by hand."""

from __future__ import annotations

import pytest

from tessera.runtime.serve_predict import StepCost, iteration_s, predicted_period_s, profile_plan
from tessera.sim.workload import LengthSpec, WorkloadSpec

DEC = StepCost(busy_s=(1.0, 2.0), latency_s=3.0)  # one request's decode step: device 1 is the bottleneck
PRE = StepCost(busy_s=(4.0, 2.0), latency_s=6.0)


def test_iteration_period_by_hand() -> None:
    # 2 decodes per group: busy (2, 4), T = 4; L = 3 + 4 - 2 = 5
    assert iteration_s(DEC, PRE, 2, 0, 1) == 5.0  # one group: the latency bounds the period
    assert iteration_s(DEC, PRE, 2, 0, 2) == 8.0  # two groups: max(2·4, 5)
    # plus half a prefill: busy (2 + 2, 4 + 1) = (4, 5), T = 5; L = 3 + 5 - 2 = 6; two groups: max(10, 6)
    assert iteration_s(DEC, PRE, 2, 0.5, 2) == 10.0


def test_predicted_period_uses_the_workload_means() -> None:
    costs = {"decode@5": DEC, "decode@50": StepCost(busy_s=(9.0, 9.0), latency_s=9.0), "prefill@4": PRE}
    w = WorkloadSpec(kind="offline", requests=4, prompt=LengthSpec(lo=4, hi=4), output=LengthSpec(lo=2, hi=2))
    # mean context 4 + 2/2 = 5 -> decode@5; 4 slots, 2 groups: n = 2 decodes and 2/2 = 1 prefill per group:
    # busy (2 + 4, 4 + 2) = (6, 6), T = 6, L = 3 + 6 - 2 = 7, period = max(12, 7)
    assert predicted_period_s(costs, w, 4, 2) == 12.0


def test_profile_plan_points_follow_the_formula() -> None:
    costs = {"decode@5": DEC, "prefill@4": PRE}
    w = WorkloadSpec(kind="offline", requests=4, prompt=LengthSpec(lo=4, hi=4), output=LengthSpec(lo=2, hi=2))
    plan = profile_plan("llama-tiny", costs, w, slots=4, m=2)
    pts = {p.tokens: p for p in plan.phases["mixed"].points}
    # chunk = ceil(4·4/2) = 8: points at 1, 2, 4, 12, 24 tokens
    assert sorted(pts) == [1, 2, 4, 12, 24]
    assert pts[4].step_s == iteration_s(DEC, PRE, 2, 0, 2) == 8.0
    # 12 tokens: 4 decodes + 8 prompt tokens = 2 prompts; per group 2 decodes and 1 prompt -> period 12
    assert pts[12].step_s == pytest.approx(12.0)
    assert plan.batch == 4 and plan.microbatches == 2
