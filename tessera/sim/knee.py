"""The SLO knee: the highest Poisson arrival rate at which at least ``target`` of the requests meet the SLO
(TTFT and TPOT; an image plan's latency per image), found by bisection over the rate. It is the simulator's
goodput, the figure the planner's ``Plan.goodput_per_s`` is checked against (docs/sim.md "The SLO knee").

Transient and noise:
- every rate is simulated from an empty cell with ``requests`` requests per seed; the first ``warmup``
  share of them (by arrival) fill the cell and are not judged, the rest are, the last ones included (their
  drain is a few batches out of thousands of requests);
- ``requests`` defaults to 10 × the sequences the pool runs at once (at least 2,000, at most 50,000): the
  judged requests then span several lifetimes of a full batch, and a rate past the cell's capacity, whose
  queue grows for the whole run, is judged past it (TTFT misses once the queue holds a TTFT's worth of
  requests); where the SLO has more slack than the run has time (a TPOT averaged over thousands of output
  tokens hides a long wait for a decode slot), a run whose backlog grows over the judged span meets it for none
  (unstable), so a rate past capacity fails however long the SLO lets a queue grow;
- attainment at a rate is pooled over ``seeds``; every rate reuses the same seeds, whose Poisson arrivals at
  rate λ are one set of exponential draws divided by λ (common random numbers), so attainment falls with the
  rate as the bisection assumes instead of jumping between rates by chance. Another set of seeds gives
  another estimate: the spread between them is the knee's noise, the bisection's ``rel_tol`` its resolution.

Bracket: the plan's goodput (else its capacity; else an offline run's completion rate) as requests/s, then
steps of ×1.5 up or down until one rate meets the target and one misses; then halving until the two are within
``rel_tol`` of each other. The knee is the higher rate that met it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim.api import run
from tessera.sim.metrics import meets_slo
from tessera.sim.model import ITER_PHASES, SchedulerConfig
from tessera.sim.traffic import (
    images,
    mean_tokens,
    plan_capacity_per_s,
    plan_goodput_per_s,
    plan_lengths,
    plan_slo,
)
from tessera.sim.workload import LengthSpec, WorkloadSpec

STEP = 1.5  # bracketing factor
MAX_STEPS = 12  # bracketing steps each way before giving up
MIN_REQUESTS, MAX_REQUESTS, PER_SEQUENCE = 2_000, 50_000, 10


@dataclass(frozen=True, kw_only=True)
class KneeConfig:
    target: float = 0.9  # share of requests that must meet the SLO
    requests: int | None = None  # per seed and rate; None: PER_SEQUENCE × sequences the pool runs at once
    seeds: tuple[int, ...] = (0, 1)
    warmup: float = 0.2  # share of the requests, by arrival, not judged
    rel_tol: float = 0.02  # the bisection stops when the bracket is within this share of its top
    max_rates: int = 40  # rates simulated at most

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise UserError(f"knee target={self.target} must be in (0, 1]")
        if self.requests is not None and self.requests < 10:
            raise UserError(f"knee requests={self.requests} must be >= 10")
        if not self.seeds:
            raise UserError("the knee needs at least one seed")
        if not 0 <= self.warmup < 0.9:
            raise UserError(f"knee warmup={self.warmup} must be in [0, 0.9)")
        if not 0 < self.rel_tol < 1:
            raise UserError(f"knee rel_tol={self.rel_tol} must be in (0, 1)")
        if self.max_rates < 3:
            raise UserError(f"knee max_rates={self.max_rates} must be >= 3")


@dataclass(frozen=True, kw_only=True)
class MeasuredKnee:
    """The knee and how it was found. Rates in requests/s; ``per_s`` in output tokens/s (images/s)."""

    rate_per_s: float  # highest rate simulated that met the target (0: none did)
    per_s: float  # rate × mean output tokens (× 1 image per request): comparable with Plan.goodput_per_s
    unit: str  # "tokens/s" | "images/s"
    attainment: float | None  # at the knee (None: no rate met the target)
    above_rate_per_s: float | None  # lowest rate simulated that missed it (None: none did)
    above_attainment: float | None
    target: float
    slo: dict[str, float | None] = field(hash=False)
    prompt: str
    output: str
    requests: int  # per seed and rate
    seeds: tuple[int, ...]
    warmup: float
    rel_tol: float
    rates: int  # rates simulated
    wall_s: float  # real seconds the search took
    planner_per_s: float | None  # the plan's own goodput (all cells), where it has one
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds)}


def concurrency(plan: Plan | PoolPlan, replicas: int = 1) -> int:
    """Sequences (images) the pool runs at once: each cell's engine settings, else its iterative phase's
    largest sampled batch (a mixed phase's, one micro-batch's: times its micro-batches)."""
    def seqs(p: Plan) -> int:
        if p.engine is not None:
            return p.engine.max_num_seqs
        it = next((p.phases[k] for k in ITER_PHASES if k in p.phases), None)
        if it is None:
            return 1
        top = max((s.batch for s in it.points), default=1)
        return top * it.microbatches if it.phase == Phase.MIXED else top

    cells = [(c.plan, c.count) for c in plan.cells] if isinstance(plan, PoolPlan) else [(plan, 1)]
    return replicas * sum(n * p.replicas * seqs(p) for p, n in cells)


def unstable(arrival_s: np.ndarray, done_s: np.ndarray, skip: int, slots: int) -> bool:
    """Whether the run's backlog grew through its judged arrivals beyond what chance moves it. The requests
    in the system (arrived, not done) as each judged request arrives are averaged over the first and the
    last quarter of the judged arrivals; the backlog grew when the second mean exceeds the first by more
    than three standard deviations of a stable count (√ of it, Poisson-like; a mean over a quarter of the
    run moves less) and by more than GROWTH_SHARE of the judged arrivals, and exceeds the ``slots`` the
    pool runs at once (a queue has formed: a count that grows within the slots is the engine settling into
    a fuller batch, as one whose step cost rises steeply with the batch does). A rate the cell cannot sustain
    leaves a backlog that grows for the whole run; a finite run that ends before the backlog reaches the
    SLO's slack (a TPOT averaged over thousands of output tokens hides a long wait for a decode slot)
    would otherwise pass it. Such a run counts as meeting the SLO for none of its requests: at that rate
    every request would, in time, wait without bound."""
    t, done = np.sort(arrival_s), np.sort(done_s)
    judged = len(t) - skip
    if judged < 8:
        return False
    n = np.arange(1, len(t) + 1) - np.searchsorted(done, t, side="right")  # in the system at each arrival
    q = judged // 4
    first, last = n[skip:skip + q].mean(), n[-q:].mean()
    return bool(last > slots and last - first > max(3 * np.sqrt(first + 1), GROWTH_SHARE * judged))


GROWTH_SHARE = 0.02  # backlog growth, as a share of the judged arrivals, that marks a rate past capacity


@dataclass
class _Search:
    """One knee search: the workload at a rate, and every rate's attainment (pooled over the seeds)."""

    plan: Plan | PoolPlan
    prompt: LengthSpec
    output: LengthSpec
    slo: LatencyTargets
    cfg: KneeConfig
    requests: int
    scheduler: SchedulerConfig | None
    replicas: int
    seen: dict[float, float] = field(default_factory=dict)

    def attainment(self, rate: float) -> float:
        if rate not in self.seen:
            if len(self.seen) >= self.cfg.max_rates:
                raise _Exhausted
            w = WorkloadSpec(kind="poisson", requests=self.requests, rate_per_s=rate, prompt=self.prompt,
                             output=self.output)
            skip = int(self.cfg.warmup * self.requests)
            good = judged = 0
            for seed in self.cfg.seeds:
                per = run(self.plan, w, replicas=self.replicas, seed=seed, config=self.scheduler).requests
                assert per is not None
                ok = meets_slo(self.slo, per.arrival_s, per.first_s, per.done_s, per.output)
                order = np.argsort(per.arrival_s, kind="stable")[skip:]
                if not unstable(per.arrival_s, per.done_s, skip, concurrency(self.plan, self.replicas)):
                    good += int(ok[order].sum())
                judged += len(order)
            self.seen[rate] = good / judged
        return self.seen[rate]

    def meets(self, rate: float) -> bool:
        return self.attainment(rate) >= self.cfg.target


class _Exhausted(Exception):
    """max_rates simulated before the bracket closed."""


def _start_rate(s: _Search) -> float:
    """Requests/s to start from: the plan's goodput, else its capacity, else an offline run's completions."""
    per = plan_goodput_per_s(s.plan) or plan_capacity_per_s(s.plan)
    mean_out = 1.0 if images(s.plan) else mean_tokens(s.output, 1)
    if per:
        return per * s.replicas / mean_out
    w = WorkloadSpec(kind="offline", requests=s.requests, prompt=s.prompt, output=s.output)
    r = run(s.plan, w, replicas=s.replicas, seed=s.cfg.seeds[0], config=s.scheduler).result
    if not r.requests_per_s > 0:
        raise UserError(f"plan {s.plan.model}/{s.plan.strategy} completes no request offline; it has no knee")
    return r.requests_per_s


def _bracket(s: _Search, rate: float) -> tuple[float | None, float | None]:
    """(a rate meeting the target, a higher one missing it); None where the steps ran out."""
    lo = hi = None
    if s.meets(rate):
        lo = rate
        for _ in range(MAX_STEPS):
            rate *= STEP
            if not s.meets(rate):
                return lo, rate
            lo = rate
        return lo, None
    hi = rate
    for _ in range(MAX_STEPS):
        rate /= STEP
        if s.meets(rate):
            return rate, hi
        hi = rate
    return None, hi


def _bisect(s: _Search) -> tuple[float | None, float | None, str]:
    """(the highest rate found meeting the target, the lowest found missing it above it, a note when the
    search fell short)."""
    cfg = s.cfg
    try:
        lo, hi = _bracket(s, _start_rate(s))
        while lo is not None and hi is not None and hi - lo > cfg.rel_tol * hi:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if s.meets(mid) else (lo, mid)
        note = ""
    except _Exhausted:
        lo = max((r for r, a in s.seen.items() if a >= cfg.target), default=None)
        hi = min((r for r, a in s.seen.items() if a < cfg.target and (lo is None or r > lo)), default=None)
        note = f"stopped after {cfg.max_rates} rates before the bracket closed to {cfg.rel_tol:.0%}"
    if lo is None:
        note = note or (f"the SLO is missed by more than {1 - cfg.target:.0%} of requests even at "
                        f"{hi:.4g} req/s")
    elif hi is None:
        note = note or f"the target is still met at {lo:.4g} req/s, the highest rate tried"
    return lo, hi, note


def find_knee(plan: Plan | PoolPlan, *, prompt: LengthSpec | None = None, output: LengthSpec | None = None,
              slo: LatencyTargets | None = None, config: KneeConfig | None = None,
              scheduler: SchedulerConfig | None = None, replicas: int = 1) -> MeasuredKnee:
    """The SLO knee of ``plan`` (``replicas`` copies behind the router) under Poisson arrivals of ``prompt``
    and ``output`` lengths (default: the plan's traffic) and ``slo`` (default: the plan's)."""
    cfg = config or KneeConfig()
    t0 = time.perf_counter()
    p_def, o_def = plan_lengths(plan)
    prompt, output = prompt or p_def, output or o_def
    slo = slo or plan_slo(plan)
    if slo is None or not slo.given:
        raise UserError(f"plan {plan.model}/{plan.strategy} names no SLO, and the knee needs one: give "
                        "--slo-ttft-ms and/or --slo-tpot-ms (--slo-e2e-ms for an image plan)")
    n = cfg.requests or min(MAX_REQUESTS, max(MIN_REQUESTS, PER_SEQUENCE * concurrency(plan, replicas)))
    s = _Search(plan=plan, prompt=prompt, output=output, slo=slo, cfg=cfg, requests=n, scheduler=scheduler,
                replicas=replicas)
    lo, hi, note = _bisect(s)
    mean_out = 1.0 if images(plan) else mean_tokens(output, 1)
    planner = plan_goodput_per_s(plan)
    return MeasuredKnee(rate_per_s=lo or 0.0, per_s=(lo or 0.0) * mean_out,
                        unit="images/s" if images(plan) else "tokens/s",
                        attainment=s.seen.get(lo) if lo is not None else None, above_rate_per_s=hi,
                        above_attainment=s.seen.get(hi) if hi is not None else None, target=cfg.target,
                        slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
                        prompt=str(prompt), output=str(output), requests=n, seeds=cfg.seeds,
                        warmup=cfg.warmup, rel_tol=cfg.rel_tol,
                        rates=len(s.seen), wall_s=time.perf_counter() - t0,
                        planner_per_s=None if planner is None else planner * replicas,
                        note=note)
