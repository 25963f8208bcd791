"""The serving model every plan is scored under: continuous-batching iterations, asynchronous micro-batches,
batch and micro-batch count chosen by memory and SLO (docs/plan.md "The serving model").

Steady state of an engine serving requests of P prompt and O output tokens at batch B (sequences in flight):
  - one iteration decodes B tokens and prefills a chunk of C = B·P/O prompt tokens (each finishing request
    is replaced by a new one), split over m micro-batches: b = ⌈B/m⌉ decode sequences and c = ⌈C/m⌉ chunk
    tokens each (shapes.IterShape); decode attention at the mean context P + O/2; a chunk shorter than a
    prompt attends to a mean prefix of (P − c)/2, a longer one holds ⌈c/P⌉ whole prompts;
  - KV resident per micro-batch: b·(P + ⌈O/2⌉) tokens + one prompt being prefilled (P);
  - a vision-language model whose prompts hold an image (Traffic.image_tokens) also runs its vision tower
    on c / P images per micro-batch iteration (one per prompt started), before the language model;
  - the m micro-batches advance independently through the placement: with T the busiest device's or
    link's time per micro-batch and L one micro-batch's latency through it,
        period = max(m·T, L)
    (the synchronous form, reported beside it, simulates the m micro-batches through the placement:
    sync_period_s);
    (expected_period_s: where T and L vary from iteration to iteration, as a served stream's mixed steps
    on shared CPUs do, the period is the expectation of that max, not the max of the expectations; a
    steady-state iteration on a GPU repeats the same kernels, and the planner takes the spreads as 0);
    TPOT = period; output throughput = B / period tokens/s; TTFT = (⌈P / c⌉ + 1)·period (a prompt is
    chunked at c tokens per iteration of its micro-batch, after waiting up to one iteration to join);
  - image models (denoise): B images per step, m micro-batches; images/s = B / (steps·period); the
    latency of an image is steps·period.
Goodput is the output rate of an operating point that meets the SLO (TTFT and TPOT; image latency) at the
highest arrival rate that keeps 90% of requests within it once they queue, for the batch's places and for
the prefill chunks (M/M/c, slo_rate); 0 when the point misses the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from tessera.errors import UserError
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.shapes import IterShape
from tessera.plan.verify import POLICIES, Evaluation, evaluate_cached, pipelined_latency_s

# Batch sizes searched (sequences or images in flight): powers of two and the halfway points.
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Service-level objective; defaults as in `tessera plan --help`."""

    ttft_s: float = 2.0  # time to first token
    tpot_s: float = 0.1  # time per output token
    image_s: float = 60.0  # latency of one image (diffusion)

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s", "image_s"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise UserError(f"SLO {k}={v!r} must be a positive number of seconds")


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """What requests look like: prompt and output tokens (LLM), denoising steps per image (diffusion)."""

    prompt: int = 1024
    output: int = 256
    steps: int = 28
    image_tokens: int = 0  # of the prompt, one image's tokens (a VLM's vision tower encodes it once per request)

    def __post_init__(self) -> None:
        for k in ("prompt", "output", "steps"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"{k}={v!r} must be a positive integer")
        if not isinstance(self.image_tokens, int) or not 0 <= self.image_tokens <= self.prompt:
            raise UserError(f"image tokens={self.image_tokens!r} must be an integer from 0 to the prompt's "
                            f"{self.prompt} tokens")


def steady_shape(batch: int, m: int, t: Traffic) -> IterShape:
    """One micro-batch's iteration at batch ``batch`` split ``m`` ways (module doc)."""
    b = math.ceil(batch / m)
    c = math.ceil(batch * t.prompt / t.output / m)
    prefix = max(0, (t.prompt - c) // 2) if c < t.prompt else 0
    return IterShape(decode=b, context=t.prompt + t.output // 2, chunk=c, chunk_len=min(c, t.prompt),
                     prefix=prefix, kv_tokens=b * (t.prompt + math.ceil(t.output / 2)) + t.prompt,
                     encode_images=encoded_images(c, t))


def encoded_images(chunk: int, t: Traffic) -> float:
    """Images a VLM's vision tower encodes per iteration whose chunk prefills ``chunk`` prompt tokens: one
    per prompt started, chunk / P on average (0 without image tokens)."""
    return chunk / t.prompt if t.image_tokens else 0.0


def image_shape(batch: int, m: int) -> IterShape:
    return IterShape(images=math.ceil(batch / m))


@dataclass(frozen=True, kw_only=True)
class Point:
    """One strategy's placement at one batch and micro-batch count, scored by the serving model."""

    batch: int
    microbatches: int
    assignment: tuple[int, ...]
    evaluation: Evaluation  # the verifier's loads at the micro-batch shape
    memory_bytes: tuple[dict[str, int], ...]  # whole step: weights, kv/state × m, activations
    period_s: float
    ttft_s: float
    throughput: float  # output tokens/s (images/s for image models), one cell
    images: bool
    fits: bool
    meets_slo: bool
    reason: str | None  # why it does not fit or misses the SLO
    slo_throughput: float = 0.0  # the throughput at the highest arrival rate meeting the SLO (slo_rate)

    @property
    def goodput(self) -> float:
        return self.slo_throughput if self.fits and self.meets_slo else 0.0

    @property
    def tpot_s(self) -> float | None:
        return None if self.images else self.period_s


def whole_step_memory(ev: Evaluation, m: int) -> tuple[dict[str, int], ...]:
    """Bytes per device for the whole step: kv/state of all m micro-batches, activations of one."""
    return tuple({k: (v * m if k in ("kv", "state") else v) for k, v in d.items()} for d in ev.memory_bytes)


def over_memory(mem: tuple[dict[str, int], ...], units: tuple[GpuSpec, ...]) -> str | None:
    short = [(sum(md.values()) - u.mem_bytes, i) for i, (md, u) in enumerate(zip(mem, units, strict=True))]
    worst = max(short)
    if worst[0] <= 0:
        return None
    i = worst[1]
    return (f"needs {sum(mem[i].values()) / 1e9:.1f} GB on {units[i].name} (device {i}), capacity "
            f"{units[i].mem_bytes / 1e9:.1f} GB")


SLO_TARGET = 0.9  # fraction of requests that must meet the SLO for an arrival rate to count as goodput


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with offered load a = λ/μ < c (Erlang C, from
    the Erlang B recursion B_k = a·B_{k−1} / (k + a·B_{k−1}), which stays stable for large c)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1 - b))


def slo_rate(slots: int, service_s: float, budget_s: float, target: float = SLO_TARGET) -> float:
    """The largest arrival rate (requests/s) at which a fraction ``target`` of requests waits at most
    ``budget_s`` for one of ``slots`` places held ``service_s`` each: M/M/c, P(W > t) = C(c, a)·e^−(cμ−λ)t.
    Exponential service is the pessimistic end (a request's hold time barely varies at fixed lengths)."""
    if budget_s < 0 or slots < 1 or service_s <= 0:
        return 0.0
    mu = 1.0 / service_s
    cap = slots * mu

    def ok(lam: float) -> bool:
        return erlang_c(slots, lam / mu) * math.exp(-(cap - lam) * budget_s) <= 1 - target

    lo, hi = 0.0, cap
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def expected_period_s(queued_s: float, latency_s: float, queued_sd_s: float = 0.0, latency_sd_s: float = 0.0,
                      covariance: float = 0.0) -> float:
    """E[max(X, Y)], the asynchronous period when its two terms vary from iteration to iteration: X the
    bottleneck's m queued micro-batches (mean m·T, standard deviation ``queued_sd_s``), Y one micro-batch's
    path back to its own next iteration (mean L, ``latency_sd_s``), taken as jointly normal with
    ``covariance`` (s²: the two share that micro-batch's own step on the bottleneck) (Clark, "The greatest
    of a finite set of random variables", Operations Research 9(2), 1961):
        θ = √(σ_X² + σ_Y² − 2·cov),  α = (m·T − L) / θ,  E = m·T·Φ(α) + L·Φ(−α) + θ·φ(α).
    Where the terms meet (α = 0) a micro-batch finds the bottleneck busy with another about half the time
    and the period exceeds both by θ/√(2π); far apart it is the larger; θ = 0 gives max(m·T, L)."""
    theta = math.sqrt(max(0.0, queued_sd_s ** 2 + latency_sd_s ** 2 - 2 * covariance))
    if theta == 0.0:
        return max(queued_s, latency_s)
    a = (queued_s - latency_s) / theta
    n = NormalDist()
    return queued_s * n.cdf(a) + latency_s * n.cdf(-a) + theta * n.pdf(a)


def score_point(g: KernelGraph, assignment: tuple[int, ...], *, batch: int, m: int, units: tuple[GpuSpec, ...],
                link: LinkSpec, cost, traffic: Traffic, slo: Slo, extra_latency_s: float = 0.0) -> Point:
    """Score a placement of micro-batch graph ``g`` (built at steady_shape(batch, m) or image_shape)."""
    ev = evaluate_cached(g, assignment, units, link, cost)
    mem = whole_step_memory(ev, m)
    t = ev.bottleneck_s
    period = expected_period_s(m * t, ev.latency_s)  # spreads 0: max(m·T, L)
    images = g.phase != "mixed"
    if images:
        thr = batch / (traffic.steps * period)
        ttft = traffic.steps * period
        meets = ttft <= slo.image_s
        why = None if meets else f"image latency {ttft:.2f} s > SLO {slo.image_s:g} s"
    else:
        c = g.shape.get("chunk", 0)
        ttft = (max(1, math.ceil(traffic.prompt / max(1, c))) + 1) * period + extra_latency_s
        thr = batch / period
        meets = ttft <= slo.ttft_s and period <= slo.tpot_s
        why = None if meets else (f"TPOT {period * 1e3:.1f} ms > SLO {slo.tpot_s * 1e3:g} ms"
                                  if period > slo.tpot_s else f"TTFT {ttft:.2f} s > SLO {slo.ttft_s:g} s")
    over = over_memory(mem, units)
    good = 0.0
    if meets and over is None:
        # goodput: the arrival rate at which SLO_TARGET of requests still meet the latency SLO once they queue
        # for one of the batch's places (held for a request's whole life), in output units per second
        if images:
            good = min(thr, slo_rate(batch, ttft, slo.image_s - ttft))
        else:
            hold = ttft + (traffic.output - 1) * period
            c = max(1, g.shape.get("chunk", 1))
            # prompts also queue for the chunks: each micro-batch's chunk prefills ⌊c/P⌋ prompts per period
            # (c ≥ P) or one prompt per ⌈P/c⌉ periods
            servers, per = (m * (c // traffic.prompt), period) if c >= traffic.prompt else \
                (m, math.ceil(traffic.prompt / c) * period)
            budget = slo.ttft_s - ttft
            good = min(thr, slo_rate(batch, hold, budget) * traffic.output,
                       slo_rate(servers, per, budget) * traffic.output)
        if good <= 0:
            meets, why = False, "no arrival rate keeps 90% of requests within the SLO once they queue"
    return Point(batch=batch, microbatches=m, assignment=tuple(assignment), evaluation=ev, memory_bytes=mem,
                 period_s=period, ttft_s=ttft, throughput=thr, images=images,
                 fits=over is None, meets_slo=meets, reason=over or why, slo_throughput=good)


def sync_period_s(g: KernelGraph, p: Point, units: tuple[GpuSpec, ...], link: LinkSpec, cost) -> float:
    """The synchronous schedule's iteration at point ``p`` of micro-batch graph ``g`` (its m micro-batches
    restart together every iteration): the better of the runtime's two issue orders through p's placement
    (pipelined_latency_s: cyclic, the serving workers' on CPU and on CUDA with gloo; in order, the NCCL
    path's CUDA stream), clamped so that it is never faster than the asynchronous period max(m·T, L) as
    the planner counts it (evaluate, whose links also carry each message's latency, which the event model
    overlaps). Not latency + (m − 1)·T: that is exact only for a two-stage chain, and on a placement that
    crosses between devices several times per step it is no schedule at all (it can be far above or below
    what the micro-batches take)."""
    m, ev = p.microbatches, p.evaluation
    runs = min(pipelined_latency_s(g, p.assignment, units, link, cost, m, policy) for policy in POLICIES)
    return max(m * ev.bottleneck_s, ev.latency_s, runs)


Placer = Callable[[KernelGraph, int, int], tuple[int, ...] | None]  # (graph, batch, m) -> assignment or None


def batch_ceiling(base: KernelGraph, units: tuple[GpuSpec, ...], traffic: Traffic, images: bool,
                  cap: int | None) -> int:
    """Largest batch worth trying: KV of that many sequences fits beside the weights in all memory."""
    weights = sum(b.bytes for b in base.buffers if b.role == Role.WEIGHT)
    free = sum(u.mem_bytes for u in units) - weights
    if free <= 0:
        return 0
    r = base.shape.get("batch", 1)
    per_seq = sum(b.bytes for b in base.buffers if b.role in (Role.KV, Role.STATE)) / max(1, r)
    if not images:
        slots = base.shape.get("context", 0) + 1
        per_seq = per_seq / slots * (traffic.prompt + traffic.output) if any(
            b.role == Role.KV for b in base.buffers) else per_seq
    top = int(free // per_seq) if per_seq > 0 else BATCHES[-1]
    return max(1, min(top, cap or BATCHES[-1], BATCHES[-1]))


def search(graph_at: Callable[[int, int], KernelGraph], placer: Placer, *, units: tuple[GpuSpec, ...],
           link: LinkSpec, cost, traffic: Traffic, slo: Slo, ms: tuple[int, ...], ceiling: int,
           extra_latency_s: Callable[[tuple[int, ...]], float] | None = None,
           floor: Callable[[KernelGraph, int, int], float] | None = None) -> tuple[Point | None, Point | None]:
    """(best point meeting memory and SLO, the fastest point that fits at all) over batches ≤ ceiling and ms.

    Per m, batches are tried from the ceiling down: memory and both latencies grow with the batch, so the
    first point that fits and meets the SLO is that m's largest feasible batch; smaller ones are tried
    while goodput still grows (a smaller batch can queue less when its period leaves more TTFT budget).
    The second answer (lowest TPOT, then TTFT) says how far the SLO is when no point meets it.
    ``floor(graph, batch, m)``, when given, is a lower bound on the period of any placement of that graph that
    fits memory (bound.period_floor); a point whose floor already misses the SLO is not placed (for the
    MILP, most of the search's time), so the first answer is the same as without it. The second is then the
    same too when no point meets the SLO (the only case a caller reads it): the skipped points are placed
    afterwards from the lowest floor up, until a floor exceeds the fastest period found.
    """
    best: Point | None = None
    best_fit: Point | None = None
    missed: list[tuple[float, int, int]] = []  # (floor, batch, m) of points the floor says miss the SLO

    def place(b: int, m: int) -> Point | None:
        nonlocal best_fit
        g = graph_at(b, m)
        a = placer(g, b, m)
        if a is None:
            return None
        p = score_point(g, a, batch=b, m=m, units=units, link=link, cost=cost, traffic=traffic, slo=slo,
                        extra_latency_s=extra_latency_s(a) if extra_latency_s else 0.0)
        if p.fits and (best_fit is None or (p.period_s, p.ttft_s) < (best_fit.period_s, best_fit.ttft_s)):
            best_fit = p
        return p

    for m in ms:
        m_best: Point | None = None
        for b in [x for x in BATCHES if x <= ceiling][::-1]:
            if m > b:
                continue
            if floor is not None:
                g = graph_at(b, m)
                f = floor(g, b, m)
                if f == math.inf:
                    continue  # nothing fits memory there
                if f > slo_period_cap(g, traffic, slo):  # misses the SLO whatever the placement
                    missed.append((f, b, m))  # only the fastest-fitting answer can need it (below)
                    continue
            p = place(b, m)
            if p is not None and p.fits and p.meets_slo:
                if m_best is not None and p.goodput < m_best.goodput:
                    break  # goodput past its peak for this m (smaller batches queue more and serve less)
                m_best = p
        if m_best is not None and (best is None or m_best.goodput > best.goodput):
            best = m_best
    if best is None:
        # nothing meets the SLO: the fastest fitting point says how far it is. Points the floor skipped are
        # placed from the lowest floor up, until a floor exceeds the fastest period found.
        for f, b, m in sorted(missed):
            if best_fit is not None and f > best_fit.period_s:
                break
            place(b, m)
    return best, best_fit


def slo_period_cap(g: KernelGraph, traffic: Traffic, slo: Slo) -> float:
    """The longest period at which a point of micro-batch graph ``g`` can meet the SLO (score_point): TPOT,
    and TTFT = (⌈P / c⌉ + 1)·period at the graph's chunk c; for images, steps·period ≤ the image SLO."""
    if g.phase != "mixed":
        return slo.image_s / traffic.steps
    c = max(1, g.shape.get("chunk", 0))
    return min(slo.tpot_s, slo.ttft_s / (max(1, math.ceil(traffic.prompt / c)) + 1))
