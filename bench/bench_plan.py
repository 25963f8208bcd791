"""Planner speed and quality on llama-3-70b (bf16, 141 GB) over three pairs. Writes
bench/results/bench_plan.json and bench_plan.md.

1. `tessera plan` itself (plan_graphs: prefill + decode, batch and m searched, every baseline): total MILP
   solve time and plan/bound, the bound being the joint LP relaxation of the planner's objective with free
   transfers and the memory rows kept (tessera.plan.bound).
2. How much of the remaining gap is the bound's own slack: the decode phase's exact flat MILP optimum
   (HiGHS to a 0.1% gap) against the pattern solution and the LP bound. Free transfers let the LP switch
   devices between any two kernels; the exact optimum pays for each switch.
3. PLANNER.md's min-T form of the throughput objective (H100 + A100: 2 x 80 GB, full replication does not
   fit): pattern MILP vs the T bound with and without the memory rows.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tessera.plan.bound import BoundPhase, lp_bound_joint
from tessera.plan.milp import loads, lp_bound, lp_bound_memory, solve_flat
from tessera.plan.patterns import find_segments, solve_patterns
from tessera.plan.planner import _act_reserve, capture_source, plan_graphs
from tessera.plan.pool import Pool, Workload
from tessera.plan.problem import default_cost
from tessera.plan.score import phase_shape
from tessera.plan.solve import prepare, solve_phase

OUT = Path(__file__).parent / "results"
MODEL, LINK = "llama-3-70b", "pcie5"
PAIRS = (["H100", "A100"], ["H100", "H20"], ["H200", "H100"])
W = Workload(batch=8, prompt=1024, output=256)  # per GPU: the cell serves 16


def plan_rows(src, cost) -> list[dict]:
    rows = []
    for gpus in PAIRS:
        pool = Pool.parse(gpus, LINK)
        t0 = time.perf_counter()
        r = plan_graphs(MODEL, ["prefill", "decode"], src, pool, workload=W, points=False)
        j = r.to_json()
        tess = j["strategies"]["tessera"]
        rows.append({"gpus": pool.names, "solve_s": j["solve_s"], "bound_ratio": j["bound_ratio"],
                     "wall_s_captures_cached": time.perf_counter() - t0,
                     "throughput_tokens_per_s": tess["throughput_tokens_per_s"],
                     "memory_gb": {k: round(v / 1e9, 1) for k, v in tess["memory_bytes"].items()},
                     "notes": r.strategies["tessera"].plan.notes,
                     "baselines": {n: {"feasible": e["feasible"], "reason": e["reason"],
                                       "throughput_tokens_per_s": e["throughput_tokens_per_s"]}
                                   for n, e in j["strategies"].items() if n != "tessera"}})
        print(rows[-1]["gpus"], rows[-1]["solve_s"], rows[-1]["bound_ratio"], flush=True)
    return rows


def exact_rows(src, cost) -> list[dict]:
    """Decode at the cell's batch, m = 1, with the plan's activation reserve: patterns vs exact vs LP."""
    rows = []
    wb = Workload(batch=W.batch * 2, prompt=W.prompt, output=W.output)
    seq, ctx, _ = phase_shape("decode", wb)
    for gpus in PAIRS:
        pool = Pool.parse(gpus, LINK)
        act = _act_reserve(["decode", "prefill"], src, pool, cost, wb, "throughput")
        prob = prepare(src("decode", wb.batch, seq, ctx), pool, cost, m=1, act_bytes=act)
        lp = lp_bound_joint([BoundPhase(prob=prob, m=1, steps=1)])  # the m = 1 step: Σ work
        pat = solve_phase(prob, m=1)
        start = tuple(prob.group_assignment(pat.assignment))
        fr = solve_flat(prob, objective="step", m=1, mip_rel_gap=1e-3, time_limit_s=240.0, starts=[start])
        rows.append({"gpus": pool.names, "groups": prob.G, "lp_bound_s": lp, "patterns_s": pat.objective,
                     "patterns_solve_s": pat.solve_s, "exact_s": fr.objective, "exact_status": fr.status,
                     "exact_mip_gap": fr.mip_gap, "exact_solve_s": fr.solve_s})
        print(rows[-1], flush=True)
    return rows


def min_t_rows(src, cost) -> list[dict]:
    pool = Pool.parse(PAIRS[0], LINK)
    rows = []
    for m in (1, 2, 4):
        batch = W.batch * pool.n // m
        prob = prepare(src("decode", batch, 1, W.prompt + W.output), pool, cost, m=m)
        segs = find_segments(prob)
        pr = solve_patterns(prob, segs, objective="throughput")
        dev, lk = loads(prob, pr.group_dev)
        t_plan = max(dev + list(lk.values()))
        rows.append({"m": m, "micro_batch": batch, "kernels": len(prob.graph.kernels), "groups": prob.G,
                     "patterns": pr.n_patterns, "solve_s": pr.solve_s,
                     "ratio_memory_rows": lp_bound_memory(prob) / t_plan,
                     "ratio_no_memory_rows": lp_bound([(prob.t, 1.0)], pool.n) / t_plan})
    return rows


def main() -> None:
    src, cost = capture_source(MODEL), default_cost()
    res = {"model": MODEL, "link": LINK, "workload_per_gpu": W.__dict__,
           "plan": plan_rows(src, cost), "decode_exact": exact_rows(src, cost), "min_t": min_t_rows(src, cost)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_plan.json").write_text(json.dumps(res, indent=1))
    md = [f"# bench_plan: {MODEL}, {LINK}, batch {W.batch} per GPU, prompt {W.prompt}, output {W.output}", "",
          "## `tessera plan` (prefill + decode, batch and m searched, all baselines)", "",
          "| pair | MILP solve s (all phases, all m) | plan/bound | tokens/s | memory GB | baselines feasible |",
          "|---|---|---|---|---|---|"]
    for x in res["plan"]:
        feas = ", ".join(n for n, b in x["baselines"].items() if b["feasible"]) or "none"
        md.append(f"| {' + '.join(x['gpus'])} | {x['solve_s']:.2f} | {x['bound_ratio']:.3f} | "
                  f"{x['throughput_tokens_per_s']:.1f} | {x['memory_gb']} | {feas} |")
    md += ["", "## Decode step (m = 1): pattern MILP vs exact flat MILP vs LP bound (ms)", "",
           "| pair | groups | LP bound | patterns, 1% gap (solve s) | exact flat, 0.1% gap (solve s) | exact / bound | patterns / exact |",
           "|---|---|---|---|---|---|---|"]
    for x in res["decode_exact"]:
        md.append(f"| {' + '.join(x['gpus'])} | {x['groups']} | {x['lp_bound_s'] * 1e3:.2f} | "
                  f"{x['patterns_s'] * 1e3:.2f} ({x['patterns_solve_s']:.2f}) | {x['exact_s'] * 1e3:.2f} "
                  f"({x['exact_solve_s']:.1f}, {x['exact_status']}, gap {x['exact_mip_gap']:.4f}) | "
                  f"{x['lp_bound_s'] / x['exact_s']:.3f} | {x['patterns_s'] / x['exact_s']:.4f} |")
    md += ["", f"## min-T decode (PLANNER.md's T bound), {' + '.join(res['plan'][0]['gpus'])}", "",
           "| m | micro-batch | kernels | groups | patterns | solve s | T bound / T (memory rows) | (no memory rows) |",
           "|---|---|---|---|---|---|---|---|"]
    for x in res["min_t"]:
        md.append(f"| {x['m']} | {x['micro_batch']} | {x['kernels']} | {x['groups']} | {x['patterns']} | "
                  f"{x['solve_s']:.2f} | {x['ratio_memory_rows']:.3f} | {x['ratio_no_memory_rows']:.3f} |")
    md += ["", "Baseline reasons (H100 + A100): " + "; ".join(
        f"{n}: {b['reason']}" for n, b in res["plan"][0]["baselines"].items() if not b["feasible"])]
    (OUT / "bench_plan.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
