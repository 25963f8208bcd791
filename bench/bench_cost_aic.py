"""Accuracy of the measured-table costs (AIConfigurator's database, vLLM, bf16).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cost_aic.py [--rows 300]
Writes bench/results/cost_aic.json and cost_aic.md.

1. Leave-one-GPU-out transfer over every GPU with tables: each GPU's tables predicted from the others' and
   its datasheet (what a GPU without tables gets). Nested: each fold chooses the constants (GEMM cache model,
   transfer distance scale and ridge) by leave-one-out over its own nine fit GPUs, so the held-out GPU takes
   no part in choosing them. Issue 14 targets: GEMM median <= 8 % (p90 <= 25 %), decode attention <= 10 %,
   prefill attention <= 12 %, MoE <= 15 %, over >= 6 GPUs. Reported over all ten GPUs and over the NVIDIA
   ones (the Intel Arc Pro B60 is the only GPU of its vendor and software stack).
2. The constants leave-one-GPU-out over all ten GPUs chooses per table (the shipped defaults).
3. Interpolation on a GPU's own tables: every other interior value of the token axis (GEMM m, attention
   sequence / KV length, MoE tokens) dropped, the table rebuilt from the rest, the dropped rows predicted.
   Target: median <= 3 %.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tessera.cost.aic import AicCosts
from tessera.cost.aic_validate import select_all, validate_interpolation, validate_transfer

OUT = Path(__file__).parent / "results"
TARGETS = {"gemm": 0.08, "generation_attention": 0.10, "context_attention": 0.12, "moe": 0.15}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300, help="rows scored per GPU and table")
    rows = ap.parse_args().rows
    t0 = time.time()
    costs = AicCosts()
    loo = validate_transfer(costs, rows=rows, nested=True)
    nvidia = [g for g in costs.dirs if g != "Arc-Pro-B60"]
    loo_nv = validate_transfer(costs, fit_on=None, holdout=",".join(nvidia), rows=rows, nested=True)
    shipped = validate_transfer(costs, rows=rows)
    chosen = select_all(costs, rows=rows)
    interp = validate_interpolation(costs, rows=rows)
    result = {"leave_one_gpu_out": loo, "leave_one_gpu_out_nvidia": loo_nv,
              "leave_one_gpu_out_shipped_constants": shipped, "chosen_on_all": chosen, "interpolation": interp,
              "targets": {f"{t}_median_le_{v}": loo["ops"][t]["median_ape"] <= v for t, v in TARGETS.items()}
              | {"gemm_p90_le_0.25": loo["ops"]["gemm"]["p90_ape"] <= 0.25,
                 "gemm_p90_le_0.25_nvidia": loo_nv["ops"]["gemm"]["p90_ape"] <= 0.25,
                 "interpolation_median_le_0.03": interp["overall"]["median_ape"] <= 0.03},
              "rows_per_table": rows, "wall_s": round(time.time() - t0, 1), "loadavg": os.getloadavg()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cost_aic.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / "cost_aic.md").write_text(markdown(result))


def _table(title: str, ops: dict, overall: dict) -> list[str]:
    lines = [title, "", "| table | median APE | p90 APE | points |", "| --- | ---: | ---: | ---: |"]
    for op, s in [*ops.items(), ("**overall**", overall)]:
        lines.append(f"| {op} | {s['median_ape']:.1%} | {s['p90_ape']:.1%} | {s['points']} |")
    return [*lines, ""]


def markdown(r: dict) -> str:
    loo, nv, it = r["leave_one_gpu_out"], r["leave_one_gpu_out_nvidia"], r["interpolation"]
    lines = ["# Measured-table cost accuracy (AIConfigurator database, vLLM, bf16)", "",
             f"{r['rows_per_table']} evenly spaced rows per GPU and table; errors |predicted / measured - 1|. "
             "Transfer figures are nested: each fold chose its constants on its own fit GPUs.", ""]
    lines += _table(f"## Leave-one-GPU-out transfer, all {len(loo['holdout'])} GPUs", loo["ops"], loo["overall"])
    lines += _table(f"## Leave-one-GPU-out transfer, held out: the {len(nv['holdout'])} NVIDIA GPUs "
                    "(fit on the other nine)", nv["ops"], nv["overall"])
    sh = r["leave_one_gpu_out_shipped_constants"]
    lines += _table("## The same with the shipped constants (not nested: chosen on all ten, so optimistic)",
                    sh["ops"], sh["overall"])
    lines += ["Per held-out GPU, nested (median / p90 APE):", "", "| GPU | " + " | ".join(TARGETS) + " |",
              "| --- |" + " ---: |" * len(TARGETS)]
    for f in loo["folds"]:
        cells = [f"{f['ops'][t]['median_ape']:.1%} / {f['ops'][t]['p90_ape']:.0%}" if t in f["ops"] else "-"
                 for t in TARGETS]
        lines.append(f"| {f['holdout'][0]} | " + " | ".join(cells) + " |")
    lines += ["", "Constants chosen per fold (GEMM: L2-resident fraction, L2 bytes per FP32 FLOP, scale, ridge):", ""]
    for f in loo["folds"]:
        g = f.get("chosen", {}).get("gemm")
        if g:
            lines.append(f"- {f['holdout'][0]}: {g['resident_fraction']}, {g['l2_bytes_per_fp32_flop']}, "
                         f"{g['scale']}, {g['ridge']}")
    lines += ["", "Chosen on all ten (the shipped defaults): " + "; ".join(
        f"{t} scale {c['scale']} ridge {c['ridge']}" + (f" L2 {c['resident_fraction']} / {c['l2_bytes_per_fp32_flop']}"
                                                         if t == "gemm" else "") for t, c in r["chosen_on_all"].items())]
    lines += [""] + _table("## Interpolation inside a GPU's own tables (every other token-axis value held out)",
                           it["ops"], it["overall"])
    lines += ["Targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in r["targets"].items()) + ".",
              "", f"Wall {r['wall_s']} s, load average {tuple(round(x, 2) for x in r['loadavg'])}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
