"""What `tessera simulate` takes from a plan when the flags leave it open: the workload, the SLO, the load,
the provenance and the lost replica's cell; each figure below worked out by hand from the plan's fields."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.contracts.plan import PlanSlo, PoolCell, PoolPlan
from tessera.contracts.provenance import fingerprint
from tessera.contracts.slo import LatencyTargets
from tessera.sim.failure import replica_loss, replica_plan
from tessera.sim.traffic import (
    cell_plans,
    default_workload,
    offered_load,
    predicted_requests_per_s,
    simulation_provenance,
    targets_with,
)
from tessera.sim.workload import LengthSpec

PROMPT, OUTPUT = LengthSpec(lo=512, hi=512), LengthSpec(lo=100, hi=300)  # output: mean 200 tokens


@pytest.fixture
def planned(plan):
    """The hand plan with a goodput of 1,000 output tokens/s and an SLO of TTFT 2 s, TPOT 50 ms."""
    return replace(plan, goodput_per_s=1000.0, slo=PlanSlo(ttft_s=2.0, tpot_s=0.05))


def test_no_rate_is_poisson_at_ninety_percent_of_the_goodput(planned) -> None:
    spec, note = default_workload(planned, None, None, requests=50, prompt=PROMPT, output=OUTPUT, replicas=2)
    # 0.9 × 1,000 tokens/s × 2 replicas / 200 tokens per request = 9 requests/s
    assert (spec.kind, spec.rate_per_s, spec.requests) == ("poisson", pytest.approx(9.0), 50)
    assert note == "poisson arrivals at 90% of the plan's goodput (2,000 tokens/s): 9 req/s"


def test_a_rate_alone_is_poisson_at_that_rate_and_no_goodput_is_offline(plan, planned) -> None:
    spec, note = default_workload(planned, None, 3.5, requests=10, prompt=PROMPT, output=OUTPUT, replicas=1)
    assert (spec.kind, spec.rate_per_s, note) == ("poisson", 3.5, "")
    spec, note = default_workload(plan, None, None, requests=10, prompt=PROMPT, output=OUTPUT, replicas=1)
    assert (spec.kind, spec.rate_per_s, note) == ("offline", 0.0, "")


def test_targets_given_replace_the_plans_own(planned, plan) -> None:
    assert targets_with(planned) == LatencyTargets(ttft_s=2.0, tpot_s=0.05)
    assert targets_with(planned, tpot_s=0.1, e2e_s=9.0) == LatencyTargets(ttft_s=2.0, tpot_s=0.1, e2e_s=9.0)
    assert targets_with(plan) is None  # the hand plan names no SLO
    assert targets_with(plan, ttft_s=1.0) == LatencyTargets(ttft_s=1.0)


def test_offered_load_and_predicted_capacity(planned) -> None:
    spec, _ = default_workload(planned, "poisson", 4.0, requests=10, prompt=PROMPT, output=OUTPUT, replicas=1)
    # 4 requests/s × 200 tokens = 800 tokens/s over 1,000 × 2 replicas
    assert offered_load(planned, spec, 2) == pytest.approx(0.4)
    # the hand plan's throughput: decode batch 128 / (20 ms + 128 × 100 µs) = 3,902.4 tokens/s; / 200 tokens
    assert predicted_requests_per_s(planned, spec, 1) == pytest.approx(128 / 0.0328 / 200)
    offline, _ = default_workload(planned, "offline", None, requests=10, prompt=PROMPT, output=OUTPUT,
                                  replicas=1)
    assert offered_load(planned, offline, 1) is None and predicted_requests_per_s(planned, offline, 1) is None


def test_provenance_names_the_plan_and_what_was_run(planned) -> None:
    slo = LatencyTargets(ttft_s=2.0)
    p = simulation_provenance(planned, PROMPT, OUTPUT, slo, workload="poisson", rate_per_s=9.0, seed=7)
    assert (p.model, p.plan, p.prompt, p.output) == ("hand", fingerprint(planned), "512", "100-300")
    assert (p.output_per_request, p.slo_ttft_s, p.slo_tpot_s, p.rate_per_s, p.seed) == (200.0, 2.0, None, 9.0, 7)


def test_replicas_are_numbered_cell_by_cell(plan, split_plan) -> None:
    pool = PoolPlan(cells=(PoolCell(plan=plan, count=2), PoolCell(plan=split_plan, count=1)))
    assert cell_plans(pool) == [plan, split_plan] and cell_plans(plan) == [plan]
    # two replicas of the pool: indices 0-3 are the first cell's copies, 4-5 the second's
    assert [replica_plan(pool, i, 2) for i in range(6)] == [plan] * 4 + [split_plan] * 2
    spare = replica_loss(pool, at_s=5.0, replica=4, spare=True, replan_s=1.5, replicas=2)
    assert (spare.at_s, spare.replica, spare.replan_s) == (5.0, 4, 1.5)
    assert spare.replacement == ((replace(split_plan, replicas=1), 1),)  # one spare cell
    assert replica_loss(pool, at_s=5.0, replica=0, spare=False, replan_s=0.0).replacement is None
