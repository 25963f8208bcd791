"""`tessera report --plan` takes a pool plan file too: its plan sections show the pool's first cell."""

from __future__ import annotations

import pytest

from tessera.cli import main
from tessera.contracts.plan import PoolCell, PoolPlan
from tessera.sim.handplan import PhaseCost, hand_plan


def test_report_takes_a_pool_plan_file(tmp_path) -> None:
    cost = {"prefill": PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,)),
            "decode": PhaseCost(fixed_s=0.02, per_token_s=1e-4)}
    fast = hand_plan(phases=cost, gpus=("H100-SXM",), usd_per_hour=3.0, kv_capacity_tokens=123_456)
    slow = hand_plan(phases=cost, gpus=("L40S",), usd_per_hour=1.0)
    PoolPlan(cells=(PoolCell(plan=fast, count=1), PoolCell(plan=slow, count=2))).save(tmp_path / "pool.json")
    with pytest.raises(SystemExit) as e:
        main(["report", "-q", "--plan", str(tmp_path / "pool.json"), "--out-dir", str(tmp_path / "out")])
    assert e.value.code == 0
    page = (tmp_path / "out" / "report.html").read_text()
    # the memory section's facts are the lead cell's own (its KV capacity, not the slow cell's 1,000,000)
    assert "KV capacity 123,456 tokens" in page and 'alt="pipeline gantt"' in page
