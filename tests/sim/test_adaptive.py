from dataclasses import replace

import pytest

from tessera.errors import UserError
from tessera.sim import AdaptivePolicy, LatencyTargets, LengthSpec, WorkloadSpec, check_switchable, simulate
from tessera.sim.handplan import PhaseCost, hand_plan

from .conftest import PREFILL

FAST = PhaseCost(fixed_s=0.010, per_token_s=4e-4, tokens=(1, 16, 32), contexts=(0,), microbatches=1)
WIDE = PhaseCost(fixed_s=0.025, per_token_s=5e-5, tokens=(1, 128, 256), contexts=(0,), microbatches=2)


def plans():
    lat = hand_plan(phases={"prefill": PREFILL, "decode": FAST}, mode="latency", kv_capacity_tokens=100_000)
    thr = hand_plan(phases={"prefill": PREFILL, "decode": WIDE}, mode="throughput", kv_capacity_tokens=100_000)
    return lat, thr


def test_identical_placement_is_switchable():
    lat, thr = plans()
    assert check_switchable(thr, lat) == "identical"


def test_both_resident_rule_and_refusal_names_the_device():
    lat, thr = plans()
    small = replace(lat, memory_bytes=({"weight": 8 * 10**9, "kv": 10**9, "activation": 10**9},))
    assert check_switchable(thr, small) == "both-resident"  # (16 + 13.1 + 1) + (8 + 1 + 1) GB <= 80 GB
    big = replace(lat, memory_bytes=({"weight": 60 * 10**9, "kv": 10**9, "activation": 10**9},))
    with pytest.raises(UserError, match=r"device 0 \(H100-SXM\).*GB"):
        check_switchable(thr, big)
    with pytest.raises(UserError, match="different models"):
        check_switchable(thr, replace(lat, model="other"))


def test_policy_hysteresis_and_default_switch_cost():
    lat, thr = plans()
    assert (AdaptivePolicy(latency_plan=lat).high_load, AdaptivePolicy(latency_plan=lat).low_load) == (32, 16)
    p = AdaptivePolicy(latency_plan=lat, high_load=4, low_load=1)
    assert p.target("latency", 3) == "latency" and p.target("latency", 4) == "throughput"
    assert p.target("throughput", 2) == "throughput" and p.target("throughput", 1) == "latency"
    # the slowest one-micro-batch latency of either plan's decode points
    assert p.switch_cost_s(thr) == pytest.approx(max(FAST.step_s(32, 0), WIDE.step_s(256, 0) / 2))
    with pytest.raises(UserError, match="low"):
        AdaptivePolicy(latency_plan=lat, high_load=2, low_load=2)


def test_adaptive_switches_under_bursts_and_completes_everything():
    lat, thr = plans()
    w = WorkloadSpec(kind="bursty", burst="onoff", on_s=2.0, off_s=6.0, requests=300, rate_per_s=12,
                     prompt=LengthSpec(lo=128, hi=128), output=LengthSpec(lo=64, hi=64))
    r = simulate(thr, w, policy=AdaptivePolicy(latency_plan=lat), slo=LatencyTargets(ttft_s=1.0, tpot_s=0.03))
    assert r.completed == 300 and r.switches >= 2
