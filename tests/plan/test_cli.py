"""`tessera plan`: one table / the JSON contract; user mistakes are one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TESSERA = [sys.executable, "-m", "tessera"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TESSERA, *args], capture_output=True, text=True, timeout=300)


def test_unknown_gpu_is_one_line_exit_2() -> None:
    r = _run("plan", "llama-tiny", "--gpus", "H100,NOPE")
    assert r.returncode == 2
    assert "unknown GPU 'NOPE'" in r.stderr and "H100-SXM" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_infeasible_pool_exit_2_says_how_many_gb() -> None:
    r = _run("plan", "llama-3-70b", "--gpus", "L40S,L40S")
    assert r.returncode == 2 and "GB short" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_plan_json_contract_on_tiny_capture(tmp_path) -> None:
    r = _run("plan", "llama-tiny", "--gpus", "h100,L40S", "--batch", "2", "--prompt", "16", "--output", "8",
             "--json", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["model"] == "llama-tiny" and j["gpus"] == ["H100-SXM", "L40S"]
    assert set(j["strategies"]) == {"tessera", "homogeneous", "prefill_decode", "attention_ffn", "layer_pipeline"}
    t = j["strategies"]["tessera"]["throughput_tokens_per_s"]
    for name, s in j["strategies"].items():
        if s["applicable"] and s["feasible"]:
            assert t >= s["throughput_tokens_per_s"] * (1 - 1e-9), name
            if s["pool"] is None:  # the JSON carries the gain, clamped never below 1 (sync_period_s)
                assert s["sync_throughput_tokens_per_s"] > 0 and s["async_gain"] >= 1 - 1e-9, name
    assert (tmp_path / "p.json").exists()


@pytest.mark.slow
def test_serving_plan_runs_bit_exact_on_cpu_workers(tmp_path) -> None:
    """A serving-model plan (the mixed iteration's placement) carried onto the runtime's prefill and decode
    programs: outputs identical to single-process execution."""
    from tessera.plan.model.serving import Traffic
    from tessera.plan.search import PlannerConfig, plan_serving

    r = plan_serving("llama-tiny", "H100,L40S", PlannerConfig(traffic=Traffic(prompt=16, output=8)))
    plan = r.strategies["layer_pipeline"].plan
    assert plan is not None and set(plan.phases["mixed"].assignment) == {0, 1}  # a real split
    plan.save(tmp_path / "p.json")
    out = _run("run", str(tmp_path / "p.json"), "--devices", "cpu,cpu", "--verify", "--json")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    assert j["verified"] and j["max_abs_diff"] == 0.0


def test_an_slo_no_configuration_meets_is_one_line_exit_2() -> None:
    r = _run("plan", "llama-tiny", "--gpus", "H100,L40S", "--prompt", "16", "--output", "8", "--slo-tpot-ms", "0.0001")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # the search's progress lines come first (stderr, piped); the error is the one line that ends it
    lines = r.stderr.strip().splitlines()
    assert all(x.startswith("plan llama-tiny on H100,L40S: ") for x in lines[:-1])
    line = lines[-1]
    assert line.startswith("error: no configuration of llama-tiny")
    assert "meets TTFT ≤ 2 s and TPOT ≤ 0.0001 ms" in line and "TPOT" in line.split(":", 2)[2]
    # it leads with the point nearest to the SLO and what binds there, with the time unloaded
    near = line.split("; nearest: ", 1)[1]
    assert "ms > SLO 0.0001 ms unloaded (batch " in near and ": TPOT binds" in near


def test_a_nonsense_slo_is_one_line_exit_2() -> None:
    r = _run("plan", "llama-tiny", "--gpus", "H100,L40S", "--slo-ttft-ms", "-5")
    assert r.returncode == 2 and "--slo-ttft-ms -5 must be a positive time" in r.stderr and "Traceback" not in r.stderr


def test_plan_prints_progress_lines_when_piped() -> None:
    """Issue 17, defect 11: `plan` says what it is doing; piped, one line per step on stderr (stdout stays JSON)."""
    r = _run("plan", "llama-tiny", "--gpus", "H100,L40S", "--prompt", "16", "--output", "8", "--json")
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    steps = [x for x in r.stderr.splitlines() if x.startswith("plan llama-tiny on H100,L40S: ")]
    assert any("capture llama-tiny" in x for x in steps) and any("the MILP" in x for x in steps)
    assert steps[-1].split(": ", 1)[1].startswith("done in")
