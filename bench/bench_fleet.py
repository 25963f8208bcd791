"""Fleet planning under the serving model: 16 GPUs of five types (cells of up to 8 GPUs) and 64 GPUs, both
objectives; re-planning after a loss with a simulated failure; the advisor ("which GPU mix to rent") at three
budgets against the best homogeneous and prefill/decode mixes, its mix simulated. Writes
bench/results/fleet.json + fleet.md.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_fleet.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tessera.fleet import FleetSpec, plan_fleet, replan_without
from tessera.fleet.advise import advise
from tessera.fleet.cells import cell_name
from tessera.fleet.fleet import cell_planner

OUT = Path(__file__).parent / "results"
MODEL = "llama-3-8b"
POOL16 = {"H100": 8, "A100": 2, "L40S": 2, "H20": 2, "L4": 2}  # eight H100: a TP=8 cell is a candidate
BUDGETS = (10.0, 20.0, 40.0)
LOST = "H100-SXM"
BIG_MODEL, BIG_POOL = "llama-3-70b", {"H100": 8, "A100": 4, "L40S": 4}  # weights fit no single GPU: TP groups


def fleet_row(fp: Any) -> dict[str, Any]:
    return {"gpus": sum(n for _, n in fp.available), "plan_s": fp.plan_s, "eval_s": fp.eval_s, "bound_s": fp.bound_s,
            "solve_s": fp.solve_s, "goodput_per_s": fp.goodput_per_s, "usd_per_hour": fp.usd_per_hour,
            "upper_bound_per_s": fp.upper_bound_per_s, "gap": fp.gap, "evaluated": fp.evaluated,
            "candidates": fp.candidates, "largest_candidate_gpus": fp.largest_candidate_gpus,
            "cells": [f"{c.count}x({cell_name(c.gpus)}{' = ' + c.chosen if c.chosen != 'milp' else ''})"
                      for c in fp.cells], "unused": fp.unused, "load_1min": os.getloadavg()[0]}


def failure_demo(fp: Any) -> dict[str, Any]:
    """Lose one H100 mid-run: the cell holding it stops; its surviving GPUs rejoin as single-GPU cells after
    the measured re-plan time."""
    from tessera.sim import Failure, LengthSpec, WorkloadSpec, simulate_pool

    new, replan_s = replan_without(fp, LOST)
    cp = cell_planner(fp.model, fp.config)
    idx = 0
    for i, c in enumerate(fp.cells):
        if LOST in c.gpus:
            break
        idx += c.count * fp.plans.cells[i].plan.replicas
    else:
        return {"lost": LOST, "note": "no chosen cell holds one"}
    lost = fp.cells[i]
    freed = list(lost.gpus)
    freed.remove(LOST)
    repl = tuple((ev.plan, 1) for g in freed if (ev := cp.evaluate((g,))).plan is not None)
    t = fp.config.traffic
    requests = 20 * sum(c.count for c in fp.cells)
    spec = WorkloadSpec(kind="poisson", requests=requests, rate_per_s=0.8 * fp.goodput_per_s / t.output,
                        prompt=LengthSpec(lo=t.prompt, hi=t.prompt), output=LengthSpec(lo=t.output, hi=t.output))
    res = simulate_pool(fp.sim_cells(), spec, failures=[Failure(at_s=0.4 * requests / spec.rate_per_s, replica=idx,
                                                               replacement=repl or None, replan_s=replan_s)])
    return {"lost": LOST, "lost_cell": cell_name(lost.gpus), "replan_s": replan_s, "survivor_fleet": fleet_row(new),
            "requests": res.requests, "completed": res.completed, "lost_requests": res.lost}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fp16 = plan_fleet(MODEL, FleetSpec.from_counts(POOL16))  # first: includes the capture, a cold process
    fp64 = plan_fleet(MODEL, FleetSpec.from_counts({k: 4 * v for k, v in POOL16.items()}))
    fp16d = plan_fleet(MODEL, FleetSpec.from_counts(POOL16), objective="per_dollar")
    fail = failure_demo(fp16)
    advice = [advise(MODEL, None, b, simulate=b == BUDGETS[1]) for b in BUDGETS]
    fp70 = plan_fleet(BIG_MODEL, FleetSpec.from_counts(BIG_POOL))
    checks = cell_planner(MODEL, fp16.config).bound_checks()
    bounds = [{"cell": cell_name(c), "bound_per_s": b, "best_strategy_per_s": e, "ratio": e / b if b else None}
              for c, b, e in checks]
    cfg = fp16.config.to_dict()
    res = {"model": MODEL, "pool16": POOL16, "slo": cfg["slo"], "traffic": cfg["traffic"],
           "microbatches": cfg["microbatches"], "fleet16": fleet_row(fp16), "fleet64": fleet_row(fp64),
           "fleet16_per_dollar": fleet_row(fp16d), "big": {"model": BIG_MODEL, "pool": BIG_POOL, **fleet_row(fp70)},
           "failure": fail, "bounds": bounds, "advice": [a.to_dict() for a in advice],
           "frontier": [p.__dict__ for a in advice for p in a.frontier_points()],
           "bench_s": time.perf_counter() - t0, "load_1min": os.getloadavg()[0]}
    (OUT / "fleet.json").write_text(json.dumps(res, indent=1, default=str))
    (OUT / "fleet.md").write_text(markdown(res))
    print(markdown(res))


def markdown(res: dict[str, Any]) -> str:
    slo, tr = res["slo"], res["traffic"]
    md = ["# Fleet planning (`bench/bench_fleet.py`)", "",
          f"{res['model']}, goodput at the SLO (TTFT ≤ {slo['ttft_s']:g} s, TPOT ≤ {slo['tpot_s'] * 1e3:g} ms), prompt "
          f"{tr['prompt']} / output {tr['output']}, batch chosen per cell, micro-batches {res['microbatches']}; each "
          f"cell at the best link its GPUs can have; 2-core shared machine, one process, "
          f"load {res['load_1min']:.1f}. The first row includes "
          f"the model's capture (a cold process).", "",
          "| pool | objective | planned in s | cells planned | largest cell | goodput tok/s | $/h | gap to bound | cells |",
          "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r, obj in (("16 GPUs, 5 types", res["fleet16"], "throughput"), ("64 GPUs", res["fleet64"], "throughput"),
                         ("16 GPUs, 5 types", res["fleet16_per_dollar"], "per_dollar")):
        md.append(f"| {name} | {obj} | {r['plan_s']:.1f} | {r['evaluated']}/{r['candidates']} | "
                  f"{r['largest_candidate_gpus']} GPUs | {r['goodput_per_s']:,.0f} | {r['usd_per_hour']:.2f} | "
                  f"{r['gap']:.1%} | {', '.join(r['cells'])} |")
    r = res["big"]
    md += ["", f"{r['model']} (weights fit no single GPU) on {', '.join(f'{n}x{g}' for g, n in r['pool'].items())}: planned "
           f"in {r['plan_s']:.1f} s including its capture (cold), {r['evaluated']}/{r['candidates']} cells planned, "
           f"{r['goodput_per_s']:,.0f} tok/s for {r['usd_per_hour']:.2f} $/h, gap {r['gap']:.1%}: {', '.join(r['cells'])}; "
           f"unused {', '.join(f'{n}x{g}' for g, n in r['unused'].items()) or 'none'}."]
    b = res["bounds"]
    if b:
        worst = max(x["ratio"] for x in b)
        md += ["", f"Pair bound against the pair once planned (every strategy), {len(b)} pairs planned on the pool's "
               f"link: best strategy / bound {min(x['ratio'] for x in b):.2f} to {worst:.2f} "
               f"({'never above 1: the bound held' if worst <= 1 + 1e-9 else 'ABOVE 1: the bound failed'})."]
    f = res["failure"]
    if "replan_s" in f:
        md += ["", f"Losing one H100 (cell {f['lost_cell']}): re-planned in {f['replan_s']:.1f} s; simulated "
               f"{f['requests']} requests, {f['completed']} completed, {f['lost_requests']} lost."]
    md += ["", "Advisor (which GPUs to rent; catalog types ranked by their best TP group's goodput per $/h, best 3 "
           "kept):", "", "| budget $/h | choice | cells | goodput tok/s | $/h | tok/s per $/h | gap |",
           "|---:|---|---|---:|---:|---:|---:|"]
    for a in res["advice"]:
        for k in ("mix", "homogeneous", "prefill_decode"):
            c = a[k]
            if c:
                md.append(f"| {a['budget_usd_per_hour']:g} | {k} | {c['label']} | {c['throughput_per_s']:,.0f} | "
                          f"{c['usd_per_hour']:.2f} | {c['throughput_per_usd_hour']:,.1f} | {c['gap']:.1%} |")
    md += [""] + [f"- budget {a['budget_usd_per_hour']:g} $/h: {a['verdict']} (advised in {a['advise_s']:.1f} s; "
                  f"kept {', '.join(a['kept_types'])})" for a in res["advice"]]
    for a in res["advice"]:
        s = a["sim"]
        if s:
            md.append(f"- simulated mix at {a['budget_usd_per_hour']:g} $/h, Poisson at 90% of the predicted goodput "
                      f"{s['predicted_per_s']:,.0f} tok/s ({s['requests']} requests): steady {s['steady_per_s']:,.0f} "
                      f"tok/s ({s['steady_per_s'] / s['offered_per_s']:.1%} of offered), SLO attainment "
                      f"{(s['slo_attainment'] or 0):.1%}, lost {s['lost']}")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
