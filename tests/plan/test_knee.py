"""The planner's closed form for the SLO knee (tessera.plan.model.knee), against queueing results worked out by
hand or computed here from their textbook formulas."""

from __future__ import annotations

import math

import pytest

from tessera.contracts.plan import EngineSettings
from tessera.plan.model.knee import (
    ImageServer,
    IterCosts,
    Load,
    Tail,
    chunk_size,
    erlang_c,
    image_knee,
    md1_wait,
    mmc_wait,
    pd_knee,
    period,
    pooled_image_knee,
    sum_above,
    token_knee,
)


def one(busy: float, latency: float | None = None) -> Load:
    return Load(busy_s=(busy,), latency_s=busy if latency is None else latency)


def test_erlang_c_by_hand() -> None:
    # M/M/1: P(wait) = ρ; M/M/2 at a = 1: C = (a²/2 · 2/(2 − a)) / (1 + a + a²/2 · 2/(2 − a)) = 1/3
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)


def exact_md1_wait_at_most(rho: float, t: float) -> float:
    """Erlang's M/D/1 formula (S = 1): P(W ≤ t) = (1 − ρ) Σ_{k=0}^{⌊t⌋} (ρ(k − t))^k / k! · e^{−ρ(k − t)}."""
    return (1 - rho) * sum((rho * (k - t)) ** k / math.factorial(k) * math.exp(-rho * (k - t))
                           for k in range(int(math.floor(t)) + 1))


@pytest.mark.parametrize(("rho", "t"), [(0.5, 2.0), (0.7, 3.0), (0.9, 5.0)])
def test_md1_tail_against_erlangs_formula(rho: float, t: float) -> None:
    # ρ = 0.5, t = 2 by hand: (1 − ½)(e¹ − ½e^½) = 0.9470, so P(W > 2) = 0.0530
    exact = 1 - exact_md1_wait_at_most(rho, t)
    assert md1_wait(rho, 1.0).above(t) == pytest.approx(exact, rel=0.05)
    assert md1_wait(0.0, 1.0).above(0.0) == 0.0


def test_mm1_tail_by_hand() -> None:
    # M/M/1, λ = 0.5, hold 1 s: P(W > t) = ρ·e^{−(μ − λ)t} = 0.5·e^{−0.5t}
    w = mmc_wait(0.5, 1, 1.0)
    assert w.above(2.0) == pytest.approx(0.5 * math.exp(-1.0))
    assert mmc_wait(2.0, 1, 1.0).above(100.0) == 1.0  # over capacity: everyone waits for ever


def test_sum_of_two_waits_by_hand() -> None:
    # X ~ Exp(1), Y ~ Exp(2), always waiting: P(X + Y > 1) = (2e^{−1} − e^{−2}) / (2 − 1) = 0.6004
    assert sum_above(Tail(1.0, 1.0), Tail(1.0, 2.0), 1.0) == pytest.approx(2 * math.exp(-1) - math.exp(-2))
    # equal rates: Erlang-2, (1 + t)e^{−t}
    assert sum_above(Tail(1.0, 1.0), Tail(1.0, 1.0), 1.0) == pytest.approx(2 * math.exp(-1))
    # one never waits: the other alone
    assert sum_above(Tail(0.3, 1.0), Tail(0.0, 1.0), 1.0) == pytest.approx(0.3 * math.exp(-1))


def test_period_of_two_groups_by_hand() -> None:
    # two resources busy 1 s each per group iteration, latency 2.5 s; a chunk adds 1 s on the first resource
    # and 1 s of latency. Groups cycle in lock step, so the latency is a chunk's (3.5) as soon as either
    # carries one: period = max(2·1 + k·1, 2.5 or 3.5) for k groups with a chunk: k = 0 → 2.5, 1 → 3.5,
    # 2 → 4. At ρ = ½, (others, own) = (0,0) 2.5, (0,1) 3.5, (1,0) 3.5, (1,1) 4, each ¼: mean 3.375,
    # E[p²] = (6.25 + 12.25 + 12.25 + 16)/4 = 11.6875
    base = Load(busy_s=(1.0, 1.0), latency_s=2.5)
    chunk = Load(busy_s=(1.0, 0.0), latency_s=1.0)
    p = period(base, chunk, 2, 0.5)
    assert p.mean_s == pytest.approx(3.375)
    assert p.var_s2 == pytest.approx(11.6875 - 3.375 ** 2)
    assert p.busy_s == pytest.approx((3.5 + 4) / 2)  # own group carries a chunk: the other does or not
    assert p.full_s == pytest.approx(4.0)
    assert period(base, chunk, 2, 0.0).mean_s == pytest.approx(2.5)


def test_knee_bound_by_tpot_by_hand() -> None:
    # one group, an iteration of n decodes takes 10 ms + 1 ms·n, prompt chunks cost nothing; TPOT SLO 20 ms,
    # O = 11 (10 decode iterations). Little's law n = λ·10·τ̄ with τ̄ = 0.01 + 0.001·n gives
    # τ̄ = 0.01 / (1 − 0.01·λ): without spread the knee would be at τ̄ = 20 ms, λ = 50/s. A request's TPOT
    # varies with the decodes beside it: its window's mean of n has variance 2/3·n, times dτ/dn = 1 ms,
    # stretched by 1/(1 − gain), gain = λ·(dτ/dn)·10/2 (arrivals lengthen the window they arrive in):
    # sd = 0.001·√(2n/3) / (1 − 0.005·λ). The knee is where τ̄ + 1.2816·sd = 20 ms (90% below the SLO):
    # at λ = 39.88, τ̄ = 16.633 ms, n = 6.633, sd = 2.627 ms, τ̄ + 1.2816·sd = 20.000 ms.
    def tail(lam: float) -> float:
        tau = 0.01 / (1 - 0.01 * lam)
        n = lam * 10 * tau
        return tau + 1.2815516 * 0.001 * math.sqrt(2 * n / 3) / (1 - 0.005 * lam)

    lo, hi = 1.0, 99.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) <= 0.020 else (lo, mid)
    costs = IterCosts(decode=((1, one(0.011)), (100, one(0.110))), chunk_tokens=1000, chunk=((1, one(0.0)),))
    k = token_knee(costs, EngineSettings(max_num_seqs=100, max_num_batched_tokens=1100, microbatches=1), prompt=100, output=11, ttft_s=5.0,
                   tpot_s=0.020)
    assert lo == pytest.approx(39.88, abs=0.01)
    assert k.rate_per_s == pytest.approx(lo, rel=2e-3)
    assert k.binding == "TPOT"
    assert k.tpot_s == pytest.approx(0.01 / (1 - 0.01 * lo), rel=1e-3)  # the mean TPOT at the knee


def test_knee_bound_by_slots_by_hand() -> None:
    # one slot (B = 1), iterations of 10 ms whatever they carry, prompts of 100 tokens fit one iteration.
    # A request holds the slot for its prefill iteration, half an iteration to join and O − 1 = 10 decodes:
    # H = 0.015 + 0.1 = 0.115 s; M/M/1 for the slot: P(W > t) = λH·e^{−(1/H − λ)t}. TTFT = W + 0.015 must
    # stay within 0.5 s for 90%: λ·0.115·e^{−(1/0.115 − λ)·0.485} = 0.1, solved here by bisection.
    costs = IterCosts(decode=((1, one(0.010)),), chunk_tokens=1000, chunk=((1, one(0.0)),))
    h, t = 0.115, 0.485

    def miss(lam: float) -> float:
        return lam * h * math.exp(-(1 / h - lam) * t)

    lo, hi = 0.0, 1 / h
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if miss(mid) <= 0.1 else (lo, mid)
    k = token_knee(costs, EngineSettings(max_num_seqs=1, max_num_batched_tokens=1001, microbatches=1), prompt=100, output=11, ttft_s=0.5,
                   tpot_s=1.0)
    # the prefill queue (M/D/1, 1 ms of service per prompt) adds a little wait the hand figure leaves out
    assert k.rate_per_s == pytest.approx(lo, rel=0.02)
    assert k.capacity_per_s == pytest.approx(1 / h, rel=0.01)
    assert k.binding == "TTFT"


def test_knee_is_zero_when_unloaded_ttft_misses() -> None:
    # a 1000-token prompt in chunks of 90 tokens (budget 100, 10 decode slots): 12 iterations of 0.2 s = 2.4 s
    costs = IterCosts(decode=((1, one(0.1)), (10, one(0.1))), chunk_tokens=90, chunk=((1, one(0.1 / 90)),))
    k = token_knee(costs, EngineSettings(max_num_seqs=10, max_num_batched_tokens=100, microbatches=1), prompt=1000, output=10, ttft_s=2.0,
                   tpot_s=1.0)
    assert k.rate_per_s == 0.0 and k.binding == "TTFT"
    assert k.ttft_s > 2.0


def test_prefill_decode_knee_by_hand() -> None:
    # prefill steps of 0.1 s per batch (any size up to 8 prompts), decode iterations of 10 ms, 64 places,
    # O = 101: decode holds a place 100·0.01 = 1 s, so the decode side serves up to 64 requests/s;
    # prefill up to 8 / 0.1 = 80/s; the link 1 / 0.001 = 1000/s. Capacity 64/s. TTFT = U·0.1 + 0.1 ≤ 2 s
    # always; TPOT = 10 ms + W/100 must stay ≤ 20 ms: the place wait W ≤ 1 s - 0.001 s for 90%: M/M/64.
    decode = IterCosts(decode=((1, one(0.01)), (64, one(0.01))))
    k = pd_knee(lambda n: 0.1, 8, decode, 64, transfer_s=0.001, prompt=100, output=101, ttft_s=2.0,
                tpot_s=0.02)
    assert k.capacity_per_s == pytest.approx(64.0, rel=1e-3)
    lo, hi = 0.0, 64.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mmc_wait(mid, 64, 1.0).above(0.999) <= 0.1 else (lo, mid)
    assert k.rate_per_s == pytest.approx(lo, rel=1e-3)


def test_gamma_spread_against_the_exponential_and_erlang() -> None:
    from tessera.plan.model.knee import gamma_below

    # cv² = 1 is the exponential: P(G ≤ mean·ln 10) = 0.9 exactly (Wilson–Hilferty: 0.902)
    assert gamma_below(math.log(10), 1.0, 1.0) == pytest.approx(0.9, abs=0.005)
    # cv² = ¼ is Erlang-4 of mean 1 (rate 4): P(G ≤ 1.5) = 1 − e^−6·(1 + 6 + 18 + 36) = 0.8488
    assert gamma_below(1.5, 1.0, 0.25) == pytest.approx(1 - math.exp(-6) * 61, abs=0.005)
    assert gamma_below(0.99, 1.0, 0.0) == 0.0 and gamma_below(1.0, 1.0, 0.0) == 1.0  # no spread: a step


def test_image_knee_of_one_group_is_processor_sharing_by_hand() -> None:
    # One group, an iteration of n images costs 0.1 + 0.05·n s, 10 steps, 100 places (no slot wait): M/G/1
    # processor sharing, whose mean sojourn is insensitive to the job-size law: 10·0.15 / (1 − λ·10·0.05).
    costs = IterCosts(decode=((1, one(0.15)), (100, one(0.1 + 0.05 * 100))))
    k = image_knee(costs, EngineSettings(max_num_seqs=100, max_num_batched_tokens=1, microbatches=1), steps=10, latency_slo_s=6.0)
    assert 0 < k.rate_per_s < 2.0  # ρ = λ·10·0.05 < 1
    assert k.ttft_s == pytest.approx(1.5 / (1 - 0.5 * k.rate_per_s), rel=1e-3)


def test_image_knee_counts_the_other_groups_fixed_cost_by_hand() -> None:
    # Two groups of up to 2 images (4 places) sharing one device; a group's iteration streams the weights once
    # (0.1 s) and adds 0.05 s per image. With N ≥ 1 others in the replica both groups are busy once N + 1 ≥ 2,
    # so an arriving image lives 10·(2·0.1 + 0.05·(N + 1)) s, and the places run out when N = λ·life reaches 4:
    # λ = 4 / (10·(0.2 + 0.05·5)) = 0.889/s. Counting only the per-image cost (all groups at one image) would
    # put it at 1.14/s.
    costs = IterCosts(decode=((1, one(0.15)), (2, one(0.2))))
    k = image_knee(costs, EngineSettings(max_num_seqs=4, max_num_batched_tokens=1, microbatches=2), steps=10, latency_slo_s=1e6)
    assert k.capacity_per_s == pytest.approx(4 / 4.5, rel=1e-4)


def test_pooled_image_knee_by_hand() -> None:
    # Two replicas of one group each, n images costing 0.1 + 0.05·n s per step, 10 steps, many places. Each
    # takes half the traffic: alone, an image lives 10·0.15/(1 − ρ) s (processor sharing, ρ = (λ/2)·10·0.05),
    # of which 10·0.1 s is fixed. Behind a least-loaded router it waits behind others only when both are
    # busy, Erlang C(2, 2ρ) of the time, so the load-borne part shrinks by C(2, 2ρ)/(2ρ).
    costs = IterCosts(decode=((1, one(0.15)), (100, one(0.1 + 0.05 * 100))))
    srv = ImageServer(costs=costs, engine=EngineSettings(max_num_seqs=100, max_num_batched_tokens=1, microbatches=1), steps=10)
    k = pooled_image_knee([(srv, 2, 0.5)], latency_slo_s=4.0)
    rho = k.rate_per_s / 2 * 10 * 0.05
    life = 1.5 / (1 - rho)
    assert k.ttft_s == pytest.approx(1.0 + (life - 1.0) * erlang_c(2, 2 * rho) / (2 * rho), rel=1e-3)
    # pooling never loses: at least two lone replicas' knees, and one replica is the single form
    single = image_knee(costs, EngineSettings(max_num_seqs=100, max_num_batched_tokens=1, microbatches=1), steps=10, latency_slo_s=4.0)
    assert k.rate_per_s >= 2 * single.rate_per_s
    alone = pooled_image_knee([(srv, 1, 1.0)], latency_slo_s=4.0)
    assert alone.rate_per_s == pytest.approx(single.rate_per_s, rel=1e-4)


def test_chunk_size_by_hand() -> None:
    """A prompt as long as the room fills its chunk; a shorter one carries the prompts that arrived during
    one iteration, at least one: E[N | N ≥ 1] = x / (1 − e^{−x}) of a Poisson count of mean x."""
    assert chunk_size(2.0, 0.5, 4096, 2000.0) == 2000.0
    assert chunk_size(1e-12, 0.5, 500, 2000.0) == 500.0  # nearly idle: alone
    assert math.isclose(chunk_size(2.0, 0.5, 500, 2000.0), 500 / (1 - math.exp(-1.0)))  # x = 1: 1.582 prompts
    assert chunk_size(100.0, 0.5, 500, 2000.0) == 2000.0  # 50 arrive per iteration: the room is full


def test_short_chunk_priced_with_a_fixed_part_per_chunk() -> None:
    """A device whose chunk of s tokens beside the group's decodes adds F + δ·s seconds (a fixed part per
    chunk, F = 40 ms, δ = 0.1 ms per token), sampled per token at the room (Q = 2,000) and at one prompt
    (500): chunk_of prices every size in between at F + δ·s, full chunks as before, and a second resource
    without a fixed part (2 µs per token) at its own rate."""
    f, d, q, s0 = 0.040, 1e-4, 2000, 500
    per = lambda s: Load(busy_s=((f + d * s) / s, 2e-6), latency_s=(f + d * s) / s)  # noqa: E731
    costs = IterCosts(decode=((64, Load(busy_s=(0.02, 0.0), latency_s=0.02)),), chunk_tokens=q, chunk=((64, per(q)),), small=(s0, per(s0)))
    for size in (500, 800, 1250, 2000):
        c = costs.chunk_of(size, 64, size)
        assert math.isclose(c.busy_s[0], f + d * size) and math.isclose(c.latency_s, f + d * size)
        assert math.isclose(c.busy_s[1], 2e-6 * size)
    assert costs.chunk_of(q, 64) == costs.chunk_of(q, 64, q)  # full chunks: the room's per-token cost
