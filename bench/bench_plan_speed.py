"""The planner's speed once a model is captured (issue target: <= 5 s wall per two-GPU cell, <= 30 s for 16
GPUs of five types, on a quiet machine, CPU time quoted).

Each cell runs in a fresh process: plan_serving (two-GPU cells) or the fleet planner (a many-GPU pool),
planned twice: the second run is the planner alone, the model's captures being cached per process (they
do not depend on the GPUs, so `tessera compare` and `tessera evaluate` capture each model once). Reported
per cell: wall and CPU seconds of both runs, with the 1-minute load average before and after, since the
machine may be shared.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan_speed.py [--cells NAME,...]
writes bench/results/plan_speed.json and plan_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CELLS = {  # name -> (model, pool: "A,B" for a pair, or a pool spec "4xH100+...")
    "llama-3-8b H100+L40S": ("llama-3-8b", "H100,L40S"),
    "llama-3-70b H100+A100": ("llama-3-70b", "H100,A100"),
    "mixtral-8x7b H100+L40S": ("mixtral-8x7b", "H100,L40S"),
    "flux-dev H100+L40S": ("flux-dev", "H100,L40S"),
    "llama-3-8b 16 GPUs of 5 types": ("llama-3-8b", "4xH100-SXM+4xA100-80GB-SXM+4xH20+2xL40S+2xL4"),
}
OUT = Path(__file__).resolve().parent / "results"


def plan_once(model: str, pool: str) -> None:
    from tessera.plan import PlannerConfig, plan_serving
    from tessera.study.evaluate import StudyPool, fleet_answer

    if "+" in pool:  # a many-GPU pool: the fleet planner's cells, as `tessera plan --pool` plans them
        gpus = tuple((g.split("x", 1)[1], int(g.split("x", 1)[0])) for g in pool.split("+"))
        fleet_answer(model, StudyPool(name=pool, gpus=gpus), PlannerConfig())
    else:
        plan_serving(model, pool, PlannerConfig())


def one_cell(model: str, pool: str) -> dict:
    """Run in a child process: the cell planned twice. The first run captures the model (captures are
    cached per process and do not depend on the GPUs); the second is the planner alone, every other
    cache keyed by graphs the first run's search made and then dropped."""
    runs = []
    for _ in range(2):
        w0, c0 = time.perf_counter(), time.process_time()
        plan_once(model, pool)
        runs.append((time.perf_counter() - w0, time.process_time() - c0))
    (w1, c1), (w2, c2) = runs
    return {"first_wall_s": w1, "first_cpu_s": c1, "planner_wall_s": w2, "planner_cpu_s": c2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_cell(*args.child)))
        return
    rows = []
    for name in args.cells.split(","):
        model, pool = CELLS[name]
        load0 = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--child", model, pool], capture_output=True, text=True,
                             env={**os.environ, "TESSERA_PROGRESS": "off"}, check=True)
        r = {"cell": name, **json.loads(out.stdout.strip().splitlines()[-1]), "load_before": load0,
             "load_after": os.getloadavg()[0]}
        rows.append(r)
        print(f"{name}: planner {r['planner_wall_s']:.1f} s wall / {r['planner_cpu_s']:.1f} s CPU (first run, "
              f"with capture, {r['first_wall_s']:.1f} s), load {load0:.1f}->{r['load_after']:.1f}", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "plan_speed.json").write_text(json.dumps({"cells": rows, "cores": os.cpu_count()}, indent=1))
    lines = ["# Planner speed once the model is captured", "",
             f"Each cell in a fresh process; {os.cpu_count()} cores, shared (load beside each row). "
             "Command: `OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan_speed.py`.", "",
             "| cell | planner wall s | planner CPU s | first run, with capture, wall s | load before → after |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['cell']} | {r['planner_wall_s']:.1f} | {r['planner_cpu_s']:.1f} | {r['first_wall_s']:.1f} | "
              f"{r['load_before']:.1f} → {r['load_after']:.1f} |" for r in rows]
    (OUT / "plan_speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
