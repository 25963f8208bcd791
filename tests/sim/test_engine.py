import pytest

from tessera.sim import LatencyTargets, LengthSpec, SchedulerConfig, WorkloadSpec, simulate
from tessera.sim.handplan import PhaseCost, hand_plan

from .conftest import DECODE, PREFILL, d_s, p_s


def fixed(n: int, prompt: int, output: int, kind: str = "offline", rate: float = 0.0) -> WorkloadSpec:
    return WorkloadSpec(kind=kind, requests=n, rate_per_s=rate, prompt=LengthSpec(lo=prompt, hi=prompt),
                        output=LengthSpec(lo=output, hi=output))


def test_single_request_latencies_by_hand(plan):
    r = simulate(plan, fixed(1, 128, 11))
    assert r.ttft_s["p50"] == pytest.approx(p_s(128))
    assert r.tpot_s["p50"] == pytest.approx(d_s(1))
    assert r.e2e_s["p99"] == pytest.approx(p_s(128) + 10 * d_s(1))
    assert r.throughput_tokens_per_s == pytest.approx(11 / (p_s(128) + 10 * d_s(1)))
    assert r.usd_per_million_tokens == pytest.approx(1.0 / 3600 / r.throughput_tokens_per_s * 1e6)


def test_offline_throughput_matches_prediction_within_5_percent(plan):
    # 512 requests, max batch 128: four waves of one 16384-token prefill then 255 decode steps at batch 128
    r = simulate(plan, fixed(512, 128, 256))
    by_hand = 512 * 256 / (4 * (p_s(128 * 128) + 255 * d_s(128)))
    assert r.throughput_tokens_per_s == pytest.approx(by_hand, rel=1e-9)
    assert plan.throughput_tokens_per_s == pytest.approx(128 / d_s(128))
    gap = 1 - r.throughput_tokens_per_s / plan.throughput_tokens_per_s
    assert 0 < gap < 0.05  # the gap is the prefill time the steady-state decode prediction leaves out
    assert r.device_utilisation[0] == pytest.approx(1.0)


def test_same_seed_same_metrics_bit_for_bit(shared_pair_plan):
    w = WorkloadSpec(kind="bursty", requests=400, rate_per_s=30, prompt=LengthSpec(trace="azure_conv_2023"),
                     output=LengthSpec(trace="azure_conv_2023"))
    a = simulate(shared_pair_plan, w, replicas=2, seed=7, slo=LatencyTargets(ttft_s=0.5, tpot_s=0.05)).to_json()
    b = simulate(shared_pair_plan, w, replicas=2, seed=7, slo=LatencyTargets(ttft_s=0.5, tpot_s=0.05)).to_json()
    c = simulate(shared_pair_plan, w, replicas=2, seed=8, slo=LatencyTargets(ttft_s=0.5, tpot_s=0.05)).to_json()
    assert a == b
    assert a != c


def test_split_plan_runs_prefill_and_decode_concurrently(split_plan, shared_pair_plan):
    cfg = SchedulerConfig(max_num_batched_tokens=128)  # one prompt per prefill iteration
    w = fixed(2, 128, 3)
    # split: r0 decodes on device 1 while r1 prefills on device 0
    r = simulate(split_plan, w, config=cfg)
    t1 = p_s(128) + d_s(1)  # r0's first decode step ends; r1 (prefilled at 2·P) joins the next one
    assert r.e2e_s["p50"] == pytest.approx(((t1 + d_s(2)) + (t1 + d_s(2) + d_s(1))) / 2)
    assert r.sim_wall_s == pytest.approx(t1 + d_s(2) + d_s(1))
    # shared devices: the second prefill waits for the first, then both decode together
    s = simulate(shared_pair_plan, w, config=cfg)
    assert s.sim_wall_s == pytest.approx(2 * p_s(128) + 2 * d_s(2))


def test_kv_exhaustion_preempts_and_every_request_still_completes():
    plan = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, kv_capacity_tokens=1000)
    r = simulate(plan, fixed(4, 200, 200))
    assert r.completed == 4 and r.lost == 0
    assert r.preemptions >= 1


def test_requests_that_can_never_fit_are_lost_not_dropped():
    plan = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, kv_capacity_tokens=1000)
    r = simulate(plan, fixed(5, 900, 200), slo=LatencyTargets(ttft_s=10.0))
    assert (r.requests, r.completed, r.lost) == (5, 0, 5)
    assert r.slo_attainment == 0.0


def test_chunked_prefill_completes_and_mixes_decode(plan):
    cfg = SchedulerConfig(chunked_prefill=True, max_num_batched_tokens=256)
    r = simulate(plan, fixed(20, 300, 20, "poisson", 50.0), config=cfg)
    assert r.completed == 20
    # a lone request: prompt 300 in chunks of 256 then 44 (with its first decode), hand-computed
    one = simulate(plan, fixed(1, 300, 2), config=cfg)
    assert one.ttft_s["p50"] == pytest.approx(p_s(256) + p_s(128))  # 44 tokens clamps to the 128 sample
    assert one.e2e_s["p50"] == pytest.approx(p_s(256) + p_s(128) + d_s(1))


def test_replicas_and_router(plan):
    w = fixed(64, 128, 16, "poisson", 200.0)
    one = simulate(plan, w)
    four = simulate(plan, w, replicas=4)
    rr = simulate(plan, w, replicas=4, config=SchedulerConfig(router="round_robin"))
    assert four.ttft_s["p99"] < one.ttft_s["p99"]
    assert four.completed == rr.completed == 64
    assert four.replicas == 4
    assert four.usd_per_million_tokens == pytest.approx(4 / 3600 / four.throughput_tokens_per_s * 1e6)


def test_plan_replicas_are_honoured():
    p = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, replicas=3, strategy="homogeneous")
    assert simulate(p, fixed(30, 128, 8)).replicas == 3


def test_diffusion_images_per_step():
    den = PhaseCost(fixed_s=0.05, per_token_s=1e-5, tokens=(4096, 16384), contexts=(0,), tokens_per_item=4096)
    plan = hand_plan(phases={"denoise": den})
    r = simulate(plan, fixed(8, 77, 10))  # 8 images of 10 steps, batch 4 max -> two waves
    step = den.step_s(4 * 4096, 0)
    assert r.completed == 8
    assert r.sim_wall_s == pytest.approx(20 * step)
    assert r.images_per_s == pytest.approx(8 / (20 * step))
    assert r.throughput_tokens_per_s == 0.0 and r.usd_per_million_tokens is None
    # first step of wave 1 ends at 1 step, of wave 2 at 11 steps; numpy's median interpolates
    assert (r.ttft_s["p50"], r.e2e_s["p50"]) == (pytest.approx(6 * step), pytest.approx(15 * step))


def test_split_plan_prefills_the_next_batch_while_decode_is_full(split_plan):
    # max_num_seqs 2: the prefill instance prefills requests 3 and 4 while 1 and 2 decode (DistServe), so
    # the second batch starts decoding the moment the first finishes: no prefill on the critical path.
    cfg = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=256)
    r = simulate(split_plan, fixed(4, 128, 50), config=cfg)
    p2 = p_s(256)  # one prefill iteration of two 128-token prompts; it emits each request's first token
    assert r.sim_wall_s == pytest.approx(p2 + 2 * 49 * d_s(2))  # serialised it would be 2·p2 + 98·d_s(2)


def test_steady_rate_by_hand() -> None:
    """Windows of 2 s: from 3 s the first whole window is index 2 (4–6 s); to 10 s, windows up to index 5
    exclusive (8–10 s the last): mean of 30, 50, 70 = 50. From 9 s: window 5 alone (at least one). A
    start past the series: the default."""
    from tessera.sim.metrics import SimResult

    r = SimResult(requests=1, completed=1, lost=0, sim_wall_s=12.0, throughput_tokens_per_s=0.0, ttft_s={},
                  tpot_s={}, e2e_s={}, slo_attainment=None, usd_per_million_tokens=None, series_window_s=2.0,
                  series_per_s=(10.0, 20.0, 30.0, 50.0, 70.0, 5.0))
    assert r.steady_per_s(3.0, 10.0) == pytest.approx(50.0)
    assert r.steady_per_s(9.0, 9.5) == pytest.approx(5.0)
    assert r.steady_per_s(11.0, 12.0, default=0.0) == 0.0


def test_the_result_reads_back_what_it_wrote(shared_pair_plan):
    """One serializer: ``from_dict`` of ``to_dict`` is the same result (every field, detail included), and
    of ``to_json`` the same contract; the JSON text round-trips too."""
    import json

    from tessera.contracts.results import SimResult

    w = WorkloadSpec(kind="poisson", requests=60, rate_per_s=20, prompt=LengthSpec(lo=64, hi=64),
                     output=LengthSpec(lo=4, hi=12))
    r = simulate(shared_pair_plan, w, replicas=2, seed=3, slo=LatencyTargets(ttft_s=0.5, tpot_s=0.05))
    assert SimResult.from_dict(json.loads(json.dumps(r.to_dict())), "t") == r
    assert SimResult.from_dict(r.to_json(), "t").to_json() == r.to_json()
