import json

import numpy as np
import pytest

from tessera.cli import main
from tessera.contracts.results import CONTRACT_KEYS
from tessera.errors import UserError
from tessera.sim.workload import LengthSpec, WorkloadSpec, generate, traces


def test_length_parsing_and_errors():
    assert LengthSpec.parse("128") == LengthSpec(lo=128, hi=128)
    assert LengthSpec.parse("64-512") == LengthSpec(lo=64, hi=512)
    assert LengthSpec.parse("azure_code_2023").trace == "azure_code_2023"
    with pytest.raises(UserError, match="traces: azure_code_2023, azure_conv_2023"):
        LengthSpec.parse("sharegpt")
    with pytest.raises(UserError, match="rate"):
        WorkloadSpec(kind="poisson", requests=3)


def test_trace_rows_are_drawn_jointly():
    w = WorkloadSpec(requests=500, prompt=LengthSpec(trace="azure_conv_2023"),
                     output=LengthSpec(trace="azure_conv_2023"))
    r = generate(w, seed=1)
    rows = {tuple(x) for x in traces()["azure_conv_2023"].tolist()}
    assert all((p, o) in rows for p, o in zip(r.prompt.tolist(), r.output.tolist(), strict=True))


def test_arrival_processes():
    pois = generate(WorkloadSpec(kind="poisson", requests=20000, rate_per_s=50.0), seed=0).arrival_s
    assert 20000 / pois[-1] == pytest.approx(50.0, rel=0.03)
    onoff = generate(WorkloadSpec(kind="bursty", burst="onoff", on_s=1.0, off_s=3.0, requests=4000,
                                  rate_per_s=10.0), seed=0).arrival_s
    assert np.all(np.mod(onoff, 4.0) <= 1.0 + 1e-9)  # nothing arrives in an off-period
    gam = generate(WorkloadSpec(kind="bursty", requests=20000, rate_per_s=10.0, burst_cv=3.0), seed=0).arrival_s
    gaps = np.diff(gam)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


@pytest.mark.slow  # imports every stage's CLI (torch) and matplotlib
def test_cli_json_contract_trace_and_gantt(tmp_path, capsys, shared_pair_plan):
    p = tmp_path / "plan.json"
    shared_pair_plan.save(p)
    tr, g = tmp_path / "t.json", tmp_path / "g.png"
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--workload", "poisson", "--rate", "20", "--requests", "50", "--json",
              "--slo-ttft-ms", "200", "--slo-tpot-ms", "40", "--trace", str(tr), "--gantt", str(g)])
    assert e.value.code == 0
    d = json.loads(capsys.readouterr().out)
    assert tuple(d) == (*CONTRACT_KEYS, "provenance") and d["requests"] == 50 and 0 <= d["slo_attainment"] <= 1
    assert (d["provenance"]["rate_per_s"], d["provenance"]["slo_ttft_s"]) == (20, 0.2)
    ev = json.loads(tr.read_text())["traceEvents"]
    cats = {e.get("cat") for e in ev if e["ph"] == "X"}
    assert cats == {"iteration", "compute"}
    assert g.stat().st_size > 1000


def test_cli_bad_input_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(tmp_path / "missing.json")])
    assert e.value.code == 2
    assert "cannot read plan" in capsys.readouterr().err


def test_all_requests_lost_is_one_line_exit_2(tmp_path, capsys):
    """Requests longer than the plan's KV capacity (57,613 tokens here) can never be served: say so."""
    from tessera.sim.handplan import hand_plan

    from .conftest import DECODE, PREFILL

    p = tmp_path / "plan.json"
    hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, kv_capacity_tokens=57_613).save(p)
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--workload", "poisson", "--rate", "2", "--requests", "10", "--prompt", "100000"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "all 10 requests lost" in err and "57,613 tokens" in err
    assert "Traceback" not in err


def test_a_rate_far_beyond_capacity_is_said(tmp_path, capsys, plan):
    p = tmp_path / "plan.json"
    plan.save(p)
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--workload", "poisson", "--rate", "1e9", "--requests", "20", "--json"])
    assert e.value.code == 0
    assert "× the plan's predicted capacity" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--workload", "poisson", "--rate", "inf", "--requests", "20"])
    assert e.value.code == 2 and "finite --rate" in capsys.readouterr().err
