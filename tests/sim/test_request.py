"""`tessera simulate` as one call: simulate_file(SimRequest) on hand-built plans whose capacity is worked out
by hand (tests/sim/conftest.py), and its result equal to the simulator's own entry point."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tessera.contracts.results import CONTRACT_KEYS
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim import KneeConfig, LengthSpec, SchedulerConfig, WorkloadSpec, find_knee, simulate
from tessera.sim.handplan import hand_plan
from tessera.sim.request import SimOutcome, SimRequest, lost_text, simulate_file

from .conftest import DECODE, PREFILL


@pytest.fixture
def plan_file(tmp_path: Path, plan) -> Path:
    p = tmp_path / "plan.json"
    plan.save(p)
    return p


@pytest.mark.parametrize(("fields", "message"), [
    ({"slo_ttft_ms": 0.0}, "--slo-ttft-ms 0 must be a positive time in milliseconds"),
    ({"slo_target": 0.95}, "add --knee or drop --slo-target"),
    ({"knee": True, "slo_target": 1.5}, "--slo-target 1.5 must be a share of requests in (0, 1]"),
    ({"trace": Path("t.json"), "trace_window_s": "5:1"}, "START must be >= 0 and below END"),
    ({"window_s": 0.0}, "--window-s 0 must be a positive time in seconds"),
    ({"adaptive": True}, "--adaptive needs --latency-plan P.json"),
    ({"fail_at_s": 1.0, "fail_replacement": "other"}, "unknown --fail-replacement 'other'; valid: none, same"),
    ({"prompt": "sharegpt"}, "traces: azure_code_2023, azure_conv_2023"),
])
def test_a_request_refuses_a_bad_flag_before_the_plan_is_read(fields: dict, message: str) -> None:
    with pytest.raises(UserError) as e:
        SimRequest(plan_path=Path("no-such-plan.json"), **fields)  # the file is never opened
    assert message in str(e.value)


def test_the_result_is_the_simulators_own_for_the_same_workload(plan_file: Path, plan) -> None:
    req = SimRequest(plan_path=plan_file, rate_per_s=20.0, requests=50, seed=3, slo_ttft_ms=200.0)
    o = simulate_file(req)
    # a rate alone is poisson; a plan that names no traffic is served 512-token prompts, 128-token outputs
    spec = WorkloadSpec(kind="poisson", requests=50, rate_per_s=20.0, prompt=LengthSpec(lo=512, hi=512),
                        output=LengthSpec(lo=128, hi=128))
    assert o.workload == spec and o.knee is None and o.notes == () and o.refusal is None
    assert o.result is not None
    assert o.result.to_json() == simulate(plan, spec, seed=3, slo=LatencyTargets(ttft_s=0.2)).to_json()
    prov = o.provenance
    assert (prov.workload, prov.rate_per_s, prov.seed, prov.slo_ttft_s, prov.prompt, prov.output) == \
        ("poisson", 20.0, 3, 0.2, "512", "128")
    d = o.to_json()
    assert tuple(d) == (*CONTRACT_KEYS, "provenance") and json.loads(json.dumps(d)) == d
    assert "detail" in o.to_json(detail=True)


def test_a_rate_far_beyond_capacity_is_a_note(plan_file: Path) -> None:
    # decode at its largest batch, 128: 20 ms + 128 × 100 µs = 32.8 ms per step, 128 tokens each =
    # 3,902 tokens/s; at 128 output tokens a request, 1 / 0.0328 = 30.49 req/s; 1e9 / 30.49 = 32,800,000
    o = simulate_file(SimRequest(plan_path=plan_file, rate_per_s=1e9, requests=20))
    assert o.notes == ("--rate 1e+09 req/s is 32,800,000× the plan's predicted capacity (30.49 req/s): the "
                       "queue grows for the whole run",)


def test_a_plan_without_goodput_and_no_rate_is_served_offline_without_a_note(plan_file: Path) -> None:
    o = simulate_file(SimRequest(plan_path=plan_file, requests=20))
    assert o.workload is not None and o.workload.kind == "offline" and o.notes == ()
    assert o.load is None and o.provenance.rate_per_s is None


def test_every_request_lost_is_a_refusal_not_an_exception(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, kv_capacity_tokens=57_613).save(p)
    o = simulate_file(SimRequest(plan_path=p, rate_per_s=2.0, requests=10, prompt="100000"))
    assert o.result is not None and o.result.lost == 10
    assert o.refusal == ("all 10 requests lost: prompt + output (100000 + 128 tokens) exceed the plan's KV "
                         "capacity of 57,613 tokens per cell; give shorter requests or a plan with more memory "
                         "for KV")


def test_a_failure_that_leaves_no_replica_says_so() -> None:
    spec = WorkloadSpec(requests=1)
    assert lost_text(spec, 1000, stranded=True).startswith("the failure left no replica to serve them")


def test_the_context_check_is_given_the_plans_model_and_fixed_lengths(plan_file: Path) -> None:
    seen: list[tuple] = []
    simulate_file(SimRequest(plan_path=plan_file, requests=10, check_context=lambda *a: seen.append(a)))
    simulate_file(SimRequest(plan_path=plan_file, requests=10, prompt="azure_conv_2023", output="64-256",
                             check_context=lambda *a: seen.append(a)))
    assert seen == [("hand", 512, 128), ("hand", None, 256)]  # a trace has no one length; a range its top


def test_chunked_prefill_on_a_two_phase_plan_needs_no_note(plan_file: Path) -> None:
    o = simulate_file(SimRequest(plan_path=plan_file, requests=10,
                                 scheduler=SchedulerConfig(chunked_prefill=True)))
    assert o.notes == ()


def test_the_knee_is_find_knees_and_its_provenance_names_it(plan_file: Path, plan) -> None:
    o = simulate_file(SimRequest(plan_path=plan_file, knee=True, requests=50, seed=4, slo_ttft_ms=200.0,
                                 slo_tpot_ms=40.0))
    assert o.knee is not None and o.result is None and o.workload is None
    want = find_knee(plan, prompt=LengthSpec(lo=512, hi=512), output=LengthSpec(lo=128, hi=128),
                     slo=LatencyTargets(ttft_s=0.2, tpot_s=0.04), scheduler=SchedulerConfig(),
                     config=KneeConfig(target=0.9, requests=50, seeds=(4, 5)))
    assert {**asdict(o.knee), "wall_s": 0} == {**asdict(want), "wall_s": 0}  # wall_s: real seconds
    assert (o.provenance.rate_per_s, o.provenance.slo_target, o.provenance.workload) == \
        (want.rate_per_s, 0.9, "poisson")
    assert set(o.to_json()) == {*want.to_dict(), "provenance"}


def test_an_outcome_holds_a_result_or_a_knee(plan_file: Path) -> None:
    o = simulate_file(SimRequest(plan_path=plan_file, requests=10))
    with pytest.raises(ValueError, match="not both nor neither"):
        SimOutcome(plan=o.plan, provenance=o.provenance)
