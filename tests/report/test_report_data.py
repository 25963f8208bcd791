"""Parsing the plan/sim JSON contracts, gains worked by hand, terminal tables."""

from __future__ import annotations

import json

import pytest
from report_inputs import compare_cells, sim_result, toy_plan
from rich.console import Console

from tessera.errors import UserError
from tessera.report.data import load_compare, load_sim, parse_cell
from tessera.report.tables import compare_table, kernels_per_device, plan_rows, plan_summary_table, sim_table


def _cell(strategies: dict) -> dict:
    return {"model": "m", "gpus": ["H100-SXM", "L40S"], "strategies": strategies}


def test_gains_worked_by_hand() -> None:
    cells = [parse_cell(c, "t") for c in compare_cells()]
    # llama on H100+L40S: 3000 over attention_ffn's 2500, same $/h on both sides
    assert cells[0].best_baseline().name == "attention_ffn"
    assert cells[0].speedup() == pytest.approx(1.2)
    assert cells[0].cost_gain() == pytest.approx(1.2)
    # H100+A100: prefill_decode is infeasible and is skipped, best is attention_ffn 3300
    assert cells[1].speedup() == pytest.approx(3600 / 3300)
    assert cells[3].unit == "images/s" and cells[3].speedup() == pytest.approx(1.5 / 1.3)
    # a cheaper baseline: 3000 tok/s at $4/h vs 2000 at $2/h -> 1.5x throughput, 750/1000 = 0.75x per dollar
    c = parse_cell(_cell({"tessera": {"applicable": True, "throughput_tokens_per_s": 3000, "usd_per_hour": 4},
                          "homogeneous": {"applicable": True, "throughput_tokens_per_s": 2000, "usd_per_hour": 2},
                          "attention_ffn": {"applicable": False, "reason": "x", "usd_per_hour": 1}}), "t")
    assert c.speedup() == pytest.approx(1.5) and c.cost_gain() == pytest.approx(0.75)


def test_no_scored_baseline_gives_no_gain() -> None:
    c = parse_cell(_cell({"tessera": {"applicable": True, "throughput_tokens_per_s": 10, "usd_per_hour": 1},
                          "prefill_decode": {"applicable": False, "reason": "diffusion", "usd_per_hour": 1}}), "t")
    assert c.best_baseline() is None and c.speedup() is None and c.cost_gain() is None


def test_strategies_in_canonical_order_and_single_plan_object(tmp_path) -> None:
    d = compare_cells()[0]
    d["strategies"] = dict(reversed(d["strategies"].items()))
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(d))  # `tessera plan --json` prints one object, not a list
    (cell,) = load_compare(p)
    assert list(cell.strategies) == ["tessera", "homogeneous", "prefill_decode", "attention_ffn", "layer_pipeline"]


@pytest.mark.parametrize(("text", "msg"), [
    ("{bad", "is not JSON"),
    ("[]", "holds no cells"),
    ('[{"model": "m"}]', "expected an object with model, gpus and strategies"),
    ('[{"model": "m", "gpus": ["A"], "strategies": {"tessera": {"applicable": true, "usd_per_hour": "x"}}}]',
     "strategy 'tessera': field 'usd_per_hour' must be a number, got 'x'"),
])
def test_bad_compare_files_are_one_line_user_errors(tmp_path, text: str, msg: str) -> None:
    p = tmp_path / "c.json"
    p.write_text(text)
    with pytest.raises(UserError, match=msg) as e:
        load_compare(p)
    assert "\n" not in str(e.value)


def test_sim_labels_and_errors(tmp_path) -> None:
    p = tmp_path / "sim_tessera.json"
    p.write_text(json.dumps(sim_result(2.0)))
    s = load_sim(str(p))
    assert s.label == "tessera" and s.result.tpot_s["p99"] == pytest.approx(0.08) and s.result.e2e_s["p50"] == 2.0
    assert load_sim(f"pd on A100={p}").label == "pd on A100"
    bad = sim_result(1.0)
    del bad["ttft_s"]["p90"]
    p.write_text(json.dumps(bad))
    with pytest.raises(UserError, match="ttft_s: field 'p90' must be a number"):
        load_sim(str(p))
    with pytest.raises(UserError, match="cannot read simulator result file"):
        load_sim(str(tmp_path / "missing.json"))


def test_plan_rows_by_hand() -> None:
    plan = toy_plan()
    assert kernels_per_device(plan) == [{"decode": 6}, {"decode": 9}]
    rows = plan_rows(plan)
    # d1: 12 GB weights + 30 GB kv + 0.5 GB activations = 42.5 of 48 GB (89%)
    assert rows[1] == ["d1", "L40S", "12.0", "30.0", "0.0", "0.5", "42.5 / 48.0 (89%)", "decode 9"]


def test_tables_render_with_reasons_and_gains() -> None:
    cells = [parse_cell(c, "t") for c in compare_cells()]
    con = Console(width=200, record=True)
    con.print(compare_table(cells))
    con.print(plan_summary_table(toy_plan()))
    con.print(sim_table([load_sim_dict(1.0)]))
    out = con.export_text()
    assert "n/a [2]" in out and "[2] n/a: SSM has no attention block" in out
    assert "infeasible [1]" in out and "[1] infeasible: decode side needs 12.3 GB more" in out
    assert "1.20× vs attention_ffn" in out and "1.15× images per $" in out
    assert "3,000 tok/s" in out and "1.5 img/s" in out
    assert "42.5 / 48.0 (89%)" in out and "plan/bound 0.980" in out
    assert "100.0 / 400.0" in out and "10.00 / 40.00" in out  # TTFT, TPOT p50/p99 in ms


def load_sim_dict(scale: float):
    from tessera.report.data import parse_sim
    return parse_sim(sim_result(scale), "tessera", "t")
