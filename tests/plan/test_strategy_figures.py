"""A StrategyResult's figures (StrategyFigures) are what `tessera plan --json` writes of it and what the report
reads back: the report's parse of a strategy's JSON entry equals the figures the planner's answer makes."""

from __future__ import annotations

import pytest

from tessera.contracts.results import StrategyFigures
from tessera.plan.config import PlannerConfig, ServingResult, StrategyResult
from tessera.report.data import parse_strategy
from tessera.sim.handplan import PhaseCost, hand_plan

DECODE = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128))
PREFILL = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,))


def result(**strategies: StrategyResult) -> ServingResult:
    return ServingResult(model="hand", gpus=("H100-SXM",), link="pcie4", config=PlannerConfig(), images=False,
                         strategies=strategies)


def test_a_feasible_strategys_figures_are_its_json_read_back() -> None:
    plan = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, gpus=("H100-SXM",), usd_per_hour=3.0)
    s = StrategyResult(name="tessera", applicable=True, plan=plan, goodput=2000.0, usd_per_hour=3.0)
    r = result(tessera=s)
    got = parse_strategy("tessera", r.to_json()["strategies"]["tessera"], "plan.json")
    assert got == s.figures(images=False)
    # by hand: $3/h over 2,000 tokens/s = 3 / 3600 / 2000 × 1e6 = $0.41667 per million tokens; the hand plan's
    # one device holds what its memory_bytes says
    assert got.usd_per_million_tokens == pytest.approx(0.416667, rel=1e-5)
    assert got.memory_bytes == {"0:H100-SXM": sum(plan.memory_bytes[0].values())}
    assert (got.throughput_per_s, got.reason, got.scored) == (2000.0, None, True)


def test_an_infeasible_strategy_says_why_and_has_no_throughput() -> None:
    s = StrategyResult(name="homogeneous", applicable=True, reason="nothing fits")
    r = result(tessera=StrategyResult(name="tessera", applicable=False, reason="x"), homogeneous=s)
    got = parse_strategy("homogeneous", r.to_json()["strategies"]["homogeneous"], "plan.json")
    assert got == s.figures(images=False) == StrategyFigures(
        name="homogeneous", applicable=True, reason="nothing fits", feasible=False, throughput_per_s=None,
        usd_per_hour=0.0, usd_per_million_tokens=None, latency_s=None, memory_bytes={})
