"""The engine of serving-model ("mixed") plans: groups, token budget, stages along the route contending for
devices and links. Plans from closed-form stretch costs (tessera.sim.handplan.mixed_plan); every expected
figure is worked out by hand in the comments."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace

import numpy as np
import pytest

from tessera.contracts.plan import EngineSettings, Segment
from tessera.errors import UserError
from tessera.sim import (
    AdaptivePolicy,
    Failure,
    LengthSpec,
    SchedulerConfig,
    WorkloadSpec,
    simulate,
    simulate_pool,
)
from tessera.sim.api import run
from tessera.sim.handplan import PhaseCost, StretchCost, hand_plan, mixed_plan
from tessera.sim.model import PlanModel
from tessera.sim.stages import MAX_STAGES, Pipeline, Route, route_of, run_groups

PAIR = ("H100-SXM", "L40S")


def fixed(n: int, prompt: int, output: int, kind: str = "offline", rate: float = 0.0) -> WorkloadSpec:
    return WorkloadSpec(kind=kind, requests=n, rate_per_s=rate, prompt=LengthSpec(lo=prompt, hi=prompt),
                        output=LengthSpec(lo=output, hi=output))


def engine(seqs: int, budget: int = 1000, m: int = 1) -> EngineSettings:
    return EngineSettings(max_num_seqs=seqs, max_num_batched_tokens=budget, microbatches=m)


# device 0: 1 s + 10 ms per decode + 1 ms per chunk token; the link 0 -> 1: 0.5 s; device 1: 1 s
CHAIN = (StretchCost(device=0, fixed_s=1.0, per_decode_s=0.01, per_chunk_token_s=0.001),
         StretchCost(device=0, to=1, fixed_s=0.5), StretchCost(device=1, fixed_s=1.0))


@pytest.mark.parametrize(("extra_s", "write_route"), [(0.0, True), (0.0, False), (0.4, True), (-0.5, True)])
def test_one_group_alone_takes_its_latency(extra_s: float, write_route: bool) -> None:
    plan = mixed_plan(route=CHAIN, engine=engine(1), gpus=PAIR, prompt=100, output=3, extra_latency_s=extra_s,
                      write_route=write_route)
    r = run(plan, fixed(1, 100, 3)).requests
    assert r is not None
    # the prompt's iteration: no decode, which the grid (decodes {1}) prices as one (clamped below):
    # 1 + 0.01 + 0.1 + 0.5 + 1 = 2.61 s; each of the 2 decode iterations 1.01 + 0.5 + 1 = 2.51 s; the
    # point's latency (stages + extra_s) whatever the extra: a delay at the end (+0.4), or the stages
    # letting the next one start early (-0.5); without a route, the fallback device 0, link 0->1, device 1
    ttft, tpot = 2.61 + extra_s, 2.51 + extra_s
    assert r.first_s[0] == pytest.approx(ttft)
    assert r.done_s[0] == pytest.approx(ttft + 2 * tpot)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("route", "busiest_s", "latency_s"), [
    ((StretchCost(device=0, fixed_s=1.0), StretchCost(device=1, fixed_s=1.0)), 1.0, 2.0),
    ((StretchCost(device=0, fixed_s=1.0), StretchCost(device=0, to=1, fixed_s=0.5),
      StretchCost(device=1, fixed_s=1.0)), 1.0, 2.5),
    # revisits: device 0, 1, 0, 1 half a second each (stage by stage, not booked at once)
    (tuple(StretchCost(device=d, fixed_s=0.5) for d in (0, 1, 0, 1)), 1.0, 2.0),
])
def test_m_identical_groups_settle_at_max_of_m_t_and_l(m: int, route, busiest_s: float,
                                                        latency_s: float) -> None:
    plan = mixed_plan(route=route, engine=engine(2 * m, m=m), gpus=PAIR, prompt=10, output=41)
    res = simulate(plan, fixed(2 * m, 10, 41))
    # every group full (2 sequences) from the first iteration: each group's iterations are max(m·T, L) apart
    period = max(m * busiest_s, latency_s)
    assert res.tpot_s["p50"] == pytest.approx(period) and res.tpot_s["p99"] == pytest.approx(period)
    # the busiest device is busy m·T of every period
    assert max(res.device_utilisation) == pytest.approx(m * busiest_s / period, rel=0.05)


def test_a_large_chunk_delays_the_other_group_on_the_shared_device_by_hand() -> None:
    two = (StretchCost(device=0, fixed_s=1.0), StretchCost(device=1, fixed_s=1.0))
    route = route_of(mixed_plan(route=two, engine=engine(2, m=2), gpus=PAIR))
    # group 0 decodes: holds (1, 1), latency 2; group 1 carries a large chunk: device 0 holds it 3 s
    ends = run_groups(route, [((1.0, 1.0), 2.0), ((3.0, 1.0), 4.0)], iterations=3)
    # g0: dev0 [0, 1], dev1 [1, 2] -> 2; g1: dev0 [1, 4] behind it, dev1 [4, 5] -> 5; g0 again at 2 waits for
    # dev0 until 4: [4, 5], [5, 6] -> 6; g1 at 5: [5, 8], [8, 9] -> 9; g0 at 6: [8, 9], [9, 10] -> 10
    assert ends == [[2.0, 6.0, 10.0], [5.0, 9.0, 13.0]]
    # alone, group 0 iterates every 2 s: the chunk costs it 2 s per iteration (device 0 busy 3 + 1 of every 4)
    assert run_groups(route, [((1.0, 1.0), 2.0)], iterations=3) == [[2.0, 4.0, 6.0]]


def test_decodes_first_then_prompts_mid_prefill_then_admissions_by_hand() -> None:
    # one group, budget 10 tokens; an iteration costs 1 s + 0.5 s per decode + 0.1 s per chunk token
    plan = mixed_plan(route=(StretchCost(device=0, fixed_s=1.0, per_decode_s=0.5, per_chunk_token_s=0.1),),
                      engine=engine(4, budget=10), prompt=15, output=3, batches=(0, 1, 2))
    r = run(plan, fixed(2, 15, 3)).requests
    assert r is not None
    # it 1 [0, 2]: A's first 10 tokens (budget spent, B waits); it 2 [2, 4]: A's last 5, then B admitted
    # with the 5 left: A's first token at 4; it 3 [4, 6.4]: A decodes, B 9 tokens (budget 10 - 1);
    # it 4 [6.4, 8]: A's last decode (3 tokens: done at 8), B's last token of prompt: its first token at 8;
    # it 5, 6: B decodes alone, 1.5 s each: done at 11
    assert r.first_s.tolist() == pytest.approx([4.0, 8.0])
    assert r.done_s.tolist() == pytest.approx([8.0, 11.0])


def test_sequence_limits_per_group_and_per_replica() -> None:
    # 5 sequences in 2 groups: a group holds at most 3, the replica 5; constant 1 s iterations, 10 requests
    # of 3 tokens: groups 0 and 1 admit 3 and 2 at 0; each request lives 3 iterations (prompt + 2 decodes)
    plan = mixed_plan(route=(StretchCost(device=0, fixed_s=0.5), StretchCost(device=1, fixed_s=0.5)),
                      engine=engine(5, m=2), gpus=PAIR, prompt=10, output=3)
    r = run(plan, fixed(10, 10, 3)).requests
    assert r is not None
    assert np.sort(r.first_s)[:5].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.5, 1.5])
    assert np.isnan(r.first_s).sum() == 0 and int((r.first_s < 3.0).sum()) == 5  # the others wait for a slot


def test_kv_admission_preemption_and_lost_requests() -> None:
    plan = mixed_plan(route=CHAIN, engine=engine(8, m=2), gpus=PAIR, prompt=200, output=200,
                      kv_capacity_tokens=1000)
    r = simulate(plan, fixed(4, 200, 200))
    assert (r.completed, r.lost) == (4, 0) and r.preemptions >= 1
    r = simulate(plan, fixed(3, 900, 200))
    assert (r.completed, r.lost) == (0, 3)


def test_route_fallback_normalised_shares_and_an_appended_resource() -> None:
    plan = mixed_plan(route=CHAIN, engine=engine(1), gpus=PAIR, write_route=False)
    ones = ((0, 1.0), (1, 1.0), (2, 1.0))
    assert route_of(plan) == Route(resources=((0, None), (0, 1), (1, None)), stages=ones)
    # device 0 in two stretches whose shares sum to 0.5, the link left out of the route: shares scaled to
    # 1 (0.5 each), adjacent device-0 stretches merge, the link comes last
    odd = (Segment(device=0, share=0.25), Segment(device=0, share=0.25), Segment(device=1, share=1.0))
    plan = replace(plan, phases={"mixed": replace(plan.phases["mixed"], route=odd)})
    assert route_of(plan) == Route(resources=((0, None), (1, None), (0, 1)), stages=ones)
    nowhere = (Segment(device=5, share=1.0),)
    bad = replace(plan, phases={"mixed": replace(plan.phases["mixed"], route=nowhere)})
    with pytest.raises(UserError, match="device=5"):
        route_of(bad)


def test_a_long_route_is_coarsened_keeping_busy_seconds_and_latency() -> None:
    # 20 round trips device 0 -> 1 -> 0 of uneven lengths: 40 stretches
    rng = random.Random(3)
    stretches = tuple(StretchCost(device=d, fixed_s=rng.uniform(0.1, 1.0)) for _ in range(20) for d in (0, 1))
    plan = mixed_plan(route=stretches, engine=engine(1), gpus=PAIR)
    route = route_of(plan)
    assert len(route.stages) <= MAX_STAGES and not route.chain
    for r in range(len(route.resources)):
        assert sum(s for q, s in route.stages if q == r) == pytest.approx(1.0)
    # alone, the coarse iteration still takes the point's latency: the sum of the 40 stretches
    pt = plan.phases["mixed"].points[0]
    holds = [pt.device_busy_s[route.resources[r][0]] * s for r, s in route.stages]
    assert run_groups(route, [(holds, pt.latency_s)], iterations=1) == [[pytest.approx(sum(
        s.fixed_s for s in stretches))]]


def test_booking_a_chain_at_once_equals_running_it_stage_by_stage() -> None:
    route = Route(resources=((0, None), (0, 1), (1, None)), stages=((0, 1.0), (1, 1.0), (2, 1.0)))
    rng = random.Random(7)
    shapes = [([rng.uniform(0.1, 2.0) for _ in range(3)], rng.uniform(0.5, 6.0)) for _ in range(3)]
    staged = run_groups(route, shapes, iterations=6)
    pipe, booked = Pipeline(route, 3), [[] for _ in shapes]
    starts = [(0.0, g) for g in range(3)]  # iterations start in time order, ties by group
    while starts:
        t, g = heapq.heappop(starts)
        booked[g].append(pipe.book(g, t, *shapes[g]))
        if len(booked[g]) < 6:
            heapq.heappush(starts, (booked[g][-1], g))
    assert booked == [pytest.approx(e) for e in staged]


def test_adaptive_switch_between_mixed_plans_and_failures_keep_every_request() -> None:
    lat = mixed_plan(route=CHAIN, engine=engine(4), gpus=PAIR, prompt=128, output=32)
    thr = mixed_plan(route=CHAIN, engine=engine(16, m=2), gpus=PAIR, prompt=128, output=32)
    w = WorkloadSpec(kind="bursty", burst="onoff", on_s=20.0, off_s=60.0, requests=120, rate_per_s=0.5,
                     prompt=LengthSpec(lo=128, hi=128), output=LengthSpec(lo=32, hi=32))
    r = simulate(thr, w, policy=AdaptivePolicy(latency_plan=lat))
    assert r.completed == 120 and r.switches >= 2
    # a free switch: the switch to one lane lands at the very time a kick for the old second lane is queued
    r = simulate(thr, w, policy=AdaptivePolicy(latency_plan=lat, switch_s=0.0))
    assert r.completed == 120 and r.switches >= 2
    f = Failure(at_s=30.0, replica=1, replacement=(thr, 1), replan_s=5.0)
    r = simulate_pool([(thr, 2)], fixed(60, 128, 32), failures=[f])
    assert (r.completed, r.lost) == (60, 0) and r.failures[0].requeued > 0
    with pytest.raises(UserError, match="both be serving-model"):
        two_phase = hand_plan(phases={n: PhaseCost(fixed_s=0.01, per_token_s=1e-5, busy_share=(1.0, 0.5))
                                      for n in ("prefill", "decode")}, gpus=PAIR)
        lat2 = replace(two_phase, memory_bytes=thr.memory_bytes)
        simulate(thr, w, policy=AdaptivePolicy(latency_plan=lat2))


def test_engine_overrides_and_settings_in_two_phase_and_image_plans() -> None:
    plan = mixed_plan(route=CHAIN, engine=engine(8, budget=256, m=2), gpus=PAIR)
    pm = PlanModel.build(plan, SchedulerConfig(max_num_seqs=6, microbatches=3))
    assert pm.engine == EngineSettings(max_num_seqs=6, max_num_batched_tokens=256, microbatches=3)
    with pytest.raises(UserError, match="micro-batches need at least as many sequences"):
        PlanModel.build(plan, SchedulerConfig(max_num_seqs=2, microbatches=3))
    # a denoise plan's images in flight come from its engine settings: 8 images, 2 at a time: 4 waves
    den = PhaseCost(fixed_s=0.05, per_token_s=1e-5, tokens=(4096, 16384), contexts=(0,), tokens_per_item=4096)
    img = replace(hand_plan(phases={"denoise": den}), engine=engine(2))
    r = simulate(img, fixed(8, 77, 10))
    assert r.sim_wall_s == pytest.approx(4 * 10 * den.step_s(2 * 4096, 0))
