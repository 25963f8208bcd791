"""Planner speed and quality on llama-3-70b (bf16, 141 GB) over H100 + A100 (2 x 80 GB: full replication
does not fit, the memory-aware plan does). Writes bench/results/bench_plan.json and bench_plan.md.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tessera.plan.milp import loads, lp_bound, lp_bound_memory
from tessera.plan.planner import capture_source, plan_graphs
from tessera.plan.pool import Pool, Workload
from tessera.plan.problem import default_cost
from tessera.plan.solve import prepare, solve_phase

OUT = Path(__file__).parent / "results"
MODEL, GPUS, LINK = "llama-3-70b", ["H100", "A100"], "pcie5"
W = Workload(batch=8, prompt=1024, output=256)


def main() -> None:
    pool = Pool.parse(GPUS, LINK)
    src = capture_source(MODEL)
    cost = default_cost()
    rows = []
    for m in (1, 2, 4):
        batch = W.batch * pool.n // m
        g = src("decode", batch, 1, W.prompt + W.output)
        prob = prepare(g, pool, cost, m=m)
        t_bound_nomem = lp_bound([(prob.t, 1.0)], pool.n)
        t_bound = lp_bound_memory(prob)
        # pure throughput objective (min T): the solver's quality against the LP bound
        t0 = time.perf_counter()
        sol = solve_phase(prob, mode="throughput", m=m) if m > 1 else None
        from tessera.plan.patterns import find_segments, solve_patterns
        segs = find_segments(prob)
        pr = solve_patterns(prob, segs, objective="throughput")
        solve_s = time.perf_counter() - t0
        dev, lk = loads(prob, pr.group_dev)
        t_plan = max(dev + list(lk.values()))
        rows.append({"phase": "decode", "m": m, "micro_batch": batch, "kernels": len(g.kernels), "groups": prob.G,
                     "segments": [[s.layers[0], len(s.layers)] for s in segs], "patterns": pr.n_patterns,
                     "minT_solve_s": pr.solve_s, "minT_bound_ratio": t_bound / t_plan,
                     "minT_bound_ratio_without_memory_rows": t_bound_nomem / t_plan,
                     "step_objective_solve_s": sol.solve_s if sol else None, "total_solve_s": solve_s,
                     })
    t0 = time.perf_counter()
    r = plan_graphs(MODEL, ["prefill", "decode"], src, pool, workload=W, points=False)
    wall = time.perf_counter() - t0
    j = r.to_json()
    res = {"model": MODEL, "gpus": pool.names, "link": LINK, "workload": W.__dict__, "decode_solves": rows,
           "plan": j, "plan_wall_s_with_captures_cached": wall,
           "full_replication_fits": any(g.mem_bytes >= 141e9 for g in pool.gpus)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_plan.json").write_text(json.dumps(res, indent=1))
    md = [f"# bench_plan: {MODEL} on {' + '.join(pool.names)} ({LINK})", "",
          "| m | micro-batch | kernels | groups | patterns | min-T solve s | plan/bound | plan/bound (no memory rows) |",
          "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        md.append(f"| {x['m']} | {x['micro_batch']} | {x['kernels']} | {x['groups']} | {x['patterns']} | "
                  f"{x['minT_solve_s']:.2f} | {x['minT_bound_ratio']:.3f} | "
                  f"{x['minT_bound_ratio_without_memory_rows']:.3f} |")
    s = j["strategies"]
    md += ["", f"plan_model (captures cached): {wall:.1f} s wall, solver total {j['solve_s']:.2f} s, "
           f"Tessera bound ratio {j['bound_ratio']}", ""]
    for n, e in s.items():
        md.append(f"- {n}: feasible={e['feasible']} thr={e.get('throughput_tokens_per_s')} reason={e['reason']} "
                  f"memory GB={ {k: round(v / 1e9, 1) for k, v in e['memory_bytes'].items()} }")
    (OUT / "bench_plan.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
