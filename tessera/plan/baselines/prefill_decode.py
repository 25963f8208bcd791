"""Prefill/decode disaggregation on a pair, rate-matched (DistServe); ``prefill_decode`` tries both orientations.

Prefill GPU: steps of n whole prompts (n·P tokens, causal attention within each prompt); the n with the
highest rate whose step fits memory and leaves TTFT = 2·step + KV transfer within the SLO (a request waits
for the step in flight, then runs in the next); rate_p = n / step requests/s.
Decode GPU: pure decode iterations of B sequences at the mean context P + O/2; the largest B that fits
memory and meets the TPOT SLO; rate_d = B / (O · period) requests/s.
Link: each request's KV (P tokens) crosses once: rate_l = 1 / transfer time.
The pair serves min(rate_p, rate_d, rate_l) requests/s: O times that in output tokens/s (its capacity);
its goodput is the rate at which 90% of requests still meet the SLO once they queue on either side.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.cell import Shapes, best_of, kv_bytes_per_token
from tessera.plan.config import PlannerConfig, StrategyResult
from tessera.plan.serving import BATCHES, IterShape, batch_ceiling, slo_rate
from tessera.plan.types import Device, PhasePlan, Plan, StepPoint
from tessera.plan.verify import evaluate_cached


def _step(shapes, shape: IterShape, unit: GpuSpec, lk: LinkSpec, cost) -> tuple[float, dict[str, int], object]:
    g = shapes.at(shape)
    ev = evaluate_cached(g, (0,) * len(g.kernels), (unit,), lk, cost)
    return ev.latency_s, ev.memory_bytes[0], ev


def _fits(mem: dict[str, int], unit: GpuSpec) -> bool:
    return sum(mem.values()) <= unit.mem_bytes


def prefill_shape(n: int, t) -> IterShape:
    """A prefill step of n whole prompts (a VLM's vision tower on their n images first, if they hold one)."""
    return IterShape(chunk=n * t.prompt, chunk_len=t.prompt, prefix=0, kv_tokens=n * t.prompt,
                     encode_images=float(n) if t.image_tokens else 0.0)


def decode_shape(batch: int, t) -> IterShape:
    ctx = t.prompt + t.output // 2
    return IterShape(decode=batch, context=ctx, kv_tokens=batch * (t.prompt + math.ceil(t.output / 2)))


def rate_matched(shapes, specs: tuple[GpuSpec, ...], a: int, b: int, lk: LinkSpec, cost, cfg):
    t, slo = cfg.traffic, cfg.slo
    usd = sum(s.usd_per_hour for s in specs)
    kv_req = kv_bytes(shapes, t.prompt)
    xfer = cost.transfer_time_s(kv_req, lk)
    pre = None
    for n in BATCHES:
        if cfg.batch_cap and n > cfg.batch_cap:
            break
        s, mem, _ = _step(shapes, prefill_shape(n, t), specs[a], lk, cost)
        if not _fits(mem, specs[a]) or 2 * s + xfer > slo.ttft_s:  # wait for the step in flight, then its own
            break
        if pre is None or n / s > pre[0] / pre[1]:
            pre = (n, s)
    dec = None
    top = batch_ceiling(shapes.base, (specs[b],), t, False, cfg.batch_cap)
    for batch in [x for x in BATCHES if x <= top][::-1]:
        s, mem, _ = _step(shapes, decode_shape(batch, t), specs[b], lk, cost)
        if _fits(mem, specs[b]) and s <= slo.tpot_s:
            dec = (batch, s)
            break
    name = f"prefill on {specs[a].name}, decode on {specs[b].name}"
    if pre is None or dec is None:
        side = "prefill" if pre is None else "decode"
        return StrategyResult(name="prefill_decode", applicable=True, usd_per_hour=usd, tp=(1, 1),
                              reason=f"{name}: no {side} batch fits memory and the SLO")
    rate_p, rate_d, rate_l = pre[0] / pre[1], dec[0] / (t.output * dec[1]), 1.0 / xfer
    rps = min(rate_p, rate_d, rate_l)
    thr = rps * t.output
    limit = {rate_p: "prefill", rate_d: "decode", rate_l: "link"}[rps]
    # goodput: arrivals queue for a prefill place (held one step; TTFT budget left after 2·step + transfer)
    # and for a decode place (held O iterations; a wait W adds W/(O−1) to TPOT)
    good_p = slo_rate(pre[0], pre[1], slo.ttft_s - 2 * pre[1] - xfer)
    good_d = slo_rate(dec[0], t.output * dec[1], (slo.tpot_s - dec[1]) * max(1, t.output - 1))
    good = min(good_p, good_d, rate_l) * t.output
    plan = _plan(shapes, specs, a, b, lk, cost, cfg, pre, dec, kv_req, thr, usd, limit)
    return StrategyResult(name="prefill_decode", applicable=True, plan=plan, goodput=good, usd_per_hour=usd,
                          tp=(1, 1), detail={"orientation": name, "prefill_prompts": pre[0],
                                             "decode_batch": dec[0], "limited_by": limit,
                                             "requests_per_s": {"prefill": rate_p, "decode": rate_d,
                                                                "link": rate_l}})


def kv_bytes(shapes, tokens: int) -> int:
    return kv_bytes_per_token(shapes) * tokens


def _plan(shapes, specs, a, b, lk, cost, cfg, pre, dec, kv_req, thr, usd, limit) -> Plan:
    t = cfg.traffic
    devs = tuple(Device(index=i, gpu=s.name, mem_bytes=s.mem_bytes) for i, s in enumerate(specs))

    def pts(kind: str, sizes: list[int]) -> tuple[StepPoint, ...]:
        out = []
        for n in sorted(set(sizes)):
            ctxs = [t.prompt] if kind == "prefill" else [t.prompt, t.prompt + t.output // 2, t.prompt + t.output]
            for c in ctxs:
                sh = prefill_shape(n, t) if kind == "prefill" else replace(decode_shape(n, t), context=c)
                dev = a if kind == "prefill" else b
                s, _, ev = _step(shapes, sh, specs[dev], lk, cost)
                busy = [0.0, 0.0]
                busy[dev] = s
                links = ((a, b, cost.transfer_time_s(kv_req * n, lk)),) if kind == "prefill" else ()
                out.append(StepPoint(batch=n, tokens=n * t.prompt if kind == "prefill" else n, context=c,
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
        model=shapes.model, strategy="prefill_decode", mode="throughput", devices=devs, link=lk.name,
        phases={"prefill": PhasePlan(phase="prefill", assignment=(a,) * len(g_pre.kernels), microbatches=1,
                                     points=pts("prefill", [1, max(1, n_pre // 2), n_pre])),
                "decode": PhasePlan(phase="decode", assignment=(b,) * len(g_dec.kernels), microbatches=1,
                                    points=pts("decode", [max(1, n_dec // 4), max(1, n_dec // 2), n_dec]))},
        memory_bytes=tuple(memory), kv_bytes_per_token=per_tok,
        kv_capacity_tokens=int(max(0, free_d) // max(1, per_tok)),
        throughput_tokens_per_s=thr, latency_s=dec[1], usd_per_hour=usd,
        usd_per_million_tokens=usd / 3600 / thr * 1e6,
        workload={"batch": n_dec, "prompt": t.prompt, "output": t.output, "steps": t.steps,
                  "image_tokens": t.image_tokens},
        batch=n_dec, microbatches=1, tpot_s=dec[1], ttft_s=2 * pre[1] + cost.transfer_time_s(kv_req, lk),
        sync_throughput=thr, device_busy=_busy(a, b, pre, dec, thr, t),
        slo={"ttft_s": cfg.slo.ttft_s, "tpot_s": cfg.slo.tpot_s, "image_s": cfg.slo.image_s},
        notes=(f"rate-matched: limited by {limit}; prefill {n_pre} prompts/step, decode batch {n_dec}",))


def _busy(a: int, b: int, pre, dec, thr: float, t) -> tuple[float, ...]:
    rps = thr / t.output
    out = [0.0, 0.0]
    out[a] = min(1.0, rps * pre[1] / pre[0])
    out[b] = min(1.0, rps * t.output * dec[1] / dec[0])
    return tuple(out)


def prefill_decode(shapes: Shapes, specs: tuple[GpuSpec, ...], lk: LinkSpec, cost,
                   cfg: PlannerConfig) -> StrategyResult:
    """DistServe on a pair: prompts prefilled on one GPU (batches of whole prompts), decoded on the other,
    KV shipped once per request over the link; each side at its own best batch, the pair runs at the
    slower of prefill rate, decode rate and link rate (requests/s)."""
    return best_of([rate_matched(shapes, specs, a, b, lk, cost, cfg) for a, b in ((0, 1), (1, 0))])
