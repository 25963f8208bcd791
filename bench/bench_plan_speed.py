"""The planner's speed once a model is captured (issue target: <= 5 s wall per two-GPU cell, <= 30 s for 16
GPUs of five types, on a quiet machine, CPU time quoted).

Each cell runs in a fresh process. A pair is planned three times by plan_serving: the first run captures
the model (captures are cached per process and do not depend on the GPUs, so `tessera compare` and
`tessera evaluate` capture each model once); then the planner alone in one process (workers=1), and with
the MILP's search in a forked second process (workers=2, what `tessera plan` does on two or more cores).
CPU seconds count the forked process too. A many-GPU pool runs the fleet planner (one process), twice.
Reported per cell: wall and CPU seconds, with the 1-minute load average before and after, since the machine
may be shared.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan_speed.py [--cells NAME,...]
writes bench/results/plan_speed.json and plan_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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


def plan_once(model: str, pool: str, workers: int) -> None:
    from tessera.plan import PlannerConfig, plan_serving
    from tessera.study.evaluate import StudyPool, fleet_answer

    if "+" in pool:  # a many-GPU pool: the fleet planner's cells, as `tessera plan --pool` plans them
        gpus = tuple((g.split("x", 1)[1], int(g.split("x", 1)[0])) for g in pool.split("+"))
        fleet_answer(model, StudyPool(name=pool, gpus=gpus), PlannerConfig())
    else:
        plan_serving(model, pool, PlannerConfig(), workers=workers)


def cpu_s() -> float:
    """User + system seconds of this process and of its finished children (the forked MILP worker)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def one_cell(model: str, pool: str, repeat: int) -> dict:
    """Run in a child process: the first run captures the model; the next are the planner alone, every
    other cache keyed by graphs the first run's search made and then dropped; ``repeat`` times each, one
    process then two in turn (this machine's timings vary by a second from run to run): the median and the
    range are reported."""
    w0, c0 = time.perf_counter(), cpu_s()
    plan_once(model, pool, 1)
    runs: dict = {"first_wall_s": time.perf_counter() - w0, "first_cpu_s": cpu_s() - c0}
    # the fleet planner (a many-GPU pool) runs in one process: no two-process run
    counts = {"planner": 1} if "+" in pool else {"planner": 1, "planner_2p": 2}
    times: dict[str, list[tuple[float, float]]] = {"planner": [], "planner_2p": []}
    for _ in range(repeat):
        for name, workers in counts.items():
            w0, c0 = time.perf_counter(), cpu_s()
            plan_once(model, pool, workers)
            times[name].append((time.perf_counter() - w0, cpu_s() - c0))
    for name, got in times.items():
        walls = sorted(w for w, _ in got)
        runs[f"{name}_wall_s"] = statistics.median(walls) if got else None
        runs[f"{name}_cpu_s"] = statistics.median(sorted(c for _, c in got)) if got else None
        runs[f"{name}_wall_range_s"] = (walls[0], walls[-1]) if got else None
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--repeat", type=int, default=3, help="planner runs per cell and process count")
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_cell(*args.child, args.repeat)))
        return
    rows = []
    for name in args.cells.split(","):
        model, pool = CELLS[name]
        load0 = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--child", model, pool, "--repeat", str(args.repeat)],
                             capture_output=True, text=True,
                             env={**os.environ, "TESSERA_PROGRESS": "off"}, check=True)
        r = {"cell": name, **json.loads(out.stdout.strip().splitlines()[-1]), "load_before": load0,
             "load_after": os.getloadavg()[0]}
        rows.append(r)
        two = f", two processes {r['planner_2p_wall_s']:.1f} s wall / {r['planner_2p_cpu_s']:.1f} s CPU" \
            if r["planner_2p_wall_s"] is not None else ""
        print(f"{name}: planner {r['planner_wall_s']:.1f} s wall / {r['planner_cpu_s']:.1f} s CPU{two} (first "
              f"run, with capture, {r['first_wall_s']:.1f} s), load {load0:.1f}->{r['load_after']:.1f}", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "plan_speed.json").write_text(json.dumps({"cells": rows, "cores": os.cpu_count(), "repeat": args.repeat},
                                                    indent=1))
    lines = ["# Planner speed once the model is captured", "",
             f"Each cell in a fresh process; {os.cpu_count()} cores, shared (load beside each row). Median of "
             f"{args.repeat} runs per cell and process count, the range of the wall times beside it. Command: "
             "`OMP_NUM_THREADS=1 .venv/bin/python bench/bench_plan_speed.py`.", "",
             "| cell | one process: wall s (range) | CPU s | two processes: wall s (range) | CPU s | first run, "
             "with capture, wall s | load before → after |", "|---|---|---|---|---|---|---|"]

    def timed(r: dict, name: str) -> str:
        if r[f"{name}_wall_s"] is None:
            return "– | –"
        lo, hi = r[f"{name}_wall_range_s"]
        return f"{r[f'{name}_wall_s']:.1f} ({lo:.1f}–{hi:.1f}) | {r[f'{name}_cpu_s']:.1f}"
    lines += [f"| {r['cell']} | {timed(r, 'planner')} | {timed(r, 'planner_2p')} | "
              f"{r['first_wall_s']:.1f} | {r['load_before']:.1f} → {r['load_after']:.1f} |" for r in rows]
    lines += ["", "Two processes: the search's tasks shared with a forked process (plan_serving(workers=2), "
              "what `tessera plan` runs on two or more cores); CPU seconds count both. The fleet planner "
              "(the 16-GPU pool) runs in one process."]
    (OUT / "plan_speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
