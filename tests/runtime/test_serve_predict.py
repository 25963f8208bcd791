"""The serving model's period over per-program costs, and kernel times taken from a run's own events,
worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tessera.plan.serving import expected_period_s
from tessera.plan.types import EngineSettings
from tessera.runtime.serve_api import in_run_link
from tessera.runtime.serve_calibrate import in_run_times
from tessera.runtime.serve_predict import (
    KernelTimes,
    Overheads,
    StepCost,
    iteration_s,
    predicted_period_s,
    predicted_tokens_per_s,
    profile_plan,
    run_scheduler,
    step_costs,
    stream_mix,
)
from tessera.runtime.serving import Request, corun_slowdown
from tessera.sim.model import PlanModel, SchedulerConfig
from tessera.sim.workload import LengthSpec, WorkloadSpec

DEC = StepCost(busy_s=(1.0, 2.0), latency_s=3.0)  # one request's decode step: device 1 is the bottleneck
PRE = StepCost(busy_s=(4.0, 2.0), latency_s=6.0)


def test_iteration_period_by_hand() -> None:
    # 2 decodes per group: busy (2, 4), T = 4; L = 3 + 4 - 2 = 5
    assert iteration_s(DEC, PRE, 2, 0, 1) == 5.0  # one group: the latency bounds the period
    assert iteration_s(DEC, PRE, 2, 0, 2) == 8.0  # two groups: max(2·4, 5)
    # plus half a prefill: busy (2 + 2, 4 + 1) = (4, 5), T = 5; L = 3 + 5 - 2 = 6; two groups: max(10, 6)
    assert iteration_s(DEC, PRE, 2, 0.5, 2) == 10.0
    # a control round trip of 4 joins the latency: max(2·4, 5 + 4)
    assert iteration_s(DEC, PRE, 2, 0, 2, Overheads(control_s=4.0)) == 9.0
    # a worker's gap between queued steps joins its busy time where groups run back to back:
    # devices (2 + 3, 4 + 0.5) -> T = 5, max(2·5, 5) = 10; with one group the latency bounds it (5)
    assert iteration_s(DEC, PRE, 2, 0, 2, Overheads(gap_s=(3.0, 0.5))) == 10.0
    assert iteration_s(DEC, PRE, 2, 0, 1, Overheads(gap_s=(3.0, 0.5))) == 5.0


def test_group_latency_with_what_a_further_request_adds_by_hand() -> None:
    # a group of 2 decodes loads device 1 4 s; each further request adds 1.5 s, not the bottleneck's 2
    # (a placement crossing between workers several times per step): L = 3 + (4 - 2)·1.5/2 = 4.5
    dec = StepCost(busy_s=(1.0, 2.0), latency_s=3.0, follow_s=1.5)
    assert dec.group_latency_s(4.0) == 4.5 and DEC.group_latency_s(4.0) == 5.0  # None: the bottleneck's 2
    assert iteration_s(dec, PRE, 2, 0, 1) == 4.5  # one group: max(4, 4.5)
    # stream_mix carries it: steps A prefill@4 (1.0), decode@4 (1.5), B prefill@3 and chunk@3:3 (0.5 each)
    reqs, costs = two_requests()
    follows = {"prefill@4": 1.0, "decode@4": 1.5, "prefill@3": 0.5, "chunk@3:3": 0.5}
    mix = stream_mix({k: replace(c, follow_s=follows[k]) for k, c in costs.items()}, reqs)
    assert mix.step.follow_s == pytest.approx(3.5 / 4) and mix.decode.follow_s == 1.5
    assert mix.prompt.follow_s == pytest.approx(1.0)  # A's 1.0 and B's chunks 0.5 + 0.5
    assert stream_mix(costs, reqs).step.follow_s is None  # not computed (one request per group)


def test_expected_period_by_hand_and_by_sampling() -> None:
    # zero spreads: the max itself
    assert expected_period_s(8.0, 5.0) == 8.0 and expected_period_s(5.0, 9.0) == 9.0
    # equal means, spreads 3 and 4: theta = 5, alpha = 0 -> 10 + 5 / sqrt(2 pi) = 11.9947
    assert expected_period_s(10.0, 10.0, 3.0, 4.0) == pytest.approx(11.9947, abs=1e-4)
    # far apart: the larger
    assert expected_period_s(10.0, 1.0, 0.1, 0.1) == pytest.approx(10.0)
    # against sampling: the mean of the max of 400k independent normal pairs
    rng = np.random.default_rng(0)
    x, y = rng.normal(8.0, 2.0, 400_000), rng.normal(7.0, 3.0, 400_000)
    assert expected_period_s(8.0, 7.0, 2.0, 3.0) == pytest.approx(float(np.maximum(x, y).mean()), rel=3e-3)


def test_iteration_period_with_spreads_by_hand() -> None:
    over = Overheads(step_sd_s=(1.0, 2.0), control_sd_s=2.0)
    # two groups of 2 decodes: m·T = 8 (device 1), L = 5; sigma_X² = 2·4, sigma_Y² = 1 + 4 + 4, and they share
    # the group's own step on device 1 (cov 4): theta² = 8 + 9 - 8 = 9, alpha = 3 / 3 = 1,
    # Phi(1) = 0.841345, phi(1) = 0.241971 -> 8·0.841345 + 5·0.158655 + 3·0.241971 = 8.24995
    assert iteration_s(DEC, PRE, 2, 0, 2, over) == pytest.approx(8.24995, abs=1e-4)
    # against sampling the two terms from their parts: X = 8 + own + other (device 1's two steps), Y = 5 +
    # own + device 0's step + control
    rng = np.random.default_rng(1)
    own, other, d0, ctl = (rng.normal(0.0, s, 400_000) for s in (2.0, 2.0, 1.0, 2.0))
    sampled = float(np.maximum(8 + own + other, 5 + own + d0 + ctl).mean())
    assert iteration_s(DEC, PRE, 2, 0, 2, over) == pytest.approx(sampled, rel=3e-3)
    # one group waits only for itself: the latency, whatever the spreads
    assert iteration_s(DEC, PRE, 2, 0, 1, over) == 5.0
    with pytest.raises(ValueError, match="3 step spreads for 2 devices"):
        iteration_s(DEC, PRE, 2, 0, 2, Overheads(step_sd_s=(1.0, 2.0, 3.0)))
    with pytest.raises(ValueError, match="finite"):
        Overheads(control_sd_s=float("nan"))


def two_requests() -> tuple[list[Request], dict[str, StepCost]]:
    # A: prompt 4 whole, 2 tokens -> prefill@4, decode@4; B: prompt 6 in chunks of 3, 1 token -> prefill@3, chunk@3:3
    a = Request(rid=0, arrival_s=0.0, prompt=torch.zeros(1, 4, dtype=torch.long), output_tokens=2)
    b = Request(rid=1, arrival_s=0.0, prompt=torch.zeros(1, 6, dtype=torch.long), output_tokens=1, chunk_tokens=3)
    third = StepCost(busy_s=(2.0, 1.0), latency_s=3.0)
    return [a, b], {"prefill@4": PRE, "decode@4": DEC, "prefill@3": third, "chunk@3:3": third}


def test_stream_mix_and_period_by_hand() -> None:
    reqs, costs = two_requests()
    mix = stream_mix(costs, reqs)
    # 4 steps: busy ((4 + 1 + 2 + 2) / 4, (2 + 2 + 1 + 1) / 4), latency (6 + 3 + 3 + 3) / 4; 3 tokens in 4 steps
    assert mix.step == StepCost(busy_s=(2.25, 1.5), latency_s=3.75)
    assert (mix.tokens_per_step, mix.prompt_tokens, mix.output_tokens) == (0.75, 5.0, 1.5)
    assert mix.decode == DEC
    # a prompt, all its chunks: A (4, 2; 6), B (2 + 2, 1 + 1; 3 + 3) -> mean (4, 2; 6)
    assert mix.prompt == StepCost(busy_s=(4.0, 2.0), latency_s=6.0)
    # 4 slots in 2 groups: T = 2 · 2.25 = 4.5, L = 3.75 + 4.5 - 2.25 = 6 -> max(9, 6) = 9
    assert predicted_period_s(mix, 4, 2) == 9.0
    assert predicted_period_s(mix, 4, 2, Overheads(control_s=4.0)) == 10.0  # max(9, 6 + 4)
    # one group of 4 (sync): T = 9, L = 3.75 + 9 - 2.25 = 10.5
    assert predicted_period_s(mix, 4, 1) == 10.5
    offline = WorkloadSpec(kind="offline", requests=2, prompt=LengthSpec(lo=4, hi=6), output=LengthSpec(lo=1, hi=2))
    assert predicted_tokens_per_s(mix, offline, 4, 2) == pytest.approx(4 * 0.75 / 9)
    # an open stream at 0.1 requests/s offers 0.1 · 1.5 tokens/s: the cap
    slow = WorkloadSpec(kind="poisson", requests=2, rate_per_s=0.1, prompt=LengthSpec(lo=4, hi=6),
                        output=LengthSpec(lo=1, hi=2))
    assert predicted_tokens_per_s(mix, slow, 4, 2) == pytest.approx(0.15)


def test_profile_plan_points_follow_the_formula() -> None:
    reqs, costs = two_requests()
    plan = profile_plan("llama-tiny", stream_mix(costs, reqs), slots=4, m=2)
    # one group's iteration: 2 slots per group, budget K = 2 · ⌈P⌉ = 10 (P = 5, O = 1.5); the grid: decodes
    # {1, 1, 2}, chunk tokens {0, 5, 10}, contexts {int 5, int 6.5} = {5, 6}
    assert plan.engine == EngineSettings(max_num_seqs=4, max_num_batched_tokens=10, microbatches=2)
    pts = {(p.batch, p.tokens - p.batch, p.context): p for p in plan.phases["mixed"].points}
    assert sorted(pts) == [(n, c, x) for n in (1, 2) for c in (0, 5, 10) for x in (5, 6)]
    # 2 decodes: busy (2, 4), T = 4, L = 3 + (4 - 2) = 5; two groups: max(2·4, 5) = 8
    two = pts[(2, 0, 5)]
    assert (two.device_busy_s, two.latency_s, two.step_s) == ((2.0, 4.0), 5.0, 8.0)
    assert two.step_s == iteration_s(DEC, PRE, 2, 0, 2)
    # 2 decodes + 10 prompt tokens = 2 mean prompts: busy (2 + 8, 4 + 4) = (10, 8), T = 10,
    # L = 3 + (10 - 2) = 11, max(20, 11) = 20
    full = pts[(2, 10, 6)]
    assert (full.device_busy_s, full.latency_s, full.step_s) == ((10.0, 8.0), 11.0, 20.0)
    # 1 decode + 5 prompt tokens: busy (1 + 4, 2 + 2) = (5, 4), L = 3 + (5 - 2) = 6
    assert pts[(1, 5, 5)].device_busy_s == (5.0, 4.0) and pts[(1, 5, 5)].latency_s == 6.0
    assert plan.phases["mixed"].route == ()  # the simulator's fallback: device 0, then device 1


def test_profile_plan_puts_the_spread_on_the_bounding_term() -> None:
    reqs, costs = two_requests()
    over = Overheads(step_sd_s=(1.0, 2.0), control_sd_s=2.0)
    plan = profile_plan("llama-tiny", stream_mix(costs, reqs), slots=4, m=2, over=over)
    pts = {(p.batch, p.tokens - p.batch, p.context): p for p in plan.phases["mixed"].points}
    # 2 decodes per group: m·T = 8 bounds L = 5; the expected period 8.24995 (the spreads' test above), so
    # device 1's busy time carries the excess over 2 groups: 4 + 0.24995 / 2, the latency stays 5
    two = pts[(2, 0, 5)]
    assert two.step_s == pytest.approx(8.24995, abs=1e-4)
    assert two.device_busy_s == pytest.approx((2.0, 4.0 + 0.24995 / 2), abs=1e-4) and two.latency_s == 5.0
    assert max(2 * max(two.device_busy_s), two.latency_s) == pytest.approx(two.step_s)


def test_in_run_times_from_worker_events_by_hand() -> None:
    programs = {"decode@4": SimpleNamespace(ops=[0, 1]), "decode@5": SimpleNamespace(ops=[0, 1])}
    fallback = KernelTimes(kernel_s={"decode@4": [9.0, 9.0], "decode@5": [7.0, 8.0]})
    w0 = dict(start_s=10.0, end_s=10.010, kernels=[(0, 0, 10.001, 10.004)], waits=[],
              sends=[(0, 0, 10.004), (1, 0, 10.0041)])
    w1 = dict(start_s=10.0, end_s=10.012, kernels=[(1, 0, 10.006, 10.008)], waits=[(10.0, 10.005)],
              recvs=[(0, 0, 10.0047), (1, 0, 10.006)])
    hist = (dict(keys=["decode@4"], workers=[w0, w1], submit_abs_s=9.998, done_abs_s=10.015),)
    got = in_run_times(hist, programs, fallback)  # type: ignore[arg-type]
    assert got.kernel_s["decode@4"] == pytest.approx([0.003, 0.002])
    assert got.kernel_s["decode@5"] == [7.0, 8.0]  # never ran: the fallback's
    # outside kernels and waits, per kernel run: worker 0 (0.010 - 0.003) / 1, worker 1 (0.012 - 0.002 - 0.005) / 1
    assert got.dispatch_s == pytest.approx((0.007, 0.005))
    # control: submit -> first start 0.002, last end -> driver 0.003
    assert got.overheads.control_s == pytest.approx(0.005)
    # the link: transfer 0 reached worker 1 while it waited (10.0 to 10.005): 10.0047 - 10.004; transfer 1
    # landed after that wait had ended, so its 1.9 ms hold worker 1's own delay and do not count
    assert got.link_latency_s == pytest.approx(0.0007)


def testin_run_link_takes_the_runs_latency() -> None:
    probed = (1e-4, 2e9, 5e-5, 1e-10)  # latency, bytes/s, CPU per message, CPU per byte (the start-up probe)
    times = KernelTimes(kernel_s={}, link_latency_s=7e-4)
    got = in_run_link(probed, times)
    assert (got.latency_s, got.bytes_per_s, got.cpu_s, got.cpu_s_per_byte) == (7e-4, 2e9, 0.0, 0.0)
    assert in_run_link(probed, KernelTimes(kernel_s={})).latency_s == 1e-4  # not measured: the probe's
    assert in_run_link(None, times).latency_s == 0.0  # one device: nothing travels


def test_control_round_trip_means_and_driver_turnaround_by_hand() -> None:
    programs = {"decode@4": SimpleNamespace(ops=[0])}
    fallback = KernelTimes(kernel_s={"decode@4": [1.0]})
    # one worker, two groups interleaved: (group, submitted straight after its previous, submit, start, end,
    # outputs at the driver)
    steps = [(0, False, 0.0, 0.1, 1.0, 1.2), (1, False, 1.1, 1.2, 1.4, 1.5), (0, True, 1.3, 1.5, 2.0, 2.1),
             (1, True, 2.3, 2.4, 2.6, 2.7), (0, True, 2.8, 2.9, 3.0, 3.3), (0, False, 5.0, 5.1, 5.2, 5.3)]
    hist = tuple(dict(keys=["decode@4"], group=g, continued=c, submit_abs_s=sub, done_abs_s=done,
                      workers=[dict(start_s=a, end_s=end, kernels=[(0, 0, a, end)], waits=[])])
                 for g, c, sub, a, end, done in steps)  # one kernel filling each step: nothing outside kernels
    # launch, only where the worker was idle at the submit: the third step (1.3) queued behind group 1's
    # (until 1.4), so 0.1, 0.1, 0.1, 0.1, 0.1 -> mean 0.1; return: 0.2, 0.1, 0.1, 0.1, 0.3, 0.1 -> 0.9 / 6
    # turnaround (continued only, from the same group's last outputs): 1.3 - 1.2, 2.3 - 1.5, 2.8 - 2.1 ->
    # 0.1, 0.8, 0.7, mean 1.6 / 3 (the last group-0 step came after a wait: not a turnaround; the median of
    # the three would be 0.7)
    got = in_run_times(hist, programs, fallback)  # type: ignore[arg-type]
    assert got.overheads.control_s == pytest.approx(0.1 + 0.9 / 6 + 1.6 / 3)
    # spreads (standard deviations without the most extreme value at each end: ⌈1% of 6⌉ = 1): busy per step
    # (its kernel) 0.9, 0.2, 0.5, 0.2, 0.1, 0.1 keeps .1 .2 .2 .5, mean 0.25, squared deviations
    # .0225 + .0025 + .0025 + .0625 = 0.09 over n − 1 = 3; control: launches all 0.1 (0), returns
    # .2 .1 .1 .1 .3 .1 keep .1 .1 .1 .2, mean 0.125, squared deviations 3·.000625 + .005625 = 0.0075 over 3;
    # turnarounds: 3 samples, too few (0)
    assert got.overheads.step_sd_s == pytest.approx((math.sqrt(0.09 / 3),))
    assert got.overheads.control_sd_s == pytest.approx(math.sqrt(0.0075 / 3))


def test_simulator_takes_the_runs_engine_settings() -> None:
    reqs, costs = two_requests()
    plan = profile_plan("llama-tiny", stream_mix(costs, reqs), slots=4, m=2)
    # the plan's own: 4 slots in 2 groups, budget 10, no cap per request
    pm = PlanModel.build(plan, SchedulerConfig())
    assert (pm.engine, pm.chunk_cap, pm.partial_prefills) == (plan.engine, None, None)
    # the run's: 3 tokens per request per iteration, one prompt per group at a time: a group of 2 slots
    # carries at most 1 decode + one 3-token chunk, a budget of 4
    pm = PlanModel.build(plan, run_scheduler(slots=4, groups=2, prefills=1, chunk_tokens=3))
    assert pm.engine == EngineSettings(max_num_seqs=4, max_num_batched_tokens=4, microbatches=2)
    assert (pm.chunk_cap, pm.partial_prefills) == (3, 1)
    # no limit on prompts: both slots may prefill, 2 · 3 tokens
    assert run_scheduler(slots=4, groups=2, prefills=0, chunk_tokens=3).max_num_batched_tokens == 6
    with pytest.raises(Exception, match="chunk_tokens=0"):
        SchedulerConfig(chunk_tokens=0)


def test_gap_between_queued_steps_by_hand() -> None:
    programs = {"decode@4": SimpleNamespace(ops=[0])}
    fallback = KernelTimes(kernel_s={"decode@4": [1.0]})

    def gap_s(steps: list[tuple[float, float, float]]) -> tuple[float, ...]:
        """One worker's gap between queued steps, each step (submitted, started, ended)."""
        hist = tuple(dict(keys=["decode@4"], submit_abs_s=sub, done_abs_s=end + 0.1,
                          workers=[dict(start_s=a, end_s=end, kernels=[(0, 0, a, a)], waits=[])])
                     for sub, a, end in steps)
        return in_run_times(hist, programs, fallback).overheads.gap_s  # type: ignore[arg-type]

    # three steps: step 1 was submitted (at 0.5) before step 0 ended (1.0) and started at 1.2: gap 0.2;
    # step 2 was submitted at 3.0, after step 1 ended (2.0): the worker waited for the driver
    assert gap_s([(0.0, 0.1, 1.0), (0.5, 1.2, 2.0), (3.0, 3.1, 4.0)]) == pytest.approx((0.2,))
    # steps of two groups overlapping: B runs inside A's span (1.0-2.0 within 0.0-3.0); C, submitted at 2.5
    # while A still ran, starts at 3.5: its gap runs from A's end (the latest so far), not B's, 0.5
    assert gap_s([(0.0, 0.0, 3.0), (0.9, 1.0, 2.0), (2.5, 3.5, 4.0)]) == pytest.approx((0.5,))


def test_corun_slowdown_by_hand() -> None:
    # worker 0 runs op 0 of decode@4 three times: alone at [0, 1) and [10, 11) (1 s each), and at [4, 5.5)
    # while worker 1 is inside a kernel [3, 6): 1.5 s against its solo mean 1 s -> 1.5x
    w0 = [dict(kernels=[(0, 0, 0.0, 1.0)]), dict(kernels=[(0, 0, 4.0, 5.5)]), dict(kernels=[(0, 0, 10.0, 11.0)])]
    w1 = [dict(kernels=[]), dict(kernels=[(0, 0, 3.0, 6.0)]), dict(kernels=[])]
    hist = [dict(keys=["decode@4"], workers=[a, b]) for a, b in zip(w0, w1, strict=True)]
    assert corun_slowdown(hist, 0) == pytest.approx(1.5)
    assert corun_slowdown(hist, 1) is None  # worker 1's one kernel never ran alone: no baseline


def test_pipelined_schedule_of_one_request_is_the_list_schedule_on_a_real_capture() -> None:
    """One micro-batch through tessera.plan's pipelined schedule is evaluate's list schedule: llama-tiny's
    programs under four placements, random kernel times, a link without latency (with latency, two sends
    contend for it, and the pipelined schedule sends as soon as a value is written, the list schedule in
    the order its readers need them). And for 1-3 micro-batches, over a link with latency, it equals
    tessera run's prediction over the runtime's own Partition (its transfers, derived apart from the
    verifier's last-writer walk)."""
    import random

    from tessera.hardware import gpu
    from tessera.plan.verify import evaluate, pipelined_latency_s
    from tessera.runtime.measure import LinkModel, ProfileCost, predict_step_s
    from tessera.runtime.partition import partition
    from tessera.runtime.placements import placements
    from tessera.runtime.serving import by_key, capture_serving, group_graphs

    progs = capture_serving("llama-tiny", ["prefill@8", "chunk@8:8", "decode@12"], 0)
    link, cpus = LinkModel(latency_s=0.0, bytes_per_s=2.8e9), (gpu("cpu"), gpu("cpu"))
    rnd = random.Random(1)
    for name in ("layer_split", "plan", "interleave", "attention_gemm"):
        assign = by_key(progs, placements(name, group_graphs(progs), 2, 2))
        for key, prog in progs.items():
            cost = ProfileCost([rnd.uniform(1e-5, 1e-3) for _ in prog.ops], link)
            want = evaluate(prog.graph, assign[key], cpus, link.spec(), cost).latency_s
            one = pipelined_latency_s(prog.graph, assign[key], cpus, link.spec(), cost, 1)
            assert one == pytest.approx(want)
            two = pipelined_latency_s(prog.graph, assign[key], cpus, link.spec(), cost, 2)
            assert want < two <= 2 * want + 1e-12  # a second request costs something, at most a whole step
            part, lag = partition(prog, assign[key], 2), LinkModel(latency_s=2e-4, bytes_per_s=2.8e9)
            # the serving prediction's one-request latency is this event model's (wiring; the model's own
            # values are worked by hand in tests/plan/test_pipelined.py)
            ktimes = KernelTimes(kernel_s={key: cost.kernel_s})  # no dispatch, set-up or message CPU
            got = step_costs({key: prog}, {(key, "p"): part}, "p", ktimes, lag, group=3)[key]
            lagged = ProfileCost(cost.kernel_s, lag)
            want_one = pipelined_latency_s(prog.graph, assign[key], cpus, lag.spec(), lagged, 1)
            assert got.latency_s == pytest.approx(want_one)
            for m in (1, 2, 3):
                graph_s = pipelined_latency_s(prog.graph, assign[key], cpus, lag.spec(),
                                              ProfileCost(cost.kernel_s, lag), m)
                assert predict_step_s(part, cost.kernel_s, lag, m) == pytest.approx(graph_s)


def test_spread_keeps_a_minority_mode_and_drops_rare_stalls() -> None:
    from tessera.runtime.serve_calibrate import spread

    # 84 decode steps of 10 ms and 16 prompt steps of 25 ms (the one-request-per-group mix): trimming one
    # value (⌈1% of 100⌉) at each end leaves 83 x 10 and 15 x 25, mean 10 + 15·15/98, and the variance by hand
    # below; the quartiles both sit at 10 ms, so a quartile-based spread would be 0
    steps = [10.0] * 84 + [25.0] * 16
    mean = 10 + 15 * 15 / 98
    var = (83 * (10 - mean) ** 2 + 15 * (25 - mean) ** 2) / 97
    assert spread(steps) == pytest.approx(math.sqrt(var))
    assert spread(steps) == pytest.approx(5.43, abs=0.01)
    # one stall of 1000 ms among 99 steps of 10 ms is the trimmed 1%: no spread left; in a short run, under
    # 100 steps, still the single most extreme value at each end; two stalls in 151 steps: ⌈1.51⌉ = 2
    assert spread([10.0] * 99 + [1000.0]) == 0.0
    assert spread([10.0] * 19 + [1000.0]) == 0.0
    assert spread([10.0] * 149 + [1000.0] * 2) == 0.0
    assert spread([1.0, 2.0, 3.0]) == 0.0  # under 4 samples
    assert spread([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(0.5))  # 2 and 3 kept
    with pytest.raises(ValueError, match="trim must be in"):
        spread([1.0] * 10, trim=0.5)
