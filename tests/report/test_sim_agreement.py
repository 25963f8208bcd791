"""The study's planner-vs-simulator check: a request that lives long (long outputs at a large batch) ramps
the served rate up over its life, so the run must outlast it several times and be measured after it."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_long_lived_requests_are_measured_after_the_ramp() -> None:
    from tessera.plan.serve import PlannerConfig, plan_serving
    from tessera.plan.serving import Traffic
    from tessera.report.evaluate import SIM_LOAD, SIM_REQUESTS, sim_agreement

    # the study's long-generation shape (256 / 3,072) on Qwen2.5-VL-7B, H100 + H20: ~700 requests in flight
    cfg = PlannerConfig(traffic=Traffic(prompt=256, output=3072), microbatches=(1, 2, 4), time_limit_s=3.0,
                        mip_rel_gap=0.02)
    r = plan_serving("qwen2.5-vl-7b", "H100,H20", cfg)
    t = r.tessera
    assert t.pool is None  # one cell on both GPUs (the study simulates single-cell plans)
    plan, good = t.plan, t.goodput
    a = sim_agreement(plan, cfg, good, False)
    life = plan.ttft_s + 3072 * plan.tpot_s  # first token, then one token per period
    assert a["life_s"] == pytest.approx(life)
    rate = SIM_LOAD * good / 3072  # requests/s
    in_flight = life * rate  # Little's law: requests alive at once
    assert in_flight > SIM_REQUESTS / 6  # long enough lived that 1,500 requests would not outlast six lives
    assert a["requests"] >= 6 * in_flight - 1
    assert a["ratio"] == pytest.approx(1.0, abs=0.05)
