"""Fleet planning speed (16 GPUs of five types, 64 GPUs), re-planning after a loss with a simulated failure,
and the advisor against the best homogeneous and prefill/decode mixes. Writes bench/results/fleet.json + .md.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_fleet.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tessera.fleet import FleetSpec, plan_fleet, replan_without
from tessera.fleet.advise import advise
from tessera.fleet.fleet import cell_planner

OUT = Path(__file__).parent / "results"
MODEL = "llama-3-8b"
POOL16 = {"H100": 4, "A100": 4, "L40S": 4, "H20": 2, "L4": 2}
BUDGETS = (10.0, 20.0, 40.0)


def fleet_row(fp: Any) -> dict[str, Any]:
    return {"gpus": sum(n for _, n in fp.pool), "plan_s": fp.plan_s, "eval_s": fp.eval_s, "solve_s": fp.solve_s,
            "throughput_per_s": fp.throughput_per_s, "usd_per_hour": fp.usd_per_hour, "gap": fp.gap,
            "evaluated": fp.evaluated, "candidates": fp.candidates,
            "cells": [f"{c.count}x({'+'.join(c.gpus)})" for c in fp.cells], "unused": fp.unused}


def failure_demo(fp: Any) -> dict[str, Any]:
    """Lose one H100 mid-run: the cell holding it stops; its surviving GPUs rejoin as re-planned cells."""
    from tessera.sim import Failure, LengthSpec, WorkloadSpec, simulate_pool

    new, replan_s = replan_without(fp, "H100-SXM")
    cp = cell_planner(fp.model, __import__("tessera.plan.pool", fromlist=["Workload"]).Workload(**fp.workload),
                      fp.link)
    idx, lost = 0, None
    for c in fp.cells:
        if "H100-SXM" in c.gpus:
            lost = c
            break
        idx += c.count * c.plan.replicas
    assert lost is not None
    freed = list(lost.gpus)
    freed.remove("H100-SXM")
    repl = tuple((cp.evaluate((g,)).plan, 1) for g in freed if cp.evaluate((g,)).feasible)
    n_cells = sum(c.count for c in fp.cells)
    w = fp.workload
    spec = WorkloadSpec(kind="poisson", requests=20 * n_cells, rate_per_s=0.8 * fp.throughput_per_s / w["output"],
                        prompt=LengthSpec(lo=w["prompt"], hi=w["prompt"]), output=LengthSpec(lo=w["output"],
                                                                                               hi=w["output"]))
    at_s = 0.4 * spec.requests / spec.rate_per_s
    res = simulate_pool(fp.sim_cells(), spec, failures=[Failure(at_s=at_s, replica=idx, replacement=repl or None,
                                                               replan_s=replan_s)])
    d = res.to_dict() if hasattr(res, "to_dict") else res.to_json()
    return {"lost": "H100-SXM", "lost_cell": "+".join(lost.gpus), "replan_s": replan_s,
            "survivor_fleet": fleet_row(new), "requests": res.requests, "completed": res.completed,
            "lost_requests": res.lost, "failures": d.get("failures", getattr(res, "failures", None))}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fp16 = plan_fleet(MODEL, FleetSpec.from_counts(POOL16))
    fp64 = plan_fleet(MODEL, FleetSpec.from_counts({k: 4 * v for k, v in POOL16.items()}))
    fp16d = plan_fleet(MODEL, FleetSpec.from_counts(POOL16), objective="per_dollar")
    fail = failure_demo(fp16)
    advice = [advise(MODEL, None, b, simulate=b == BUDGETS[1]) for b in BUDGETS]
    res = {"model": MODEL, "pool16": POOL16, "fleet16": fleet_row(fp16), "fleet64": fleet_row(fp64),
           "fleet16_per_dollar": fleet_row(fp16d), "failure": fail,
           "advice": [a.to_dict() for a in advice],
           "frontier": [p.__dict__ for a in advice for p in a.frontier_points()],
           "bench_s": time.perf_counter() - t0}
    (OUT / "fleet.json").write_text(json.dumps(res, indent=1, default=str))
    md = ["# Fleet planning (`bench/bench_fleet.py`)", "",
          f"{MODEL}, batch 32 per GPU, prompt 1024, output 256, pcie5 inside a cell; 2-core machine, one process.",
          "", "| pool | objective | planned in s | cells planned | tokens/s | $/h | gap to bound | cells |",
          "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, r, obj in (("16 GPUs", res["fleet16"], "throughput"), ("64 GPUs", res["fleet64"], "throughput"),
                         ("16 GPUs", res["fleet16_per_dollar"], "per_dollar")):
        md.append(f"| {name} | {obj} | {r['plan_s']:.1f} | {r['evaluated']}/{r['candidates']} | "
                  f"{r['throughput_per_s']:,.0f} | {r['usd_per_hour']:.2f} | {r['gap']:.1%} | {', '.join(r['cells'])} |")
    md += ["", f"Losing one H100 (cell {fail['lost_cell']}): re-planned in {fail['replan_s']:.1f} s; simulated "
           f"{fail['requests']} requests, {fail['completed']} completed, {fail['lost_requests']} lost.", "",
           "| budget $/h | choice | cells | tokens/s | $/h | tokens/s per $/h |", "|---:|---|---|---:|---:|---:|"]
    for a in res["advice"]:
        for k in ("mix", "homogeneous", "prefill_decode"):
            c = a[k]
            if c:
                md.append(f"| {a['budget_usd_per_hour']:g} | {k} | {c['label']} | {c['throughput_per_s']:,.0f} | "
                          f"{c['usd_per_hour']:.2f} | {c['throughput_per_usd_hour']:,.1f} |")
    md += [""] + [f"- budget {a['budget_usd_per_hour']:g} $/h: {a['verdict']} (advised in {a['advise_s']:.1f} s)"
                  for a in res["advice"]]
    (OUT / "fleet.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
