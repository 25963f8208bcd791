"""Prefill/decode disaggregation on a pair, rate-matched (DistServe); ``prefill_decode`` tries both orientations.

Prefill GPU: steps of up to n whole prompts (n·P tokens, causal attention within each prompt), run back
to back, each taking every prompt waiting; n is searched over the sizes whose step fits memory and leaves
TTFT = 2·step within the SLO (a request waits for the step in flight, then runs in the next).
Decode GPU: pure decode iterations of up to B sequences at the mean context P + O/2; B is searched over
the largest sizes that fit memory and meet the TPOT SLO.
Link: each request's KV (P tokens) crosses once.
Capacity is the least of the prefill, decode and link rates; goodput is the SLO knee of the pair
(tessera.plan.model.knee.pd_knee), best over the (n, B) tried.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tessera.contracts.cost import KernelCosts
from tessera.contracts.enums import Objective, Phase
from tessera.contracts.plan import Device, EngineSettings, PhasePlan, Plan, PlanSlo, PlanWorkload, StepPoint
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.config import PlannerConfig, StrategyResult
from tessera.plan.model.cell import Shapes, best_of, kv_bytes_per_token
from tessera.plan.model.knee import IterCosts, Knee, pd_knee
from tessera.plan.model.serving import (
    BATCHES,
    IterShape,
    as_load,
    batch_ceiling,
    group_sizes,
    kv_tokens_per_seq,
)
from tessera.plan.solver.verify import evaluate_cached


def _step(shapes, shape: IterShape, unit: GpuSpec, lk: LinkSpec,
          cost: KernelCosts) -> tuple[float, dict[str, int], object]:
    g = shapes.at(shape)
    ev = evaluate_cached(g, (0,) * len(g.kernels), (unit,), lk, cost)
    return ev.latency_s, ev.memory_bytes[0], ev


def _fits(mem: dict[str, int], unit: GpuSpec) -> bool:
    return sum(mem.values()) <= unit.mem_bytes


def prefill_shape(n: int, t) -> IterShape:
    """A prefill step of n whole prompts (a VLM's vision tower on their n images first, if they hold one)."""
    return IterShape(chunk=n * t.prompt, chunk_len=t.prompt, prefix=0, kv_tokens=n * t.prompt,
                     encode_images=float(n) if t.image_tokens else 0.0)


def decode_shape(batch: int, t, seqs: int | None = None) -> IterShape:
    """``batch`` decodes at the mean context, with the KV of ``seqs`` (default: ``batch``) sequences."""
    ctx = t.prompt + t.output // 2
    n = seqs or batch
    return IterShape(decode=batch, context=ctx, kv_tokens=math.ceil(n * kv_tokens_per_seq(t, n)))


def rate_matched(shapes, specs: tuple[GpuSpec, ...], a: int, b: int, lk: LinkSpec, cost: KernelCosts, cfg):
    t, slo = cfg.traffic, cfg.slo
    usd = sum(s.usd_per_hour for s in specs)
    kv_req = kv_bytes(shapes, t.prompt)
    xfer = cost.transfer_time_s(kv_req, lk)
    pre: list[tuple[int, float]] = []  # (prompts per step, seconds) that fit and leave TTFT room
    for n in BATCHES:
        if cfg.batch_cap and n > cfg.batch_cap:
            break
        s, mem, _ = _step(shapes, prefill_shape(n, t), specs[a], lk, cost)
        if not _fits(mem, specs[a]) or 2 * s > slo.ttft_s:  # wait for the step in flight, then its own
            break
        pre.append((n, s))
    dec: list[int] = []  # decode batches that fit and meet TPOT, largest first
    top = batch_ceiling(shapes.base, (specs[b],), t, False, cfg.batch_cap)
    for batch in [x for x in BATCHES if x <= top][::-1]:
        s, mem, _ = _step(shapes, decode_shape(batch, t), specs[b], lk, cost)
        if _fits(mem, specs[b]) and s <= slo.tpot_s:
            dec.append(batch)
            if len(dec) == PD_DECODE_TRIES:
                break
    name = f"prefill on {specs[a].name}, decode on {specs[b].name}"
    if not pre or not dec:
        side = "prefill" if not pre else "decode"
        return StrategyResult(name="prefill_decode", applicable=True, usd_per_hour=usd, tp=(1, 1),
                              reason=f"{name}: no {side} batch fits memory and the SLO")
    best: tuple[float, int, int, Knee] | None = None
    for bd in dec:
        costs = IterCosts(decode=tuple((n, as_load(_step(shapes, decode_shape(n, t, bd), specs[b], lk, cost)[2]))
                                       for n in group_sizes(bd)))
        for n_p, _ in pre:
            k = pd_knee(prefill_seconds(pre, n_p), n_p, costs, bd, transfer_s=xfer, prompt=t.prompt,
                        output=t.output, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, target=slo.target)
            if best is None or k.rate_per_s > best[0]:
                best = (k.rate_per_s, n_p, bd, k)
    assert best is not None
    _, n_p, bd, kn = best
    s_p = dict(pre)[n_p]
    s_d = _step(shapes, decode_shape(bd, t), specs[b], lk, cost)[0]
    rate_p, rate_d, rate_l = n_p / s_p, bd / (max(1, t.output - 1) * s_d), 1.0 / xfer
    limit = min((rate_p, "prefill"), (rate_d, "decode"), (rate_l, "link"))[1]
    good = kn.rate_per_s * t.output
    thr = kn.capacity_per_s * t.output
    if good <= 0:
        return StrategyResult(name="prefill_decode", applicable=True, usd_per_hour=usd, tp=(1, 1),
                              reason=f"{name}: {kn.binding} misses the SLO unloaded (TTFT {kn.ttft_s:.2f} s, "
                                     f"TPOT {kn.tpot_s * 1e3:.1f} ms)")
    plan = _plan(shapes, specs, a, b, lk, cost, cfg, (n_p, s_p), (bd, s_d), kv_req, thr, usd, limit, kn)
    return StrategyResult(name="prefill_decode", applicable=True, plan=plan, goodput=good, usd_per_hour=usd,
                          tp=(1, 1), detail={"orientation": name, "prefill_prompts": n_p,
                                             "decode_batch": bd, "limited_by": limit, "binding": kn.binding,
                                             "requests_per_s": {"prefill": rate_p, "decode": rate_d,
                                                                "link": rate_l}})


PD_DECODE_TRIES = 3  # largest decode batches tried (each with every prefill size)


def prefill_seconds(pre: list[tuple[int, float]], cap: int):
    """A prefill step's seconds at k prompts (k ≤ cap), linear between the measured sizes."""
    xs = [(n, s) for n, s in pre if n <= cap]

    def at(k: float) -> float:
        if k <= xs[0][0] or len(xs) == 1:
            return xs[0][1]
        for (n0, s0), (n1, s1) in zip(xs, xs[1:], strict=False):
            if k <= n1:
                return s0 + (s1 - s0) * (k - n0) / (n1 - n0)
        return xs[-1][1]
    return at


def kv_bytes(shapes, tokens: int) -> int:
    return kv_bytes_per_token(shapes) * tokens


def _plan(shapes, specs, a, b, lk, cost: KernelCosts, cfg, pre, dec, kv_req, thr, usd, limit,
          kn: Knee) -> Plan:
    t = cfg.traffic
    devs = tuple(Device(index=i, gpu=s.name, mem_bytes=s.mem_bytes) for i, s in enumerate(specs))

    def pts(kind: str, sizes: list[int]) -> tuple[StepPoint, ...]:
        out = []
        for n in sorted(set(sizes)):
            ctxs = [t.prompt] if kind == Phase.PREFILL else [t.prompt, t.prompt + t.output // 2, t.prompt + t.output]
            for c in ctxs:
                sh = prefill_shape(n, t) if kind == Phase.PREFILL else replace(decode_shape(n, t), context=c)
                dev = a if kind == Phase.PREFILL else b
                s, _, ev = _step(shapes, sh, specs[dev], lk, cost)
                busy = [0.0, 0.0]
                busy[dev] = s
                links = ((a, b, cost.transfer_time_s(kv_req * n, lk)),) if kind == Phase.PREFILL else ()
                out.append(StepPoint(batch=n, tokens=n * t.prompt if kind == Phase.PREFILL else n, context=c,
                                     microbatches=1, device_busy_s=tuple(busy), link_busy_s=links,
                                     latency_s=s, step_s=s))
        return tuple(out)

    n_pre, n_dec = pre[0], dec[0]
    g_pre = shapes.at(prefill_shape(n_pre, t))
    g_dec = shapes.at(decode_shape(n_dec, t))
    _, mem_p, _ = _step(shapes, prefill_shape(n_pre, t), specs[a], lk, cost)
    _, mem_d, _ = _step(shapes, decode_shape(n_dec, t), specs[b], lk, cost)
    memory = [dict.fromkeys(("weight", "kv", "state", "activation"), 0) for _ in specs]
    memory[a], memory[b] = dict(mem_p), dict(mem_d)
    per_tok = kv_req // max(1, t.prompt)
    free_d = specs[b].mem_bytes - mem_d["weight"] - mem_d["activation"]
    return Plan(
        model=shapes.model, strategy="prefill_decode", mode=Objective.THROUGHPUT, devices=devs, link=lk.name,
        phases={"prefill": PhasePlan(phase="prefill", assignment=(a,) * len(g_pre.kernels), microbatches=1,
                                     points=pts("prefill", [1, max(1, n_pre // 2), n_pre])),
                "decode": PhasePlan(phase="decode", assignment=(b,) * len(g_dec.kernels), microbatches=1,
                                    points=pts("decode", [max(1, n_dec // 4), max(1, n_dec // 2), n_dec]))},
        memory_bytes=tuple(memory), kv_bytes_per_token=per_tok,
        kv_capacity_tokens=int(max(0, free_d) // max(1, per_tok)),
        throughput_tokens_per_s=thr, latency_s=dec[1], usd_per_hour=usd,
        usd_per_million_tokens=usd / 3600 / thr * 1e6,
        workload=PlanWorkload(batch=n_dec, prompt=t.prompt, output=t.output, steps=t.steps,
                              image_tokens=t.image_tokens),
        batch=n_dec, microbatches=1, tpot_s=kn.tpot_s, ttft_s=kn.ttft_s,
        sync_throughput=thr, device_busy=_busy(a, b, pre, dec, thr, t),
        engine=EngineSettings(max_num_seqs=n_dec, max_num_batched_tokens=n_pre * t.prompt, microbatches=1),
        goodput_per_s=kn.rate_per_s * t.output,
        slo=PlanSlo.of(cfg.slo),
        notes=(f"rate-matched: limited by {limit}; prefill {n_pre} prompts/step, decode batch {n_dec}",))


def _busy(a: int, b: int, pre, dec, thr: float, t) -> tuple[float, ...]:
    rps = thr / t.output
    out = [0.0, 0.0]
    out[a] = min(1.0, rps * pre[1] / pre[0])
    out[b] = min(1.0, rps * t.output * dec[1] / dec[0])
    return tuple(out)


def prefill_decode(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost: KernelCosts,
                   cfg: PlannerConfig) -> StrategyResult:
    """DistServe on a pair: prompts prefilled on one GPU (batches of whole prompts), decoded on the other,
    KV shipped once per request over the link; each side at its own best batch, the pair runs at the
    slower of prefill rate, decode rate and link rate (requests/s)."""
    return best_of([rate_matched(shapes, specs, a, b, lk, cost, cfg) for a, b in ((0, 1), (1, 0))])
