"""The planner's goodput against the simulator's SLO knee (tessera.study.agreement, summarised by tessera.report.agreement)."""

from __future__ import annotations

import pytest

from tessera.contracts.study import CheckSummary, KneeCheck
from tessera.report.agreement import summary, summary_line
from tessera.study.agreement import knee_check


def test_summary_counts_by_hand() -> None:
    # 0.95 is within 10% of the planner, 1.12 and 0.80 are not; an error counts apart, None is skipped
    checks = [KneeCheck(planner_per_s=1.0, ratio=r) for r in (0.95, 1.12, 0.80)]
    s = summary([*checks, KneeCheck(planner_per_s=1.0, error="x"), None])
    assert (s.checked, s.within, s.min, s.median, s.max, s.errors) == (3, 1, 0.80, 0.95, 1.12, 1)
    assert "1 of 3 strategies within 10%" in summary_line(s)
    assert summary([None]) == CheckSummary(checked=0) and summary([None]).to_dict() == {"checked": 0}


def test_nothing_served_is_not_checked() -> None:
    assert knee_check(None, 100.0) is None


@pytest.mark.slow
def test_one_h100_serving_llama_3_8b_agrees_with_the_simulator() -> None:
    # the planner's closed form and the simulator's own engine (bisection over simulated Poisson runs) on
    # the same deployment: within the 10% the study holds every strategy to
    from tessera.plan import PlannerConfig, plan_serving

    r = plan_serving("llama-3-8b", "H100", PlannerConfig())
    t = r.tessera
    c = knee_check(t.deployment, t.goodput)
    assert c is not None and c.planner_per_s == t.goodput
    assert c.ratio == pytest.approx(1.0, abs=0.10)
