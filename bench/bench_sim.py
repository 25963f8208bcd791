"""Serving-simulator benchmark: speed of a 10k-request pool, offline agreement with the plan's
steady-state prediction, adaptive vs fixed plans under bursts. Writes bench/results/sim.{json,md}.

Plans here are hand-built (tessera.sim.handplan: closed-form step costs chosen for the experiment,
not measured); a real plan from `tessera.plan.plan_serving` is run as well.

    .venv/bin/python bench/bench_sim.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tessera.sim import AdaptivePolicy, LatencyTargets, LengthSpec, WorkloadSpec, simulate
from tessera.sim.handplan import PhaseCost, hand_plan

OUT = Path(__file__).parent / "results"
PAIR = ("H100-SXM", "L40S")
# a pair plan: both phases on both devices (the shares are each device's busy fraction per micro-batch)
PREFILL = PhaseCost(fixed_s=0.012, per_token_s=6e-5, tokens=(128, 2048, 8192), contexts=(128, 1024, 4096),
                    busy_share=(1.0, 0.7), microbatches=2)
DECODE = PhaseCost(fixed_s=0.025, per_token_s=8e-5, per_token_context_s=2e-8, tokens=(1, 64, 256),
                   contexts=(0, 1024, 4096), busy_share=(0.8, 1.0), microbatches=2)


def pool_speed() -> dict:
    plan = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, gpus=PAIR, kv_capacity_tokens=400_000,
                     usd_per_hour=2.99 + 0.86)
    w = WorkloadSpec(kind="poisson", requests=10_000, rate_per_s=120.0, prompt=LengthSpec(trace="azure_conv_2023"),
                     output=LengthSpec(trace="azure_conv_2023"))
    t0 = time.perf_counter()
    r = simulate(plan, w, replicas=8, seed=0, slo=LatencyTargets(ttft_s=2.0, tpot_s=0.06))
    wall = time.perf_counter() - t0
    return {"what": "10,000 requests, poisson 120 req/s, azure_conv_2023 lengths, 8 replicas of a pair (16 GPUs)",
            "wall_s": wall, "target_wall_s": 20.0, "result": r.to_dict()}


def offline_agreement() -> dict:
    plan = hand_plan(phases={"prefill": PREFILL, "decode": DECODE}, gpus=PAIR, kv_capacity_tokens=400_000,
                     predict_context=128 + 512 / 2)
    w = WorkloadSpec(kind="offline", requests=2048, prompt=LengthSpec(lo=128, hi=128), output=LengthSpec(lo=512, hi=512))
    r = simulate(plan, w)
    pred = plan.throughput_tokens_per_s
    # the modelled gap: each wave of 256 prompts prefills in 4 iterations of 8192 tokens (the plan's
    # largest prefill sample is the default budget), time the decode-only prediction leaves out
    prefill_s = 8 * 4 * PREFILL.step_s(8192, 128)
    return {"what": "offline 2048 x (128 in, 512 out), max batch 256; prediction = 256 / decode step_s at "
                    "batch 256, mean context 384", "predicted_tokens_per_s": pred,
            "simulated_tokens_per_s": r.throughput_tokens_per_s,
            "gap": 1 - r.throughput_tokens_per_s / pred, "prefill_share_of_span": prefill_s / r.sim_wall_s,
            "decode_only_tokens_per_s": 2048 * 512 / (r.sim_wall_s - prefill_s)}


def adaptive() -> dict:
    fast = PhaseCost(fixed_s=0.010, per_token_s=4e-4, tokens=(1, 16, 32), contexts=(0,), microbatches=1)
    wide = PhaseCost(fixed_s=0.028, per_token_s=3e-5, tokens=(1, 128, 256), contexts=(0,), microbatches=2)
    pf = PhaseCost(fixed_s=0.01, per_token_s=2e-5, tokens=(128, 16384), contexts=(128,))
    lat = hand_plan(phases={"prefill": pf, "decode": fast}, mode="latency", kv_capacity_tokens=100_000)
    thr = hand_plan(phases={"prefill": pf, "decode": wide}, mode="throughput", kv_capacity_tokens=100_000)
    w = WorkloadSpec(kind="bursty", burst="onoff", on_s=5.0, off_s=15.0, requests=3000, rate_per_s=6.0,
                     prompt=LengthSpec(lo=64, hi=512), output=LengthSpec(lo=32, hi=256))
    rows = {}
    for tpot_ms in (30, 40, 50):
        slo = LatencyTargets(ttft_s=1.0, tpot_s=tpot_ms / 1e3)
        for name, plan, pol in (("latency plan", lat, None), ("throughput plan", thr, None),
                                ("adaptive", thr, AdaptivePolicy(latency_plan=lat))):
            r = simulate(plan, w, policy=pol, seed=0, slo=slo)
            rows[f"{name}, TPOT SLO {tpot_ms} ms"] = {
                "slo_attainment": r.slo_attainment, "ttft_p99_s": r.ttft_s["p99"], "tpot_p99_s": r.tpot_s["p99"],
                "tokens_per_s": r.throughput_tokens_per_s, "switches": r.switches}
    return {"what": "on/off bursts (5 s at 24 req/s, 15 s idle), 3000 requests, prompt 64-512, output 32-256; "
                    "SLO TTFT 1 s, TPOT 30/40/50 ms; latency plan: 10 ms + 0.4 ms/seq, batch <= 32; throughput plan: "
                    "28 ms + 0.03 ms/seq, batch <= 256", "rows": rows}


def real_plan() -> dict:
    """Offline agreement on a real plan: llama-3-8b on H100 + L40S from plan_serving (captures + MILP)."""
    from tessera.plan import PlannerConfig, Traffic, plan_serving

    t = Traffic(prompt=1024, output=256)
    r = plan_serving("llama-3-8b", ["H100-SXM", "L40S"], PlannerConfig(traffic=t))
    out = {}
    for name, o in r.strategies.items():
        if not (o.feasible and o.plan is not None):
            continue
        p = o.plan
        n_cells = len(o.pool.cells) if o.pool is not None else 1  # a pool of different cells: each its own load
        n = 40 * max(pt.batch for ph in p.phases.values() for pt in ph.points) * n_cells
        wl = WorkloadSpec(kind="offline", requests=n, prompt=LengthSpec(lo=t.prompt, hi=t.prompt),
                          output=LengthSpec(lo=t.output, hi=t.output))
        sim = simulate(o.deployment, wl, seed=0).to_json()["throughput_tokens_per_s"]
        predicted = o.pool.throughput_per_s if o.pool is not None else p.throughput_tokens_per_s
        out[name] = {"predicted_tokens_per_s": predicted, "simulated_tokens_per_s": sim,
                     "gap": sim / predicted - 1, "requests": n}
    return out


def main() -> None:
    res = {"pool": pool_speed(), "offline": offline_agreement(), "adaptive": adaptive(), "real_plan": real_plan()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sim.json").write_text(json.dumps(res, indent=1))
    p, o, a = res["pool"], res["offline"], res["adaptive"]["rows"]
    lines = ["# Serving simulator", "", "| check | figure | target |", "| --- | --- | --- |",
             f"| 10k requests, 16-GPU pool (8 pair replicas) | {p['wall_s']:.2f} s wall | <= 20 s |",
             f"| offline vs steady-state prediction | {o['simulated_tokens_per_s']:.0f} vs "
             f"{o['predicted_tokens_per_s']:.0f} tokens/s (gap {o['gap']:.1%}; prefill is "
             f"{o['prefill_share_of_span']:.1%} of the span; decode-only {o['decode_only_tokens_per_s']:.0f}) "
             "| within 5% |", "",
             "| bursty, SLO TTFT 1 s | attainment | p99 TTFT (s) | p99 TPOT (ms) | switches |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['slo_attainment']:.1%} | {v['ttft_p99_s']:.2f} | {v['tpot_p99_s'] * 1e3:.1f} | "
              f"{v['switches']} |" for k, v in a.items()]
    lines += ["", "Offline, real plans (llama-3-8b on H100-SXM + L40S, batch chosen by memory and SLO, prompt 1024, "
              "output 256):", "",
              "| strategy | planner tokens/s | simulated tokens/s | gap |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['predicted_tokens_per_s']:.0f} | {v['simulated_tokens_per_s']:.0f} | {v['gap']:+.1%} |"
              for k, v in res["real_plan"].items()]
    lines += [""]
    (OUT / "sim.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
