"""compare.md statements from hand-made cells (no capture): gains, the 2×H100 headline, the chosen column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.contracts.study import CompareRow
from tessera.errors import UserError
from tessera.plan import STRATEGIES, PlannerConfig
from tessera.study.compare import check_matrix_context, gains, markdown, run_compare


def _cell(gpus: list[str], usd: float, good: dict[str, float], chosen: str, ref_per_usd: float) -> dict:
    return {"model": "m", "gpus": gpus, "chosen": chosen, "images": False, "bound_ratio": None, "solve_s": 0.1,
            "strategies": {n: {"goodput_tokens_per_s": good[n], "usd_per_hour": usd,
                               "tokens_per_usd": good[n] * 3600 / usd, "applicable": True,
                               "feasible": good[n] > 0, "reason": None, "batch": 8, "microbatches": 1}
                           for n in STRATEGIES},
            "best_homogeneous_same_budget": {"gpus": [gpus[0]] * 2, "goodput": 1.0, "usd_per_hour": 1.0,
                                             "tokens_per_usd": ref_per_usd, "tp": [1, 1]},
            "reference": {"gpus": ["H100-SXM"] * 2, "goodput": 100.0, "usd_per_hour": 5.98,
                          "tokens_per_usd": 100.0 * 3600 / 5.98, "tp": [1, 1]},
            "placement": {}}


def test_gains_and_headline_by_hand() -> None:
    # pair at $4.09/h: Tessera 150 tok/s, best baseline prefill_decode 75 -> 2.00x; tokens per $: 150·3600/4.09
    # = 132,029 against a same-size homogeneous 66,000 -> 2.00x. 2×H100 serves 100 at $5.98: the pair is
    # faster and cheaper.
    het = _cell(["H100-SXM", "L40S"], 4.09, {"tessera": 150.0, "homogeneous": 60.0, "prefill_decode": 75.0,
                                              "attention_ffn": 0.0, "layer_pipeline": 50.0}, "milp", 66_000.0)
    tie = _cell(["A100-80GB-SXM", "L40S"], 3.0, {"tessera": 60.0, "homogeneous": 60.0, "prefill_decode": 30.0,
                                                  "attention_ffn": 0.0, "layer_pipeline": 40.0}, "homogeneous",
                72_000.0)
    g = gains([het, tie])
    assert [round(x[0], 3) for x in g] == [2.0, 1.0]
    assert round(g[0][1], 3) == round(150 * 3600 / 4.09 / 66_000, 3) == 2.0
    md = markdown([het, tie], PlannerConfig(), 1.0)
    assert "| goodput vs best baseline | 2.00× (m on H100-SXM+L40S) | 1.50× | 1.00× | up to 2.3× |" in md
    assert "Tessera's choice: milp in 1 cell, homogeneous in 1 cell." in md
    assert "- **m**: yes. H100-SXM+L40S: 150.0 vs 100.0 (faster), $4.09/h vs $5.98/h (cheaper)" in md


def test_compare_rows_round_trip_the_committed_compare_json_byte_for_byte() -> None:
    # golden equality: the typed row writes exactly what the untyped writer wrote to bench/results
    cells = json.loads((Path(__file__).parents[2] / "bench/results/compare.json").read_text())["cells"]
    assert cells
    for c in cells:
        assert json.dumps(CompareRow.from_dict(c).to_dict(), indent=1) == json.dumps(c, indent=1)
    failed = {"model": "m", "gpus": ["H100-SXM", "L40S"], "error": "no plan", "wall_s": 0.5}
    assert CompareRow.from_dict(failed).to_dict() == failed


def test_the_matrix_refuses_a_request_too_long_for_llama_3_8b_before_planning() -> None:
    # llama-3-8b, the matrix's first model, has 8192 positions (its published config.json)
    with pytest.raises(UserError, match="exceed llama-3-8b's context window of 8,192 tokens"):
        check_matrix_context(8000, 193)
    check_matrix_context(None, 10**6)  # a trace length: not a fixed number, not checked


def test_compare_in_two_processes_equals_one(tmp_path: Path) -> None:
    # golden equality: the matrix planned by two worker processes (one model each) gives the rows one process
    # gives, in matrix order, timings aside
    def view(rows: list[CompareRow]) -> list[dict]:
        out = []
        for r in rows:
            d = r.to_dict()
            d.pop("wall_s", None)
            d.pop("solve_s", None)
            out.append(d)
        return out

    cfg = PlannerConfig(microbatches=(1, 2), time_limit_s=2.0)
    models, pools = ("llama-tiny", "mamba2-tiny"), ("H100,L40S", "A100,L40S")
    one, _ = run_compare(out_dir=tmp_path / "one", cfg=cfg, quick=True, knee=False, models=models, pools=pools,
                         jobs=1)
    two, md = run_compare(out_dir=tmp_path / "two", cfg=cfg, quick=True, knee=False, models=models, pools=pools,
                          jobs=2)
    assert [(r.model, r.gpus[1]) for r in two] == [(m, "L40S") for m in models for _ in pools]
    assert view(two) == view(one)
    written = json.loads((tmp_path / "two" / "compare.quick.json").read_text())
    assert written["jobs"] == 2 and written["cpu_s"] > 0 and "2 processes" in md
    with pytest.raises(UserError, match="--jobs 0"):
        run_compare(out_dir=tmp_path, cfg=cfg, quick=True, models=models, jobs=0)
