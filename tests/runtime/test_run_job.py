"""`tessera run` as one call: run_job(RunRequest) refuses what it cannot run before any worker starts, and
a real run of the tiny Llama on two CPU workers verifies against single-process execution."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import UserError
from tessera.runtime.api import RunOutcome, RunRequest, run_job
from tessera.sim.handplan import PhaseCost, hand_plan

# one phase of closed-form costs: enough for a Plan file with two devices
DECODE = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64), contexts=(0,))


def test_a_wrong_weights_folder_is_refused_by_the_request(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        RunRequest(target="llama-tiny", devices=("cpu", "cpu"), weights_dir=str(tmp_path / "none"))


def test_a_plan_for_two_devices_on_one_is_refused_before_capture(tmp_path: Path) -> None:
    p = tmp_path / "plan.json"
    hand_plan(phases={"decode": DECODE}, gpus=("H100-SXM", "L40S")).save(p)
    with pytest.raises(ValueError) as e:
        run_job(RunRequest(target=str(p), devices=("cpu",)))
    assert str(e.value) == f"plan {p} has 2 devices but --devices names 1"


def test_an_outcome_without_a_result_says_why() -> None:
    with pytest.raises(ValueError, match="must say why"):
        RunOutcome(result=None)


@pytest.mark.slow  # two worker processes import torch and run the tiny model
def test_a_tiny_run_on_two_workers_is_verified() -> None:
    o = run_job(RunRequest(target="llama-tiny", devices=("cpu", "cpu"), requests=2, prompt=4, output=2,
                           verify=True))
    assert o.error is None and o.result is not None
    r = o.result
    assert r.verified and r.tokens_identical and r.max_abs_diff == 0.0
    # 2 requests of batch 1, one micro-batch each, both in one round of 2 micro-batches; 2 greedy tokens each
    # (the prefill's and one decode position's): the round is 2 steps
    assert r.devices == ("cpu", "cpu") and r.extra.model == "llama-tiny" and r.extra.steps == 2
    assert [[len(row) for row in t] for t in r.extra.tokens] == [[2], [2]]
