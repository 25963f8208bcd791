"""A plan file's SLO and workload are typed records (PlanSlo, PlanWorkload) whose JSON is what the file held:
the planner writes every field in one order, a hand-written plan only some, and what it leaves out stays out,
so a plan read and written again keeps its text and its fingerprint."""

from __future__ import annotations

import hashlib
import json

import pytest

from tessera.contracts.plan import EngineSettings, PlanSlo, PlanWorkload, read_plan_file
from tessera.contracts.provenance import fingerprint
from tessera.contracts.slo import Slo
from tessera.sim.handplan import StretchCost, mixed_plan
from tessera.sim.traffic import plan_lengths, plan_slo


def hand_dict() -> dict:
    """A hand-made plan as its JSON object."""
    plan = mixed_plan(route=(StretchCost(device=0, fixed_s=0.01, per_decode_s=1e-4),),
                      engine=EngineSettings(max_num_seqs=8, max_num_batched_tokens=256))
    return plan.to_dict()


def sha16(d: dict) -> str:
    """The fingerprint worked out apart from the code: sha256 of the sorted compact JSON, 16 hex digits."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def test_the_planners_records_list_every_field_in_the_files_order() -> None:
    slo = PlanSlo.of(Slo(ttft_s=1.5, tpot_s=0.05))
    assert list(slo.to_dict().items()) == [("ttft_s", 1.5), ("tpot_s", 0.05), ("image_s", 60.0), ("target", 0.9)]
    w = PlanWorkload(batch=8, prompt=24, output=24, steps=28, image_tokens=0)
    assert list(w.to_dict().items()) == [("batch", 8), ("prompt", 24), ("output", 24), ("steps", 28),
                                         ("image_tokens", 0)]


def test_a_hand_written_partial_slo_and_workload_stay_partial(tmp_path) -> None:
    d = {**hand_dict(), "slo": {"tpot_s": 0.05}, "workload": {"prompt": 64, "output": 16}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d, indent=1))
    plan = read_plan_file(path)
    assert plan.slo == PlanSlo(tpot_s=0.05) and plan.workload == PlanWorkload(prompt=64, output=16)
    assert json.dumps(plan.to_dict(), indent=1) == path.read_text()
    assert fingerprint(plan) == sha16(d)
    # the simulator's defaults: the lengths the plan names; TPOT judged, TTFT not (the file names none)
    assert [(s.lo, s.hi) for s in plan_lengths(plan)] == [(64, 64), (16, 16)]
    assert (plan_slo(plan).ttft_s, plan_slo(plan).tpot_s) == (None, 0.05)


def test_a_plan_without_slo_or_workload_writes_them_empty(tmp_path) -> None:
    d = hand_dict()
    del d["slo"], d["workload"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    plan = read_plan_file(path)
    assert (plan.slo, plan.workload) == (PlanSlo(), PlanWorkload())
    assert (plan.to_dict()["slo"], plan.to_dict()["workload"]) == ({}, {})


@pytest.mark.parametrize("key, value, words", [
    ("slo", {"ttft_s": -1}, "plan SLO ttft_s=-1 must be a positive number of seconds"),
    ("slo", {"target": 1.5}, "plan SLO target=1.5 must be a share of requests in (0, 1]"),
    ("slo", {"e2e_s": 3}, "unknown plan SLO field 'e2e_s'; valid: ttft_s, tpot_s, image_s, target"),
    ("workload", {"prompt": 0}, "plan workload prompt=0 must be an integer >= 1"),
    ("workload", {"output": 12.5}, "plan workload output=12.5 must be an integer >= 1"),
    ("workload", [64], "plan workload must be a JSON object, got list"),
])
def test_a_bad_slo_or_workload_is_one_line_naming_it(tmp_path, key, value, words) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**hand_dict(), key: value}))
    with pytest.raises(ValueError) as e:
        read_plan_file(path)
    assert str(e.value) == f"cannot read plan {path}: {words}"
