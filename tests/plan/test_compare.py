"""compare.md statements from hand-made cells (no capture)."""

from __future__ import annotations

from tessera.plan.compare import markdown
from tessera.plan.planner import STRATEGIES
from tessera.plan.pool import Workload


def _cell(gpus: list[str], usd: float, thr: dict[str, float | None]) -> dict:
    return {"model": "m", "gpus": gpus, "mode": "throughput", "strategies": {
        n: {"applicable": True, "feasible": thr[n] is not None, "throughput_tokens_per_s": thr[n],
            "usd_per_hour": usd, "reason": None} for n in STRATEGIES}}


def test_gain_and_headline_by_hand() -> None:
    ref = _cell(["H100-SXM", "H100-SXM"], 5.98, dict.fromkeys(STRATEGIES, 100.0))
    het = _cell(["H100-SXM", "L40S"], 4.09, {"tessera": 150.0, "homogeneous": 60.0, "prefill_decode": 75.0,
                                              "attention_ffn": None, "layer_pipeline": 50.0})
    md = markdown([het, ref], Workload())
    assert "2.00x thr" in md  # 150 / 75
    assert "Tessera below a baseline in: no cell" in md
    assert "- m: yes, H100-SXM+L40S (Tessera) 150.0 vs 2xH100 best 100.0" in md
