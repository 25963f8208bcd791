"""The planner's closed form for goodput: the SLO knee of a continuous-batching engine, from step costs.

Goodput is the highest arrival rate λ (requests/s, Poisson) at which a target share of requests (90%)
meets both TTFT and TPOT. The simulator finds it by bisection over simulated runs; the planner needs it
for every candidate operating point, so it is worked out here in closed form from the costs of one
micro-batch's iteration (``IterCosts``) and the engine settings (sequences B, micro-batches m, token
budget K per micro-batch iteration). The model, per micro-batch (group) at rate λ_g = λ/m:

  steady state   n = λ_g·(O − 1)·τ̄ decodes per iteration (Little's law over a request's O − 1 decode
                 iterations), prompt tokens c̄ = λ_g·P·τ̄ per iteration; an iteration either carries a
                 full chunk of Q = K − n prompt tokens (the prefill queue is busy) or none, so a share
                 ρ = c̄ / Q of the iterations carry one (ρ < 1: prefill capacity is fractional, not tied
                 to the batch); a chunk's tokens are priced at the size chunks really carry (a prompt
                 shorter than Q shares its chunk only with the prompts that arrived during the iteration
                 before: chunk_size), a short chunk costing more per token (IterCosts.size_factor);
  period         one iteration of a group lasts max(Σ_groups busy on the bottleneck, its own latency):
                 max_r(m·T0_r + X·Δ_r, L0 + Y·ΔL), r every device and link, X the groups carrying a
                 chunk (the own one, Y ~ Bernoulli(ρ), plus Binomial(m − 1, ρ) others), T0/L0 the busy
                 and latency without a chunk, Δ what a chunk adds; the latency is a chunk's whenever any
                 group carries one (the groups wait on each other's stages and cycle in lock step); τ̄
                 its mean (a fixed point, since n and c̄ grow with τ̄);
  TPOT           a request's mean over its O − 1 iterations: normal, mean τ̄, its variance from the prompts
                 arriving while it decodes (compound Poisson: each adds P/Q chunk iterations) and the
                 decodes running beside it rising and falling with the same arrivals (tpot_sd);
  TTFT           the prefill queue's wait (M/D/1, each prompt holding the server for its share of an
                 iteration carrying chunks of that size, prefill_service_s;
                 tail by the Cramér–Lundberg approximation), plus the wait for a slot when all B are
                 taken (M/M/c, Erlang C, held TTFT + (O − 1)·τ̄), plus half a group's turn to join,
                 plus its own prefill: ⌈P/Q⌉ busy iterations when it starts an iteration's chunk,
                 1 + P/Q on average when it starts mid-chunk (behind another prompt);
  attainment     P(TTFT ≤ SLO) · P(TPOT ≤ SLO), the two taken as independent.

The knee is the largest λ below capacity whose attainment reaches the target (attainment falls with λ).
Image models (denoising steps) use the same pieces without chunks: a request holds a slot for ``steps``
iterations and its latency is the slot wait plus those iterations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist

from tessera.contracts.plan import EngineSettings
from tessera.contracts.slo import SLO_TARGET


@dataclass(frozen=True, kw_only=True)
class Load:
    """Per-resource busy seconds of one micro-batch iteration (devices, then directed links) and its
    latency through the placement alone."""

    busy_s: tuple[float, ...]
    latency_s: float

    def plus(self, other: Load, w: float = 1.0) -> Load:
        return Load(busy_s=tuple(a + w * b for a, b in zip(self.busy_s, other.busy_s, strict=True)),
                    latency_s=self.latency_s + w * other.latency_s)

    def minus(self, other: Load) -> Load:
        return self.plus(other, -1.0)


@dataclass(frozen=True, kw_only=True)
class IterCosts:
    """What one micro-batch iteration costs on a placement, sampled where the knee needs it.

    ``decode``: (n, load) with no prompt chunk, n decode sequences, sorted by n (interpolated linearly,
    held below the first and extrapolated above the last); ``chunk``: (n, what one prompt token adds to
    an iteration of n decodes), sorted by n, interpolated the same way in n and scaled by the chunk's
    tokens (a chunk costs more beside few decodes, whose GEMMs it turns from memory- to compute-bound,
    than beside many; each sample is measured at the full chunk its n leaves, K − n, where the knee's
    busy iterations run); ``chunk_tokens``: the budget's chunk room at the group's full batch, K − ⌈B/m⌉
    (0: no chunk sampled); ``small``: (s, what one prompt token adds to the group's full batch of decodes
    in a chunk of s < chunk_tokens tokens), or None: a chunk that carries fewer tokens than the budget's
    room (one short prompt alone) costs more per token, by a fixed part per chunk a + β/s fitted through
    the two sizes, per resource (size_factor); ``fit``: see period()."""

    decode: tuple[tuple[int, Load], ...]
    chunk_tokens: int = 0
    chunk: tuple[tuple[int, Load], ...] = ()
    small: tuple[int, Load] | None = None
    fit: Fit | None = None  # period() scaling by the number of groups carrying a chunk (None: a chain)

    def at(self, n: float) -> Load:
        return interpolated(self.decode, n)

    def chunk_of(self, q: float, n: float, size: float | None = None) -> Load:
        """What a chunk of ``q`` tokens adds beside n decodes, priced per token as chunks of ``size``
        tokens are (None: full chunks of the budget's room)."""
        if not self.chunk or not self.chunk_tokens:
            raise ValueError("these costs sample no prompt chunk")
        c = interpolated(self.chunk, n)
        if size is None or self.small is None or size >= self.chunk_tokens:
            return Load(busy_s=tuple(b * q for b in c.busy_s), latency_s=c.latency_s * q)
        f = self.size_factor(size)
        return Load(busy_s=tuple(b * q * x for b, x in zip(c.busy_s, f[0], strict=True)),
                    latency_s=c.latency_s * q * f[1])

    def size_factor(self, size: float) -> tuple[tuple[float, ...], float]:
        """Per resource (busy, then latency): a chunk of ``size`` tokens' cost per token over a full one's,
        a + β/s through 1 at the budget's room and the ``small`` sample's ratio at its size, held beyond
        both (a ratio below 1, a chunk that is cheaper per token when smaller, is kept as measured)."""
        s0, q = self.small[0], self.chunk_tokens
        s = min(max(size, s0), q)
        w = (1 / s - 1 / q) / (1 / s0 - 1 / q)  # 0 at the room, 1 at the small sample
        busy = tuple(1 + w * (r - 1) for r in self._small_ratio[0])
        return busy, 1 + w * (self._small_ratio[1] - 1)

    @cached_property
    def _small_ratio(self) -> tuple[tuple[float, ...], float]:
        """Per resource, the small chunk's cost per token over the full chunk's, both beside the group's
        full batch (the last decode sample); 1 where a full chunk adds nothing."""
        full, small = self.chunk[-1][1], self.small[1]
        ratio = lambda a, b: a / b if b > 0 else 1.0  # noqa: E731
        return (tuple(ratio(a, b) for a, b in zip(small.busy_s, full.busy_s, strict=True)),
                ratio(small.latency_s, full.latency_s))


def interpolated(pts: tuple[tuple[int, Load], ...], n: float) -> Load:
    """Piecewise linear in n through the samples, held below the first, extrapolated above the last."""
    if n <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (n0, l0), (n1, l1) in zip(pts, pts[1:], strict=False):
        if n <= n1 or (n1, l1) == pts[-1]:
            return between(l0, l1, (n - n0) / (n1 - n0))
    raise AssertionError("unreachable")


def between(l0: Load, l1: Load, w: float) -> Load:
    """l0 + w·(l1 − l0), in one pass (bit for bit l0.plus(l1.minus(l0), w): b + (−1)·a is b − a exactly);
    the knee's fixed points interpolate ~10⁵ times per cell."""
    return Load(busy_s=tuple(a + w * (b - a) for a, b in zip(l0.busy_s, l1.busy_s, strict=True)),
                latency_s=l0.latency_s + w * (l1.latency_s - l0.latency_s))


@dataclass(frozen=True, kw_only=True)
class Knee:
    """The closed form's answer for one operating point."""

    rate_per_s: float  # requests/s at the knee (0: no rate meets the SLO)
    capacity_per_s: float  # requests/s at which the engine saturates (a slot, the prefill budget)
    tpot_s: float  # mean TPOT at the knee (images: mean iteration)
    ttft_s: float  # mean TTFT at the knee (images: mean latency of an image)
    attainment: float  # at the knee
    binding: str  # what stops the rate from growing: "TTFT", "TPOT", "latency", "slots", "prefill budget"
    decode_seqs: float  # n at the knee, per micro-batch
    chunk_share: float  # ρ at the knee: share of iterations that carry a prompt chunk


# ---- queueing tails --------------------------------------------------------------------------------------------


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with offered load a = λ/μ < c (Erlang C, from
    the Erlang B recursion B_k = a·B_{k−1} / (k + a·B_{k−1}), which stays stable for large c)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1 - b))


@dataclass(frozen=True)
class Tail:
    """P(W > t) = mass·e^(−rate·t) for t ≥ 0 (W = 0 with probability 1 − mass)."""

    mass: float
    rate: float

    def above(self, t: float) -> float:
        if t < 0:
            return 1.0
        return min(1.0, self.mass * math.exp(-self.rate * t)) if self.mass > 0 else 0.0


NO_WAIT = Tail(0.0, 1.0)


def md1_wait(lam: float, service_s: float) -> Tail:
    """Waiting time of an M/D/1 queue (arrivals λ, service time S, ρ = λS < 1), Cramér–Lundberg: the decay
    θ solves λ(e^{θS} − 1) = θ and P(W > t) ≈ C·e^{−θt}, C = (1 − ρ)/(λ·S·e^{θS} − 1), which overstates
    P(W > 0) only where t is small. (ρ = 0.5, S = 1, t = 2: 0.0536 against the exact 0.0530 of Erlang's
    M/D/1 formula.)"""
    rho = lam * service_s
    if rho <= 0:
        return NO_WAIT
    if rho >= 1 - 1e-9:  # saturated (within rounding of it: θ → 0 and C → 1)
        return Tail(1.0, 0.0)
    f = lambda x: rho * math.expm1(x) - x  # noqa: E731  x = θS; f < 0 on (0, root), convex
    lo, hi = 0.0, 1.0
    while f(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    x = hi
    return Tail((1 - rho) / (rho * math.exp(x) - 1), x / service_s)


def mmc_wait(lam: float, servers: int, hold_s: float) -> Tail:
    """Waiting time for one of ``servers`` places each held ``hold_s`` (M/M/c): P(W > t) = C(c, a)·e^{−(c/H − λ)t},
    a = λH. Exponential holding is the pessimistic end (a request's hold barely varies at fixed lengths)."""
    a = lam * hold_s
    if a <= 0:
        return NO_WAIT
    if a >= servers:
        return Tail(1.0, 0.0)
    return Tail(erlang_c(servers, a), servers / hold_s - lam)


def sum_above(x: Tail, y: Tail, t: float) -> float:
    """P(X + Y > t) for independent X, Y each 0 or exponential (``Tail``)."""
    if t < 0:
        return 1.0
    a, b = x.mass, y.mass
    out = a * (1 - b) * x.above(t) / a if a > 0 else 0.0
    out += b * (1 - a) * y.above(t) / b if b > 0 else 0.0
    if a > 0 and b > 0:
        al, be = x.rate, y.rate
        if al <= 0 or be <= 0:
            return 1.0
        if abs(al - be) < 1e-12 * max(al, be):
            both = (1 + al * t) * math.exp(-al * t)
        else:
            both = (be * math.exp(-al * t) - al * math.exp(-be * t)) / (be - al)
        out += a * b * both
    return min(1.0, out)


# ---- the iteration at a load -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Period:
    mean_s: float
    var_s2: float
    busy_s: float  # mean period of an iteration that carries the own group's chunk
    full_s: float  # period when every group carries a chunk (the prefill queue is busy)


Fit = tuple[tuple[float, float], ...]  # per k of m groups carrying a chunk: (f for a group without, f with)


def period(base: Load, chunk: Load, m: int, rho: float, fit: Fit | None = None) -> Period:
    """The period of one group's iteration: max over resources of the m groups' busy time, each group's
    carrying ``chunk`` with probability ρ, and the latency of an iteration with a chunk when any group
    carries one (module doc), exact over the Binomial(m − 1, ρ) other groups and the own Bernoulli(ρ).
    The groups share their devices first come first served, so a group's iteration waits behind every
    stage of another's chunk: each cycles at the pace of the slowest iteration in flight. ``fit[k][y]``
    scales the period when k groups carry a chunk, the own group among them (y = 1) or not (y = 0): how
    the placement's groups really interleave, measured by an event model (tessera.plan.model.serving.
    interleaving); 1 for a chain."""
    pairs = tuple(zip(base.busy_s, chunk.busy_s, strict=True))
    lat1 = base.latency_s + chunk.latency_s
    # per k of the m groups carrying a chunk: the busiest resource, or the latency (a chunk in any group
    # holds up every group: they cycle in lock step)
    v = [max(max([m * t0 + k * d for t0, d in pairs]), lat1 if k else base.latency_s) for k in range(m + 1)]
    # v0[k], v1[k]: scaled by fit[k][y], the own group not carrying a chunk (y = 0) or carrying one
    v0, v1 = ([fit[k][0] * v[k] for k in range(m + 1)], [fit[k][1] * v[k] for k in range(m + 1)]) if fit else (v, v)
    mean = sq = busy = 0.0
    for x in range(m):
        px = math.comb(m - 1, x) * rho ** x * (1 - rho) ** (m - 1 - x)
        a, b = v0[x], v1[x + 1]
        mean += px * ((1 - rho) * a + rho * b)
        sq += px * ((1 - rho) * a * a + rho * b * b)
        busy += px * b
    return Period(mean_s=mean, var_s2=max(0.0, sq - mean * mean), busy_s=busy, full_s=v1[m])


# ---- the knee of a token-serving point -------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """The steady state at one arrival rate (per micro-batch)."""

    n: float  # decodes per iteration
    rho: float  # share of iterations carrying a chunk
    q: float  # chunk room Q = K − n
    per: Period
    feasible: bool
    why: str  # when not feasible: "slots" or "prefill budget"
    own_s: float = 0.0  # a request's own prefill: its chunks' iterations and half a group's turn to join
    hold_s: float = 0.0  # seconds a request holds its slot: own_s + (O − 1)·τ̄
    size: float | None = None  # tokens a chunk carries (chunk_size); None: full chunks of the room Q


def steady(costs: IterCosts, e: EngineSettings, prompt: int, output: int, lam: float,
           hint: tuple[float, float | None] = (0.0, None)) -> State:
    """The fixed point τ̄ = E[period(n(τ̄), ρ(τ̄))] at rate ``lam`` (requests/s, whole replica); ``hint``:
    fixed_point's bracket from other rates."""
    m, b, k = e.microbatches, e.group_seqs, e.max_num_batched_tokens
    lg = lam / m

    def at(tau: float) -> State:
        n = lg * max(0, output - 1) * tau
        q = k - n
        if n > b:
            return State(n, 1.0, q, period(costs.at(b), costs.chunk_of(max(q, 0), b), m, 1.0, costs.fit), False,
                         "slots")
        if q <= 0:
            return State(n, 1.0, q, period(costs.at(n), costs.chunk_of(0, n), m, 1.0, costs.fit), False,
                         "prefill budget")
        rho = lg * prompt * tau / q
        if rho >= 1:
            return State(n, 1.0, q, period(costs.at(n), costs.chunk_of(q, n), m, 1.0, costs.fit), False,
                         "prefill budget")
        size = chunk_size(lg, tau, prompt, q)
        per = period(costs.at(n), costs.chunk_of(q, n, size), m, rho, costs.fit)
        own_iters = (1 - rho) * math.ceil(prompt / q) + rho * (1 + prompt / q)
        own = own_iters * per.busy_s + per.mean_s / (2 * m)
        hold = own + max(0, output - 1) * per.mean_s
        if lam * hold >= e.max_num_seqs:  # every slot taken: the engine's sequences bound the rate
            return State(n, rho, q, per, False, "slots", own, hold, size)
        return State(n, rho, q, per, True, "", own, hold, size)

    return fixed_point(at, b, *hint)


def fixed_point(at: Callable[[float], State], b: float, below: float = 0.0,
                above: float | None = None) -> State:
    """The smallest τ with E[period at τ] = τ. g(τ) = period(τ) − τ is positive at the empty engine's period
    and, the period growing with τ, crosses zero at the fixed point, if there is one before the state
    breaks (λ beyond what the engine serves). Bracketed by doubling, then regula falsi (Illinois).
    ``below``/``above``: τ known to lie below/above the fixed point (those of a lower and a higher rate:
    the period grows with the rate), which spare the bracketing."""
    at = remembered(at)
    lo = max(at(0.0).per.mean_s, below)
    s_lo = at(lo)
    if not s_lo.feasible:
        return s_lo
    g_lo = s_lo.per.mean_s - lo
    if g_lo <= 1e-12 * lo:
        return s_lo
    hi = lo
    if above is not None and above > lo:
        s_above = at(above)
        if s_above.feasible and s_above.per.mean_s <= above:
            hi = above / 2  # the loop below doubles it back and stops there
    for _ in range(60):
        hi *= 2
        s_hi = at(hi)
        if not s_hi.feasible:  # the state breaks before τ doubles: is there a crossing before it does?
            a, z = lo, hi
            for _ in range(BREAK_STEPS):
                mid = (a + z) / 2
                a, z = (mid, z) if at(mid).feasible else (a, mid)
            s_a = at(a)
            if s_a.per.mean_s > a:
                return at(z)  # the period still outruns τ where the state breaks: saturated
            hi, s_hi = a, s_a
            break
        if s_hi.per.mean_s <= hi:
            break
        lo, s_lo, g_lo = hi, s_hi, s_hi.per.mean_s - hi
    else:
        return State(s_hi.n, s_hi.rho, s_hi.q, s_hi.per, False, "slots" if s_hi.n >= b * 0.99 else "prefill budget")
    g_hi, side = s_hi.per.mean_s - hi, 0
    for _ in range(FIXED_POINT_STEPS):
        if hi - lo <= 1e-9 * hi:
            break
        mid = hi - g_hi * (hi - lo) / (g_hi - g_lo) if g_hi != g_lo else (lo + hi) / 2
        mid = min(max(mid, lo + 1e-12 * hi), hi - 1e-12 * hi)
        s_mid = at(mid)
        g_mid = s_mid.per.mean_s - mid
        if g_mid > 0:
            lo, g_lo = mid, g_mid
            g_hi, side = (g_hi / 2, side) if side == -1 else (g_hi, -1)
        else:
            hi, g_hi = mid, g_mid
            g_lo, side = (g_lo / 2, side) if side == 1 else (g_lo, 1)
    return at(hi)


def remembered(at: Callable[[float], State]) -> Callable[[float], State]:
    """``at`` answering a τ it was asked before from memory: fixed_point asks again for the bracket's end
    it returns (a State is a pure function of τ)."""
    seen: dict[float, State] = {}

    def once(tau: float) -> State:
        s = seen.get(tau)
        if s is None:
            s = seen[tau] = at(tau)
        return s

    return once


FIXED_POINT_STEPS = 60  # regula falsi steps; the bracket closes to 1e-9 in far fewer
BREAK_STEPS = 20  # bisection steps for where the state breaks: 1e-6 of the bracket


def chunk_size(lam_g: float, tau: float, prompt: int, room: float) -> float:
    """Tokens a prompt chunk carries at steady state: a prompt longer than the budget's room fills it; a
    shorter one shares its chunk with the prompts that arrived during the iteration before (Poisson at
    λ_g over τ̄, given at least one: E[N | N ≥ 1] = x / (1 − e^{−x}), x = λ_g·τ̄), at most the room."""
    if prompt >= room:
        return room
    x = lam_g * tau
    return min(room, prompt * (x / -math.expm1(-x) if x > 1e-9 else 1.0))


def prefill_service_s(costs: IterCosts, e: EngineSettings, s: State, prompt: int) -> float:
    """Seconds of the pooled prefill server per prompt (the M/D/1 of TTFT). Every group's iteration carries
    a chunk of ``s.size`` tokens (size/P prompts) while the queue is busy; it holds the server for that
    iteration's period, shared by the m groups' prompts. With full chunks that is m·Q tokens per full
    iteration; with fewer, the decodes' part of the iteration is shared by fewer prompts."""
    m, q = e.microbatches, max(s.q, 1.0)
    size = s.size if s.size is not None else q
    tau = period(costs.at(s.n), costs.chunk_of(size, s.n, size), m, 1.0, costs.fit).full_s
    return prompt * tau / (m * size)


def ttft_above(s: State, e: EngineSettings, prompt: int, output: int, lam: float, t: float,
               service_s: float | None = None) -> tuple[float, float]:
    """(P(TTFT > t), mean TTFT) at steady state ``s``; ``service_s``: the prefill server's seconds per
    prompt (prefill_service_s; default: full chunks, m·Q tokens per full iteration)."""
    m, q = e.microbatches, max(s.q, 1.0)
    pf = md1_wait(lam, service_s if service_s is not None else prompt * s.per.full_s / (m * q))
    slot = mmc_wait(lam, e.max_num_seqs, s.hold_s)
    return sum_above(pf, slot, t - s.own_s), s.own_s + _mean(pf) + _mean(slot)


def _mean(w: Tail) -> float:
    return w.mass / w.rate if w.mass > 0 and w.rate > 0 else (math.inf if w.mass > 0 else 0.0)


def tpot_sd(costs: IterCosts, e: EngineSettings, s: State, prompt: int, output: int, lam: float) -> float:
    """Standard deviation of a request's TPOT, the mean period over its O − 1 decode iterations (a window
    of W = (O − 1)·τ̄ seconds). Iterations are not independent: the prompts arriving in the window (Poisson,
    λ·W of them) each add P/Q chunk iterations, in runs, and the running decodes n rise and fall with the
    same arrivals. So the window's total time is τ̄·(O − 1) plus
        A·(N − λW),  A = (P/Q)·(dτ̄/dρ)/m, the time one prompt's chunks add to the groups' periods;
        (dτ/dn)·(O − 1)·(n̄_W − n), n̄_W the window's mean of the own group's decodes, whose variance is
        2/3 of n (a count of arrivals over a window as long as the window it is averaged over);
    the two share the own group's arrivals: covariance (λ/m)·W/2 between N and n̄_W. The window itself
    lengthens with N (each arrival adds to the periods it spans), which feeds back: the spread is divided
    by one minus that gain."""
    if output <= 1 or lam <= 0:
        return 0.0
    m, q, n, tau = e.microbatches, max(s.q, 1.0), s.n, s.per.mean_s
    base, chunk = costs.at(n), costs.chunk_of(q, n, s.size)
    h = min(0.01, s.rho, 1 - s.rho) or 0.005
    lo, hi = max(0.0, s.rho - h), min(1.0, s.rho + h)
    fit = costs.fit
    dtau_drho = (period(base, chunk, m, hi, fit).mean_s - period(base, chunk, m, lo, fit).mean_s) / (hi - lo)
    dn = max(1.0, 0.05 * n)
    dtau_dn = (period(costs.at(n + dn), chunk, m, s.rho, fit).mean_s
               - period(costs.at(max(0.0, n - dn)), chunk, m, s.rho, fit).mean_s) / (n + dn - max(0.0, n - dn))
    w, it = (output - 1) * tau, output - 1
    a = prompt / q * dtau_drho / m
    var = a * a * lam * w + (dtau_dn * it) ** 2 * (2 / 3) * n + 2 * a * dtau_dn * it * (lam / m) * w / 2
    # the window stretches with what arrives in it, and more arrives in a longer window: each second more
    # brings λ prompts adding A each, and λ/m decodes adding dτ/dn·(O − 1)/2 on average (they join midway)
    gain = min(0.9, lam * a + (lam / m) * dtau_dn * it / 2)
    return math.sqrt(max(0.0, var)) / it / (1 - gain)


def tpot_below(s: State, sd: float, t: float) -> float:
    if sd == 0:
        return 1.0 if s.per.mean_s <= t else 0.0
    return NormalDist(s.per.mean_s, sd).cdf(t)


def token_knee(costs: IterCosts, e: EngineSettings, *, prompt: int, output: int, ttft_s: float, tpot_s: float,
               target: float = SLO_TARGET) -> Knee:
    """The SLO knee of a token-serving point (module doc)."""
    solved: dict[float, float] = {}  # rate -> τ̄ of the feasible states found so far

    def state(lam: float) -> State:
        below = max((t for r, t in solved.items() if r < lam), default=0.0)
        above = min((t for r, t in solved.items() if r > lam), default=None)
        s = steady(costs, e, prompt, output, lam, (below, above))
        if s.feasible:
            solved[lam] = s.per.mean_s
        return s

    def attain(lam: float) -> tuple[float, State, float, float, float]:
        s = state(lam)
        if not s.feasible:  # beyond capacity the queue grows without bound
            return 0.0, s, math.inf, 0.0, 0.0
        miss_ttft, mean_ttft = ttft_above(s, e, prompt, output, lam, ttft_s,
                                          prefill_service_s(costs, e, s, prompt) if costs.small else None)
        ok_tpot = tpot_below(s, tpot_sd(costs, e, s, prompt, output, lam), tpot_s)
        return (1 - miss_ttft) * ok_tpot, s, mean_ttft, 1 - miss_ttft, ok_tpot

    cap = capacity(state, output, costs, e)
    return knee_of(attain, cap, target)


def capacity(state: Callable[[float], State], output: int, costs: IterCosts, e: EngineSettings) -> float:
    """The largest rate (requests/s) with a feasible steady state: a slot turns over at most every
    (O − 1) empty-engine periods, so B / that bounds it from above."""
    hi = 2 * e.max_num_seqs / (max(1, output - 1) * max(costs.at(1).latency_s, 1e-12))
    while state(hi).feasible:
        hi *= 2
        if hi > 1e12:
            raise ValueError("the engine never saturates: step costs of zero?")
    lo = 0.0
    for _ in range(CAPACITY_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if state(mid).feasible else (lo, mid)
    return lo


CAPACITY_STEPS = 20  # bisection steps: 1e-6 of the bound
KNEE_STEPS = 17  # bisection steps for the knee: 1e-5 of capacity


def knee_of(attain: Callable[[float], tuple[float, State, float, float, float]], cap: float,
            target: float) -> Knee:
    """Bisection over λ ∈ (0, cap) for the largest rate whose attainment reaches ``target``."""
    a0, s0, t0, ok_ttft0, ok_tpot0 = attain(cap * 1e-6)
    if a0 < target:
        why = "TTFT" if ok_ttft0 < ok_tpot0 else "TPOT"
        return Knee(rate_per_s=0.0, capacity_per_s=cap, tpot_s=s0.per.mean_s, ttft_s=t0, attainment=a0,
                    binding=why, decode_seqs=s0.n, chunk_share=s0.rho)
    lo, hi = cap * 1e-6, cap * (1 - 1e-9)
    if attain(hi)[0] >= target:
        lo = hi
    else:
        for _ in range(KNEE_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if attain(mid)[0] >= target else (lo, mid)
    a, s, ttft, _, _ = attain(lo)
    # what breaks just above the knee: the engine saturating, or the share meeting TTFT or TPOT
    _, s_hi, _, ok_ttft, ok_tpot = attain(min(cap, lo * (1 + 1e-6)) if lo < hi else cap * (1 + 1e-6))
    binding = (s_hi.why or "slots") if not s_hi.feasible else "TTFT" if ok_ttft <= ok_tpot else "TPOT"
    return Knee(rate_per_s=lo, capacity_per_s=cap, tpot_s=s.per.mean_s, ttft_s=ttft, attainment=a,
                binding=binding, decode_seqs=s.n, chunk_share=s.rho)


# ---- the knee of an image point --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ImageServer:
    """One replica serving images: a request holds one of B places for ``steps`` iterations of its group.
    Each group's iteration costs every resource r a fixed a_r (the weights it streams, paid once per busy
    group) plus c_r per image in it (a denoising step is compute-bound); both are read off the samples at 1
    and b images. With N images in the replica spread over the m groups (a share u = min(1, N/m) of them
    busy), an iteration lasts τ(N) = max(max_r m·u·a_r + c_r·N, the own group's latency), so an image that
    arrives to N others lives steps·τ(N + 1) and Little's law N = λ·steps·τ(N + 1) closes the mean (for one
    group this is M/G/1 processor sharing: steps·τ(1) / (1 − ρ), ρ = λ·steps·c at the bottleneck). Its part
    beyond the fixed steps·(τ(1) − c) is gamma-distributed with squared coefficient of variation ρ (none
    unloaded, an exponential's near saturation), and it waits for a place when all B are taken (M/M/c).
    The other groups' fixed costs are what make a many-group pipeline of few images slower than its
    per-image cost alone says."""

    costs: IterCosts
    engine: EngineSettings
    steps: int

    # derived once per replica (cached_property writes the instance's __dict__, which frozen allows):
    # tau() runs inside every bisection step of the knee

    @cached_property
    def per_image_s(self) -> tuple[float, ...]:
        """c_r: what one more image in a group adds to each resource's busy seconds."""
        b, one, top = self.engine.group_seqs, self.costs.at(1), self.costs.at(self.engine.group_seqs)
        return tuple((t - o) / (b - 1) if b > 1 else o for o, t in zip(one.busy_s, top.busy_s, strict=True))

    @cached_property
    def fixed_busy_s(self) -> tuple[float, ...]:
        """a_r: what a busy group costs each resource whatever its images."""
        return tuple(max(0.0, o - c) for o, c in zip(self.costs.at(1).busy_s, self.per_image_s, strict=True))

    @cached_property
    def fit(self) -> float:
        return self.costs.fit[0][0] if self.costs.fit else 1.0

    def tau(self, n_img: float) -> float:
        """Seconds per iteration with ``n_img`` images in the replica."""
        m, b = self.engine.microbatches, self.engine.group_seqs
        u = min(1.0, max(n_img, 1.0) / m)
        own = min(float(b), max(1.0, n_img / (m * u)))
        busy = max(m * u * a + c * n_img for a, c in zip(self.fixed_busy_s, self.per_image_s, strict=True))
        return self.fit * max(busy, self.costs.at(own).latency_s)

    @cached_property
    def c_s(self) -> float:
        """An image's seconds of the bottleneck per step, as the groups interleave."""
        return self.fit * max(self.per_image_s)

    @cached_property
    def fixed_s(self) -> float:
        """The part of an image's latency no load adds to: its steps alone, less its own share."""
        return self.steps * max(0.0, self.tau(1.0) - self.c_s)

    def state(self, lam: float) -> State:
        e, steps = self.engine, self.steps
        rho = lam * steps * self.c_s
        n = _little(lambda x: lam * steps * self.tau(x + 1.0), e.max_num_seqs) if rho < 1 else math.inf
        life = steps * self.tau(n + 1.0) if math.isfinite(n) else math.inf
        ok = rho < 1 and math.isfinite(n) and lam * life < e.max_num_seqs
        per = Period(mean_s=life / steps if ok else self.tau(1.0), var_s2=0.0, busy_s=0.0, full_s=0.0)
        return State(n / e.microbatches if ok else float(e.group_seqs), rho, 0.0, per, ok, "" if ok else "slots",
                     0.0, life)

    def met(self, s: State, lam: float, slo_s: float, shrink: float = 1.0, cv2: float | None = None) -> float:
        """P(an image's latency ≤ ``slo_s``) at state ``s``: the gamma spread beyond the fixed part (its
        load-borne part scaled by ``shrink``, its squared coefficient of variation ``cv2``, ρ by default),
        and the wait for a place."""
        fixed = self.fixed_s
        shared = gamma_below(slo_s - fixed, (s.hold_s - fixed) * shrink, s.rho if cv2 is None else cv2)
        slot = mmc_wait(lam, self.engine.max_num_seqs, s.hold_s)
        return min(shared, 1 - slot.above(slo_s - s.hold_s))


def image_knee(costs: IterCosts, e: EngineSettings, *, steps: int, latency_slo_s: float,
               target: float = SLO_TARGET) -> Knee:
    """The SLO knee of one image replica (ImageServer)."""
    srv = ImageServer(costs=costs, engine=e, steps=steps)

    def attain(lam: float) -> tuple[float, State, float, float, float]:
        s = srv.state(lam)
        if not s.feasible:
            return 0.0, s, math.inf, 0.0, 0.0
        ok = srv.met(s, lam, latency_slo_s)
        return ok, s, s.hold_s + _mean(mmc_wait(lam, e.max_num_seqs, s.hold_s)), ok, 1.0

    cap = capacity(srv.state, steps, costs, e)
    k = knee_of(attain, cap, target)
    return k if k.binding != "TTFT" else Knee(**{**k.__dict__, "binding": "latency"})


def pooled_image_knee(members: Sequence[tuple[ImageServer, int, float]], *, latency_slo_s: float,
                      target: float = SLO_TARGET) -> Knee:
    """The SLO knee of R image replicas behind a least-loaded router. ``members``: (replica, count, its
    share of the traffic per replica); the shares sum to 1 over all R replicas. Each replica's mean load
    is its own (ImageServer at its share of λ); what the router changes is who shares: an image waits
    behind others only when every replica is busy, which happens with the Erlang C probability C(R, R·ρ̄)
    at the replicas' mean utilisation ρ̄, not with each replica's own ρ. So the load-borne part of the
    latency shrinks by C(R, R·ρ̄)/(R·ρ̄) (M/M/R's wait over M/M/1's at the same ρ) and its spread is C
    instead of ρ; one replica (R = 1) is ImageServer's own form."""
    r_total = sum(n for _, n, _ in members)
    if r_total < 1 or abs(sum(n * w for _, n, w in members) - 1) > 1e-6:
        raise ValueError(f"pooled_image_knee: shares {[w for *_, w in members]} x counts must sum to 1")

    def attain(lam: float) -> tuple[float, State, float, float, float]:
        states = [(srv, n, lam * w, srv.state(lam * w)) for srv, n, w in members]
        lead = states[0][3]
        if not all(s.feasible for *_, s in states):
            return 0.0, lead, math.inf, 0.0, 0.0
        rho = min(sum(n * s.rho for _, n, _, s in states) / r_total, 1 - 1e-12)
        wait = erlang_c(r_total, r_total * rho) if rho > 0 else 0.0
        shrink = wait / (r_total * rho) if rho > 0 else 1.0
        ok = sum(n * l_i * srv.met(s, l_i, latency_slo_s, shrink, wait) for srv, n, l_i, s in states) / lam
        mean = sum(n * l_i * (srv.fixed_s + (s.hold_s - srv.fixed_s) * shrink) for srv, n, l_i, s in states) / lam
        return ok, lead, mean, ok, 1.0

    def pool_state(lam: float) -> State:  # capacity needs only whether every replica still copes
        states = [srv.state(lam * w) for srv, _, w in members]
        return next((s for s in states if not s.feasible), states[0])

    lead_srv = members[0][0]
    cap = capacity(pool_state, lead_srv.steps, lead_srv.costs, EngineSettings(
        max_num_seqs=sum(srv.engine.max_num_seqs * n for srv, n, _ in members), max_num_batched_tokens=1))
    k = knee_of(attain, cap, target)
    return k if k.binding != "TTFT" else Knee(**{**k.__dict__, "binding": "latency"})


def _little(f: Callable[[float], float], limit: float) -> float:
    """The least N ≥ 0 with N = f(N), f increasing (the images in the replica at a rate); inf when none
    lies below ``limit`` places."""
    lo, hi = 0.0, float(limit)
    if f(hi) > hi:
        return math.inf
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > mid else (lo, mid)
    return hi


def gamma_below(t: float, mean: float, cv2: float) -> float:
    """P(G ≤ t) for G gamma-distributed with ``mean`` and squared coefficient of variation ``cv2``
    (Wilson–Hilferty: (G/mean)^(1/3) is near normal); a processor-sharing sojourn's spread grows from none
    at no load towards an exponential's (cv2 = 1) as the load ρ = cv2 nears 1."""
    if mean <= 0:
        return 1.0 if t >= 0 else 0.0
    if t <= 0:
        return 0.0
    if cv2 <= 1e-9:
        return 1.0 if t >= mean else 0.0
    k = 1 / cv2  # shape
    z = ((t / mean) ** (1 / 3) - (1 - 1 / (9 * k))) / math.sqrt(1 / (9 * k))
    return NormalDist().cdf(z)


# ---- the knee of a prefill/decode pair --------------------------------------------------------------------


def pd_knee(prefill_s: Callable[[float], float], max_prompts: int, decode: IterCosts, decode_seqs: int, *,
            transfer_s: float, prompt: int, output: int, ttft_s: float, tpot_s: float,
            target: float = SLO_TARGET) -> Knee:
    """Prefill/decode on two instances (DistServe). Prefill runs back to back, each step taking every prompt
    waiting (up to ``max_prompts`` n, ``prefill_s(k)`` seconds for k prompts): at rate λ its steps settle at
    k = λ·s(k) prompts; once a queue forms the steps fill to n, so the instance saturates at n / s(n)
    requests/s and a prompt queues as in an M/D/1 queue served s(n)/n per prompt. TTFT = that wait + the
    step in flight's remainder (half a step while busy, on average) + its own step.
    Decode: ``decode_seqs`` places held O − 1 iterations of τ(n), n = λ·(O − 1)·τ; a prefilled request
    waits for a place (M/M/c) and the wait, with its KV's transfer, falls between its first and second
    token: TPOT = τ + (W + transfer)/(O − 1). Capacity: the least of the three rates."""
    per_prompt_s = prefill_s(max_prompts) / max_prompts  # saturated prefill: full steps, back to back

    def prefill_batch(lam: float) -> float:  # k = λ·s(k) by fixed-point iteration from one prompt
        k = 1.0
        for _ in range(200):
            nxt = min(float(max_prompts), max(1.0, lam * prefill_s(k)))
            if abs(nxt - k) < 1e-9:
                break
            k = nxt
        return k

    none = decode.at(1).minus(decode.at(1))  # no chunk: decode runs alone

    def decode_state(lam: float) -> State:
        def at(tau: float) -> State:
            n = lam * max(0, output - 1) * tau
            per = period(decode.at(min(n, decode_seqs)), none, 1, 0.0)
            ok = n <= decode_seqs
            return State(n, 0.0, 0.0, per, ok, "" if ok else "slots", 0.0, max(0, output - 1) * per.mean_s)

        return fixed_point(at, decode_seqs)

    def feasible(lam: float) -> bool:
        d = decode_state(lam)
        return lam * per_prompt_s < 1 and lam * transfer_s < 1 and d.feasible and lam * d.hold_s < decode_seqs

    def attain(lam: float) -> tuple[float, State, float, float, float]:
        d = decode_state(lam)
        if not feasible(lam):
            return 0.0, d, math.inf, 0.0, 0.0
        s_k = prefill_s(prefill_batch(lam))
        own = s_k + min(1.0, lam * s_k) * s_k / 2  # its step, after half the one in flight while busy
        queue = md1_wait(lam, per_prompt_s)
        ok_ttft = 1 - queue.above(ttft_s - own)
        wait = mmc_wait(lam, decode_seqs, d.hold_s)
        ok_tpot = 1.0 if output <= 1 else 1 - wait.above((tpot_s - d.per.mean_s) * (output - 1) - transfer_s)
        return ok_ttft * ok_tpot, d, own + _mean(queue), ok_ttft, ok_tpot

    hi = 1.0
    while feasible(hi):
        hi *= 2
    lo = 0.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if feasible(mid) else (lo, mid)
    return knee_of(attain, lo, target)


__all__: Sequence[str] = ("SLO_TARGET", "EngineSettings", "Fit", "ImageServer", "IterCosts", "Knee", "Load", "erlang_c",
                          "image_knee", "pooled_image_knee",
                          "md1_wait", "mmc_wait", "pd_knee", "period", "sum_above", "token_knee")
