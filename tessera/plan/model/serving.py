"""The serving model every plan is scored under: continuous-batching iterations with a token budget,
asynchronous micro-batches, goodput as the SLO knee (docs/plan.md "The serving model").

An engine serving requests of P prompt and O output tokens runs m micro-batches (groups) of at most
⌈B/m⌉ running sequences each (B: vLLM's max_num_seqs); one iteration of a group carries all its decodes
and prompt chunks up to a token budget K (max_num_batched_tokens), set independently of B. The m groups
advance independently through the placement: with T the busiest device's or link's time per group
iteration and L one iteration's latency through it, the period is max(m·T, L) (the synchronous form,
reported beside it, simulates the m micro-batches through the placement: sync_period_s).

A placement is made at the full-load mean mix (steady_shape: ⌈B/m⌉ decodes and the chunk C = B·P/O/m
that keeps prefill level with decode) and then costed at the shapes the knee needs (decode-only at
1, ½ and all of a group's sequences; one full chunk of K − ⌈B/m⌉ tokens beside them), from which
tessera.plan.model.knee works out the SLO knee: the highest arrival rate at which 90% of requests (Slo.target)
meet TTFT and TPOT. Goodput is that rate in output tokens/s; B, m and K are searched, K over BUDGETS.
Image models (denoise): B images in flight, an iteration one denoising step of a group's images.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import Phase
from tessera.contracts.plan import EngineSettings
from tessera.contracts.slo import Slo
from tessera.errors import UserError
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.model.knee import Fit, ImageServer, IterCosts, Knee, Load, image_knee, token_knee
from tessera.plan.model.shapes import IterShape
from tessera.plan.solver.verify import (
    POLICIES,
    PlacementEvaluation,
    async_period_cached,
    evaluate_cached,
    pipelined_latency_s,
)

# Batch sizes searched (sequences or images in flight): powers of two and the halfway points.
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


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


# Token budgets tried per micro-batch iteration (vLLM's max_num_batched_tokens; 512–8,192 in practice).
BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
FIT_BUDGET = 2048  # the budget whose chunk measures how a placement's groups interleave (interleaving)


def kv_tokens_per_seq(t: Traffic, batch: int) -> float:
    """KV tokens one running sequence holds on average, with room for the spread of a batch's ages: P + O/2
    plus two standard deviations of the mean age of ``batch`` sequences whose ages are uniform over
    [0, O] (O/√(12·batch) each). The batch ceiling and the memory check both use it."""
    return t.prompt + t.output / 2 + 2 * t.output / math.sqrt(12 * max(1, batch))


def steady_shape(batch: int, m: int, t: Traffic) -> IterShape:
    """One micro-batch's iteration at full load, where placements are made: ⌈B/m⌉ decodes at the mean
    context P + O/2 and the mean prompt chunk that keeps prefill level with decode, C = B·P/O over m."""
    b = math.ceil(batch / m)
    return chunk_shape(b, math.ceil(batch * t.prompt / t.output / m), t, batch, m)


def chunk_shape(decode: int, chunk: int, t: Traffic, batch: int, m: int) -> IterShape:
    """A group iteration of ``decode`` sequences and ``chunk`` prompt tokens (a chunk shorter than a prompt
    attends to a mean prefix of (P − c)/2; a longer one holds ⌈c/P⌉ whole prompts); KV of the whole group
    (``batch`` 0: none, for a shape costed but not fitted, which every batch then shares)."""
    kv = math.ceil(math.ceil(batch / m) * kv_tokens_per_seq(t, batch)) if batch else 0
    prefix = max(0, (t.prompt - chunk) // 2) if 0 < chunk < t.prompt else 0
    return IterShape(decode=decode, context=t.prompt + t.output // 2, chunk=chunk,
                     chunk_len=min(chunk, t.prompt) if chunk else 0, prefix=prefix, kv_tokens=kv,
                     encode_images=encoded_images(chunk, t) if chunk else 0.0)


def encoded_images(chunk: int, t: Traffic) -> float:
    """Images a VLM's vision tower encodes per iteration whose chunk prefills ``chunk`` prompt tokens: one
    per prompt started, chunk / P on average (0 without image tokens)."""
    return chunk / t.prompt if t.image_tokens else 0.0


def image_shape(batch: int, m: int) -> IterShape:
    return IterShape(images=math.ceil(batch / m))


@dataclass(frozen=True, kw_only=True)
class Point:
    """One strategy's placement at one batch, micro-batch count and token budget, scored by the serving
    model: the placement's period at full load, and the SLO knee (tessera.plan.model.knee)."""

    batch: int  # B: sequences (images) in flight per replica
    microbatches: int
    budget: int  # K: tokens per micro-batch iteration (0 for images)
    assignment: tuple[int, ...]
    evaluation: PlacementEvaluation  # the verifier's loads at the placement shape (steady_shape)
    memory_bytes: tuple[dict[str, int], ...]  # whole step: weights, kv/state × m, activations
    period_s: float  # max(m·T, L) at the placement shape
    ttft_s: float  # mean TTFT at the knee (images: mean latency of an image)
    throughput: float  # capacity: output tokens/s (images/s) where the engine saturates, one cell
    images: bool
    fits: bool
    meets_slo: bool
    reason: str | None  # why it does not fit or misses the SLO
    knee: Knee | None = None
    per_request: int = 1  # output units per request: O tokens, or 1 image
    server: ImageServer | None = None  # images: the replica the knee priced (a pool of replicas reprices it)

    @property
    def goodput(self) -> float:
        if not (self.fits and self.meets_slo and self.knee is not None):
            return 0.0
        return self.knee.rate_per_s * self.per_request

    @property
    def tpot_s(self) -> float | None:
        return None if self.images else (self.knee.tpot_s if self.knee else self.period_s)


def whole_step_memory(ev: PlacementEvaluation, m: int) -> tuple[dict[str, int], ...]:
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


def as_load(ev: PlacementEvaluation) -> Load:
    """An evaluation's busy seconds per resource (devices, then directed links) and latency."""
    return Load(busy_s=(*ev.device_busy_s, *(s for _, s in sorted(ev.link_busy_s.items()))),
                latency_s=ev.latency_s)


ShapeGraph = Callable[[IterShape], KernelGraph]  # the model's iteration graph at any shape (Shapes.at)


def load_at(at: ShapeGraph, shape: IterShape, assignment: tuple[int, ...], units: tuple[GpuSpec, ...],
            link: LinkSpec, cost: KernelCosts) -> Load:
    """One group iteration's load at ``shape`` on a placement made at another shape of the same model (a
    VLM's shape without a chunk has no vision tower, whose kernels come first in the graph)."""
    g = at(shape)
    return as_load(evaluate_cached(g, assignment[len(assignment) - len(g.kernels):], units, link, cost,
                                   memory=False))


def is_chain(assignment: tuple[int, ...]) -> bool:
    """Whether one micro-batch visits each device once per iteration (program order, runs merged)."""
    runs = [d for i, d in enumerate(assignment) if i == 0 or assignment[i - 1] != d]
    return len(runs) == len(set(runs))


def interleaving(dec: KernelGraph, chk: KernelGraph, a: tuple[int, ...], m: int, units, link,
                 cost: KernelCosts) -> Fit | None:
    """How m groups really interleave on a placement that is not a chain, against the closed form's
    max(Σ groups' busy, own latency): the event model of the runtime's workers (verify.async_period_s,
    groups iterating back to back, devices turning between them as the workers do) run with 0, 1 and m of
    the groups carrying a chunk (graphs ``dec`` and ``chk``, the same kernels at two shapes), each group's
    period over the closed form's; in between, interpolated in k. None for a chain or one group, where the
    closed form is the period. A placement that bounces between devices many times per iteration can
    leave its devices idle while every group waits on another's transfer (the factor exceeds 1); one whose
    groups lock step makes a group without a chunk wait for one with (its factor at k ≥ 1 exceeds 1)."""
    if m == 1 or is_chain(a) or len(dec.kernels) != len(chk.kernels):
        return None
    d, c = (as_load(evaluate_cached(g, a, units, link, cost, memory=False)) for g in (dec, chk))
    delta = c.minus(d)

    def closed(k: int, y: int) -> float:  # knee.period's form: any group's chunk sets the latency
        q = max(m * t0 + k * x for t0, x in zip(d.busy_s, delta.busy_s, strict=True))
        return max(q, d.latency_s + min(k, 1) * delta.latency_s)

    p0 = async_period_cached(dec, a, units, link, cost, m)
    p1 = async_period_cached(dec, a, units, link, cost, m, other=chk, others=1)
    pm = async_period_cached(chk, a, units, link, cost, m)
    f00 = sum(p0) / m / closed(0, 0)
    f10 = (sum(p1[1:]) / (m - 1)) / closed(1, 0)
    f11 = p1[0] / closed(1, 1)
    fm1 = sum(pm) / m / closed(m, 1)
    return tuple((f00 if k == 0 else f10, f11 + (fm1 - f11) * (k - 1) / max(1, m - 1) if k else f11)
                 for k in range(m + 1))


def group_sizes(b: int) -> list[int]:
    """Decode sequences per group at which a placement is costed: 1, ½ and all of the group's."""
    return sorted({1, math.ceil(b / 2), b})


def token_knees(at: ShapeGraph, a: tuple[int, ...], *, batch: int, m: int, units, link, cost: KernelCosts,
                traffic: Traffic, slo: Slo, budgets: tuple[int, ...],
                extra_latency_s: float = 0.0) -> list[tuple[int, Knee]]:
    """(budget, knee) for every budget K > ⌈B/m⌉ (decodes alone must fit the iteration)."""
    b = math.ceil(batch / m)
    # the costs of a shape do not depend on the KV held beside it: shapes without KV, shared by every batch
    decode = tuple((n, load_at(at, chunk_shape(n, 0, traffic, 0, m), a, units, link, cost))
                   for n in group_sizes(b))
    out: list[tuple[int, Knee]] = []
    ks = sorted({x for x in budgets if x > b})
    # how the groups interleave is the placement's: measured once, with the chunk of a mid-sized budget
    ref = min(ks, key=lambda k: abs(k - FIT_BUDGET)) - b if ks else 0
    fit = interleaving(at(chunk_shape(b, 0, traffic, 0, m)), at(chunk_shape(b, ref, traffic, 0, m)), a, m,
                       units, link, cost) if ks else None
    chunks: dict[int, tuple[tuple[int, Load], ...]] = {}  # budget -> (decodes, what its chunk adds)

    def load(n: int, c: int) -> Load:
        return load_at(at, chunk_shape(n, c, traffic, 0, m), a, units, link, cost)

    def per_token(n: int, d: Load, q: int) -> Load:  # what a chunk of q tokens beside n decodes adds, per token
        c = load(n, q).minus(d)
        return Load(busy_s=tuple(x / q for x in c.busy_s), latency_s=c.latency_s / q)

    @functools.cache
    def alone() -> tuple[int, Load]:  # one prompt alone in its chunk beside the group's full batch: sampled
        return traffic.prompt, per_token(b, decode[-1][1], traffic.prompt)  # once, for every budget it fits

    def knee(k: int) -> Knee:
        costs = IterCosts(decode=decode, chunk_tokens=k - b, chunk=chunks[k],
                          small=alone() if traffic.prompt < k - b else None, fit=fit)
        return token_knee(costs, EngineSettings(max_num_seqs=batch, max_num_batched_tokens=k, microbatches=m),
                          prompt=traffic.prompt, output=traffic.output, ttft_s=slo.ttft_s - extra_latency_s,
                          tpot_s=slo.tpot_s, target=slo.target)

    for k in ks:  # a chunk costs more beside few decodes (it turns their GEMMs compute-bound): sampled at each n
        chunks[k] = tuple((n, per_token(n, d, k - n)) for n, d in decode)
        out.append((k, knee(k)))
        if len(out) >= 3 and out[-1][1].rate_per_s < out[-2][1].rate_per_s < out[-3][1].rate_per_s:
            break  # past the best budget: larger chunks only stall the decodes more
    if out:  # the best budget's knee again with its costs sampled where the knee runs, if they are off
        k, kn = max(out, key=lambda x: x[1].rate_per_s)
        n = round(kn.decode_seqs)
        if n > 1 and all(abs(n - x) > 0.05 * b for x, _ in decode):
            here = load(n, 0)
            token = per_token(n, here, k - n)
            drift = max(off(IterCosts(decode=decode).at(n), here),
                        off(IterCosts(decode=decode, chunk_tokens=k - b, chunk=chunks[k]).chunk_of(1, n), token))
            if drift > INTERPOLATION_TOLERANCE:
                decode = tuple(sorted((*decode, (n, here)), key=lambda x: x[0]))
                chunks[k] = tuple(sorted((*chunks[k], (n, token)), key=lambda x: x[0]))
                out = [(kk, knee(kk) if kk == k else v) for kk, v in out]
    return out


def off(got: Load, want: Load) -> float:
    """The largest relative difference of two loads' latency and busy seconds."""
    pairs = [(got.latency_s, want.latency_s), *zip(got.busy_s, want.busy_s, strict=True)]
    return max(abs(x - y) / y for x, y in pairs if y > 0)


INTERPOLATION_TOLERANCE = 0.02  # an interpolated decode cost this far from the evaluated one is resampled


def image_server(at: ShapeGraph, a: tuple[int, ...], *, batch: int, m: int, units, link, cost: KernelCosts,
                 traffic: Traffic) -> ImageServer:
    """One image replica of placement ``a`` as the knee prices it: each group at 1, ½ and all its images."""
    b = math.ceil(batch / m)
    g = at(IterShape(images=b))
    costs = IterCosts(decode=tuple((n, load_at(at, IterShape(images=n), a, units, link, cost))
                                   for n in group_sizes(b)), fit=interleaving(g, g, a, m, units, link, cost))
    return ImageServer(costs=costs, engine=EngineSettings(max_num_seqs=batch, max_num_batched_tokens=1, microbatches=m), steps=traffic.steps)


def score_point(g: KernelGraph, assignment: tuple[int, ...], *, batch: int, m: int, units: tuple[GpuSpec, ...],
                link: LinkSpec, cost: KernelCosts, traffic: Traffic, slo: Slo, at: ShapeGraph,
                budgets: tuple[int, ...] = BUDGETS, extra_latency_s: float = 0.0) -> Point:
    """Score a placement of micro-batch graph ``g`` (built at steady_shape(batch, m) or image_shape): its
    memory, its period at full load, and its SLO knee at the best token budget of ``budgets``."""
    a = tuple(assignment)
    ev = evaluate_cached(g, a, units, link, cost)
    mem = whole_step_memory(ev, m)
    period = max(m * ev.bottleneck_s, ev.latency_s)
    images = g.phase != Phase.MIXED
    per_request = 1 if images else traffic.output
    common = dict(batch=batch, microbatches=m, assignment=a, evaluation=ev, memory_bytes=mem, period_s=period,
                  images=images, per_request=per_request)
    over = over_memory(mem, units)
    if over is not None:
        return Point(**common, budget=0, ttft_s=math.inf, throughput=0.0, fits=False, meets_slo=False,
                     reason=over)
    args = dict(batch=batch, m=m, units=units, link=link, cost=cost, traffic=traffic, slo=slo)
    # an engine reserves activations for its largest iteration, a full budget of tokens (vLLM profiles its
    # forward at max_num_batched_tokens): budgets whose activations do not fit beside the KV are not run
    placed = max(1, g.shape.get("tokens", 1))
    fitting = tuple(k for k in budgets if over_memory(at_budget(mem, k, placed), units) is None)
    server = image_server(at, a, **{k: v for k, v in args.items() if k != "slo"}) if images else None
    knees = [(0, image_knee(server.costs, server.engine, steps=traffic.steps, latency_slo_s=slo.image_s,
                            target=slo.target))] if server else \
        token_knees(at, a, **args, budgets=fitting, extra_latency_s=extra_latency_s)
    if not knees:
        why = (f"no token budget of {', '.join(map(str, budgets))} exceeds the {math.ceil(batch / m)} decodes "
               "of a micro-batch" if fitting else over_memory(at_budget(mem, min(budgets), placed), units))
        return Point(**common, budget=0, ttft_s=math.inf, throughput=0.0, fits=bool(fitting), meets_slo=False,
                     reason=why)
    k, kn = max(knees, key=lambda x: (x[1].rate_per_s, -x[1].ttft_s))
    if kn.rate_per_s <= 0:  # nothing meets the SLO even unloaded: the budget nearest to it says how far
        k, kn = max(knees, key=lambda x: (x[1].attainment, -x[1].ttft_s))
    meets = kn.rate_per_s > 0
    common["memory_bytes"] = at_budget(mem, k, placed) if k else mem
    return Point(**common, budget=k, ttft_s=kn.ttft_s + extra_latency_s, throughput=kn.capacity_per_s * per_request,
                 fits=True, meets_slo=meets, reason=None if meets else miss_reason(kn, slo, images, batch, m, k),
                 knee=kn, server=server)


def at_budget(mem: tuple[dict[str, int], ...], budget: int, placed_tokens: int) -> tuple[dict[str, int], ...]:
    """Memory with activations for an iteration of ``budget`` tokens (they scale with the tokens) where it
    exceeds the ``placed_tokens`` the placement's shape carries."""
    f = max(1.0, budget / placed_tokens)
    return tuple({**d, "activation": int(d["activation"] * f)} for d in mem)


def miss_reason(kn: Knee, slo: Slo, images: bool, batch: int, m: int, budget: int) -> str:
    """Why an operating point meets the SLO at no arrival rate: the binding constraint with its numbers."""
    at = f"batch {batch}, {m} micro-batch{'es' if m > 1 else ''}" + (f", budget {budget} tokens" if budget else "")
    if images:
        return f"image latency {kn.ttft_s:.2f} s > SLO {slo.image_s:g} s unloaded ({at})"
    if kn.binding == "TPOT":
        return f"TPOT {kn.tpot_s * 1e3:.1f} ms > SLO {slo.tpot_s * 1e3:g} ms unloaded ({at})"
    return f"TTFT {kn.ttft_s:.2f} s > SLO {slo.ttft_s:g} s unloaded ({at})"


def sync_period_s(g: KernelGraph, p: Point, units: tuple[GpuSpec, ...], link: LinkSpec,
                  cost: KernelCosts) -> float:
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
    """Largest batch worth trying: KV of that many sequences (kv_tokens_per_seq, as the memory check counts
    it) fits beside the weights in all memory."""
    weights = sum(b.bytes for b in base.buffers if b.role == Role.WEIGHT)
    free = sum(u.mem_bytes for u in units) - weights
    if free <= 0:
        return 0
    r = base.shape.get("batch", 1)
    per_seq = sum(b.bytes for b in base.buffers if b.role in (Role.KV, Role.STATE)) / max(1, r)
    kv = any(b.role == Role.KV for b in base.buffers)
    top = BATCHES[-1]
    for batch in BATCHES[::-1]:
        need = per_seq / (base.shape.get("context", 0) + 1) * kv_tokens_per_seq(traffic, batch) \
            if kv and not images else per_seq
        if need <= 0 or batch * need <= free:
            top = batch
            break
    else:
        top = 1
    return max(1, min(top, cap or BATCHES[-1]))


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What one strategy's search over batches and micro-batch counts is given (search, search_m)."""

    graph_at: Callable[[int, int], KernelGraph]
    placer: Placer
    at: ShapeGraph
    units: tuple[GpuSpec, ...]
    link: LinkSpec
    cost: KernelCosts
    traffic: Traffic
    slo: Slo
    ceiling: int
    budgets: tuple[int, ...] = BUDGETS
    extra_latency_s: Callable[[tuple[int, ...]], float] | None = None
    floor: Callable[[KernelGraph, int, int], float] | None = None

    def place(self, b: int, m: int) -> Point | None:
        """The placer's answer at (batch b, m micro-batches), scored; None when it places nothing."""
        g = self.graph_at(b, m)
        a = self.placer(g, b, m)
        if a is None:
            return None
        return score_point(g, a, batch=b, m=m, units=self.units, link=self.link, cost=self.cost,
                           traffic=self.traffic, slo=self.slo, at=self.at, budgets=self.budgets,
                           extra_latency_s=self.extra_latency_s(a) if self.extra_latency_s else 0.0)


@dataclass(frozen=True)
class Searched:
    """Where a search over some micro-batch counts got to: the best point meeting memory and SLO, the
    fitting point nearest to the SLO (first found on ties) and the points the floor skipped as
    (floor, batch, m)."""

    best: Point | None = None
    nearest: Point | None = None
    missed: tuple[tuple[float, int, int], ...] = ()

    def then(self, later: Searched, slo: Slo) -> Searched:
        """This search followed by ``later`` over later micro-batch counts: what one search over both
        finds (the first best and the first nearest on ties, as one search meets them)."""
        best = later.best if later.best is not None and (
            self.best is None or later.best.goodput > self.best.goodput) else self.best
        return Searched(best=best, nearest=nearer(self.nearest, later.nearest, slo),
                        missed=self.missed + later.missed)


def nearer(kept: Point | None, new: Point | None, slo: Slo) -> Point | None:
    """``new`` when it is strictly nearer to the SLO than ``kept`` (the first found wins ties)."""
    return new if new is not None and (kept is None or closeness(new, slo) < closeness(kept, slo)) else kept


def search_m(space: SearchSpace, m: int) -> Searched:
    """One micro-batch count's part of ``search``: batches from the ceiling down, smaller ones while
    goodput still grows (a smaller batch shortens the period: TPOT and TTFT have more room)."""
    s = space
    best: Point | None = None
    nearest: Point | None = None
    missed: list[tuple[float, int, int]] = []
    for b in [x for x in BATCHES if x <= s.ceiling][::-1]:
        if m > b:
            continue
        if s.floor is not None:
            g = s.graph_at(b, m)
            f = s.floor(g, b, m)
            if f == math.inf:
                continue  # nothing fits memory there
            if f > slo_period_cap(g, s.traffic, s.slo):  # misses TPOT at full load whatever the placement
                missed.append((f, b, m))
                continue
        p = s.place(b, m)
        if p is None:
            continue
        if p.fits:
            nearest = nearer(nearest, p, s.slo)
        if p.fits and p.meets_slo:
            if best is not None and p.goodput < best.goodput:
                break  # goodput past its peak for this m
            best = p
    return Searched(best=best, nearest=nearest, missed=tuple(missed))


def search(space: SearchSpace, ms: tuple[int, ...], parts: list[Searched] | None = None
           ) -> tuple[Point | None, Point | None]:
    """(best point meeting memory and SLO, the fitting point nearest to the SLO) over batches ≤ the
    ceiling, micro-batch counts ``ms`` and the token budgets; ``parts``: search_m's answers for each of
    ``ms`` when they were found elsewhere (another process), in the order of ``ms``.

    The second answer, read when no point meets the SLO, is the fitting point with the lowest unloaded
    TTFT (then TPOT): what the refusal reports. ``space.floor(graph, batch, m)``, when given, is a lower
    bound on the period of any placement of that graph that fits memory (bound.period_floor); a point
    whose floor already exceeds the TPOT SLO is not placed (a smaller batch, searched too, shortens the
    period). The skipped points are placed afterwards, lowest floor first, only when nothing meets the
    SLO, to say how far it is.
    """
    done = Searched()
    for part in parts if parts is not None else (search_m(space, m) for m in ms):
        done = done.then(part, space.slo)
    if done.best is not None:
        return done.best, done.nearest
    nearest = done.nearest
    for f, b, m in sorted(done.missed):
        if nearest is not None and nearest.knee is not None and f > 2 * nearest.period_s:
            break
        p = space.place(b, m)
        if p is not None and p.fits:
            nearest = nearer(nearest, p, space.slo)
    return None, nearest


def closeness(p: Point, slo: Slo) -> tuple[float, float]:
    """How far an unloaded point is from the SLO (smaller is nearer): 1 − its attainment, then its worse
    ratio of TTFT (image latency) and TPOT to their SLOs."""
    k = p.knee
    if k is None:
        return (math.inf, math.inf)
    ratio = k.ttft_s / slo.image_s if p.images else max(k.ttft_s / slo.ttft_s, k.tpot_s / slo.tpot_s)
    return (1 - k.attainment, ratio)


def slo_period_cap(g: KernelGraph, traffic: Traffic, slo: Slo) -> float:
    """The longest full-load period at which a point of micro-batch graph ``g`` is worth placing: the TPOT
    SLO (a request's TPOT is the period it decodes at); for images, the image SLO over the steps."""
    if g.phase != Phase.MIXED:
        return slo.image_s / traffic.steps
    return slo.tpot_s
