"""Heterogeneous pools and device loss (issue 8): hand-built plans, expected figures worked out by hand."""

import json

import numpy as np
import pytest

from tessera.cli import main
from tessera.errors import UserError
from tessera.sim import Failure, LengthSpec, SchedulerConfig, WorkloadSpec, simulate, simulate_pool
from tessera.sim.handplan import PhaseCost, hand_plan

# prefill nearly free (1 ms + 0.1 µs/token) so throughput is decode: 20 ms + 100 µs/sequence at batch <= 128
CHEAP_PF = PhaseCost(fixed_s=0.001, per_token_s=1e-7, tokens=(128, 16384), contexts=(128,))
DECODE = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128), contexts=(0,))
SLOW_DECODE = PhaseCost(fixed_s=0.04, per_token_s=2e-4, tokens=(1, 64, 128), contexts=(0,))  # 2x slower


def fixed(n: int, prompt: int, output: int, kind: str = "offline", rate: float = 0.0) -> WorkloadSpec:
    return WorkloadSpec(kind=kind, requests=n, rate_per_s=rate, prompt=LengthSpec(lo=prompt, hi=prompt),
                        output=LengthSpec(lo=output, hi=output))


def cell(decode: PhaseCost = DECODE, **kw):
    return hand_plan(phases={"prefill": CHEAP_PF, "decode": decode}, **kw)


def pair_cell():
    """Both phases on both devices (device 1 at half the busy time): one shared lane, as fast as cell()."""
    pf = PhaseCost(fixed_s=0.001, per_token_s=1e-7, tokens=(128, 16384), contexts=(128,), busy_share=(1.0, 0.5))
    dc = PhaseCost(fixed_s=0.02, per_token_s=1e-4, tokens=(1, 64, 128), contexts=(0,), busy_share=(1.0, 0.5))
    return hand_plan(phases={"prefill": pf, "decode": dc}, gpus=("H100-SXM", "L40S"), usd_per_hour=3.0)


def test_losing_a_replica_loses_nothing_and_dip_recovery_match_hand_bounds():
    plan = cell()
    w = fixed(1024, 128, 256)  # offline: 512 per replica, waves of 128 x 256 tokens, 8.37 s a wave
    f = Failure(at_s=10.0, replica=1, replacement=(plan, 1), replan_s=4.0)
    r = simulate_pool([(plan, 2)], w, failures=[f], window_s=1.0)
    assert (r.requests, r.completed, r.lost) == (1024, 1024, 0)
    rep = r.failures[0]
    # at 10 s replica 1 is in its second wave: 128 decoding + 256 still queued
    assert rep.requeued == 384
    # before: two replicas at batch 128 = 2·128/0.0328 = 7805 tokens/s; while down: one replica, half
    full = 2 * 128 / (0.02 + 1e-4 * 128)
    assert rep.pre_per_s == pytest.approx(full, rel=0.02)
    assert 0.45 <= rep.dip <= 0.5  # a 1 s window holds 30 or 31 steps of 128 tokens: 3840..3968
    # the spare joins at 14 s, takes half the queue, prefills in ms: back at full rate in that window
    assert rep.steady_per_s == pytest.approx(full, rel=0.03)
    assert 4.0 <= rep.recovery_s <= 5.0
    # every generated token is in the series exactly once (tokens generated before the loss are kept)
    assert sum(r.series_per_s) * r.series_window_s == pytest.approx(1024 * 256)
    assert sum(r.replica_completed) == 1024 and r.replica_completed[2] > 0


def test_without_replacement_the_pool_runs_on_and_recovers_at_its_new_level():
    plan = cell()
    f = Failure(at_s=10.0, replica=1, replacement=None, replan_s=4.0)  # replan_s unused without cells
    r = simulate_pool([(plan, 2)], fixed(1024, 128, 256), failures=[f], window_s=1.0)
    assert (r.completed, r.lost) == (1024, 0)
    rep = r.failures[0]
    half = 128 / (0.02 + 1e-4 * 128)
    assert rep.steady_per_s == pytest.approx(half, rel=0.03)
    assert rep.recovery_s == 0.0  # the first window after the loss is already at the new level
    assert rep.dip == pytest.approx(0.5, abs=0.03)


def test_a_pool_with_no_survivor_holds_requests_until_the_replacement_joins():
    pair, single = pair_cell(), cell()
    w = fixed(300, 128, 32, "poisson", 20.0)
    f = Failure(at_s=3.0, replica=0, replacement=(single, 1), replan_s=2.0)
    r = simulate_pool([(pair, 1)], w, failures=[f], window_s=0.5)
    assert (r.completed, r.lost) == (300, 0)
    assert r.replica_completed[1] > 0
    # nothing serves between 3 s and 5 s: four empty windows, so the dip is to zero
    mid_s = r.series_start_s + r.series_window_s * (np.arange(len(r.series_per_s)) + 0.5)
    series = np.array(r.series_per_s)
    assert np.all(series[(mid_s > 3.25) & (mid_s < 4.75)] == 0)
    assert series[mid_s < 2.75].min() > 0 and series[(mid_s > 5.25) & (mid_s < 8)].min() > 0
    assert r.failures[0].dip == 0.0
    # latency counts from the original arrival: requests that arrived during the outage waited for the join
    assert r.ttft_s["p99"] > 1.8 and r.e2e_s["p99"] > 2.0
    assert r.failures[0].recovery_s >= 2.0


def test_failure_runs_are_deterministic():
    plan = pair_cell()
    w = WorkloadSpec(kind="bursty", requests=500, rate_per_s=40, prompt=LengthSpec(trace="azure_conv_2023"),
                     output=LengthSpec(trace="azure_conv_2023"))
    fails = [Failure(at_s=4.0, replica=2, replacement=(cell(), 2), replan_s=1.5)]

    def go(seed: int) -> dict:
        d = simulate_pool([(plan, 4)], w, seed=seed, failures=fails).to_dict()
        d["detail"].pop("runtime_s")
        return d

    a, b, c = go(3), go(3), go(4)
    assert a == b and a != c
    assert a["lost"] == 0 and a["completed"] == 500


def test_fast_cell_serves_proportionally_more_than_slow_cell():
    slow, fast = cell(SLOW_DECODE), cell()
    # offline: all 2000 routed at t=0 by outstanding x weight, weights slow 2, fast 1 -> fast gets 2/3.
    # The slow cell is listed first, so ties favour it; the speed weighting must win anyway.
    r = simulate_pool([(slow, 1), (fast, 1)], fixed(2000, 128, 64))
    n_slow, n_fast = r.replica_completed
    assert n_slow + n_fast == 2000
    assert abs(n_fast - 2 * n_slow) <= 3  # 667 / 1333 by hand (ties at equal weighted load go to index 0)
    # online at 2/3 of capacity: the fast cell also drains faster, so it gets at least its share
    on = simulate_pool([(slow, 1), (fast, 1)], fixed(2000, 128, 64, "poisson", 60.0))
    assert on.completed == 2000 and on.replica_completed[1] >= 2 * on.replica_completed[0]
    rr = simulate_pool([(slow, 1), (fast, 1)], fixed(2000, 128, 64), router="round_robin")
    assert rr.replica_completed == (1000, 1000)


def test_homogeneous_pool_equals_replicas():
    plan = cell()
    w = fixed(400, 128, 32, "poisson", 40.0)
    a = simulate(plan, w, replicas=3).to_dict()
    b = simulate_pool([(plan, 3)], w).to_dict()
    a["detail"].pop("runtime_s"), b["detail"].pop("runtime_s")
    assert a == b


def test_only_requests_that_fit_nowhere_are_lost():
    small, big = cell(kv_capacity_tokens=1000), cell(kv_capacity_tokens=100_000)
    w = fixed(20, 900, 200)  # 1100 tokens: too big for the small cell, fine for the big one
    assert simulate_pool([(small, 1), (big, 1)], w).lost == 0
    assert simulate_pool([(small, 2)], w).lost == 20
    # the only cell that fits is lost; the replacement does not fit either -> lost, not dropped silently
    f = Failure(at_s=1.0, replica=1, replacement=(small, 1), replan_s=0.5)
    r = simulate_pool([(small, 1), (big, 1)], w, failures=[f])
    assert r.completed + r.lost == 20 and r.lost > 0


def test_bad_failures_are_user_errors():
    plan = cell()
    w = fixed(10, 128, 8)
    with pytest.raises(UserError, match=r"replica 5, which does not exist.*valid: \[0, 1\]"):
        simulate_pool([(plan, 2)], w, failures=[Failure(at_s=1.0, replica=5)])
    with pytest.raises(UserError, match="before it joins"):
        simulate_pool([(plan, 1)], w, failures=[Failure(at_s=1.0, replica=0, replacement=(plan, 1), replan_s=5.0),
                                                Failure(at_s=2.0, replica=1)])
    with pytest.raises(UserError, match="must both be >= 0"):
        Failure(at_s=-1.0, replica=0)
    with pytest.raises(UserError, match="count >= 1"):
        simulate_pool([(plan, 0)], w)
    with pytest.raises(UserError, match="valid: least_loaded, round_robin"):
        simulate_pool([(plan, 1)], w, router="random")
    with pytest.raises(UserError, match="max_num_seqs"):
        simulate_pool([(plan, 1)], w, config=SchedulerConfig(max_num_seqs=0))


@pytest.mark.slow  # imports every stage's CLI (torch)
def test_cli_fail_at_what_if(tmp_path, capsys):
    p = tmp_path / "plan.json"
    cell().save(p)
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--requests", "512", "--prompt", "128", "--output", "256", "--replicas", "2",
              "--fail-at", "10", "--fail-replica", "1", "--fail-replacement", "same", "--fail-replan-s", "4",
              "--window-s", "1", "--json", "--detail"])
    assert e.value.code == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["completed"], d["lost"]) == (512, 0)
    f = d["detail"]["failures"][0]
    assert f["replica"] == 1 and f["requeued"] > 0 and 4.0 <= f["recovery_s"] <= 5.0
    assert d["detail"]["throughput_series"]["window_s"] == 1.0
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(p), "--fail-at", "1", "--fail-replacement", "spare"])
    assert e.value.code == 2
    assert "valid: none, same" in capsys.readouterr().err


def test_the_only_replica_lost_before_any_arrival_loses_every_request():
    # Poisson arrivals start after t = 0.001 s, when the one replica is gone: nothing ever completes. The
    # report's windows then span the arrivals (not a nanosecond cut from an empty span of completions,
    # billions of them), and every request is counted lost.
    w = fixed(20, 128, 8, kind="poisson", rate=20.0)
    r = simulate_pool([(cell(), 1)], w, failures=[Failure(at_s=0.001, replica=0)])
    assert r.completed == 0 and r.lost == 20
    with pytest.raises(UserError, match="more than 1,000,000 windows"):
        simulate_pool([(cell(), 1)], fixed(20, 128, 8), failures=[Failure(at_s=0.01, replica=0)], window_s=1e-12)
