"""Accuracy of the measured-table costs (AIConfigurator's database, vLLM, bf16 and fp8).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cost_aic.py [--rows 300] [--aic-site DIR]
Writes bench/results/cost_aic.json and cost_aic.md. Where aiconfigurator-core is importable it also reads its
parquet tables to check why fp8 GEMMs come from the per-tensor rows (5. below); --aic-site appends a
site-packages directory holding it (and pyarrow) to the path, after Tessera's own (the shipped results:
--aic-site /work/peers/aic/lib/python3.11/site-packages, a venv with `pip install aiconfigurator`).

1. Leave-one-GPU-out transfer over every GPU with tables: each GPU's tables predicted from the others' and
   its datasheet (what a GPU without tables gets). Nested: each fold chooses the constants (GEMM cache model,
   transfer distance scale and ridge) by leave-one-out over its own nine fit GPUs, so the held-out GPU takes
   no part in choosing them. Issue 14 targets: GEMM median <= 8 % (p90 <= 25 %), decode attention <= 10 %,
   prefill attention <= 12 %, MoE <= 15 %, over >= 6 GPUs. Reported over all ten GPUs and over the NVIDIA
   ones (the Intel Arc Pro B60 is the only GPU of its vendor and software stack).
2. The constants leave-one-GPU-out over all ten GPUs chooses per table (the shipped defaults).
3. Interpolation on a GPU's own tables: every other interior value of the token axis (GEMM m, attention
   sequence / KV length, MoE tokens) dropped, the table rebuilt from the rest, the dropped rows predicted
   (MoE through its monotone token curve, as the cost model answers). Target: median <= 3 %.
4. MoE (issue 31): the grid points the monotone repair lowered; the routing rule that gives A100 and the Arc
   Pro B60 balanced tables from their power-law rows, left out GPU by GPU; the transfer left out GPU by GPU
   on the power-law rows every GPU has (A100 and B60 included); the H20, which no database measured, against
   its Hopper siblings H100 and H200. Target: MoE median <= 15 % on every held-out GPU.
5. fp8 (issue 31): the fp8 GEMM and block-scaled fp8 MoE tables left out GPU by GPU like the others (target:
   median <= 15 % on every held-out GPU); and, from aiconfigurator-core's parquet tables, each block-scaled
   GEMM kernel's host floor and how its times compare with the per-tensor ones where they clear it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tessera.cost.aic import AicCosts
from tessera.cost.aic_import import block_scaled_gemm_check
from tessera.cost.aic_validate import (
    check_unmeasured_moe,
    moe_repairs,
    select_all,
    validate_interpolation,
    validate_routing,
    validate_transfer,
)
from tessera.errors import UserError

OUT = Path(__file__).parent / "results"
TARGETS = {"gemm": 0.08, "generation_attention": 0.10, "context_attention": 0.12, "moe": 0.15, "gemm_fp8": 0.15,
           "moe_fp8_block": 0.15}
PER_GPU = ("moe", "gemm_fp8", "moe_fp8_block")  # tables whose target holds on every held-out GPU
BALANCED = ("moe", "moe_fp8_block")  # MoE tables under balanced routing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300, help="rows scored per GPU and table")
    ap.add_argument("--aic-site", help="site-packages with aiconfigurator-core and pyarrow (appended to the path)")
    args = ap.parse_args()
    rows = args.rows
    if args.aic_site:
        sys.path.append(args.aic_site)
    t0 = time.time()
    costs = AicCosts()
    loo = validate_transfer(costs, rows=rows, nested=True).to_dict()
    nvidia = [g for g in costs.dirs if g != "Arc-Pro-B60"]
    loo_nv = validate_transfer(costs, fit_on=None, holdout=",".join(nvidia), rows=rows, nested=True).to_dict()
    shipped = validate_transfer(costs, rows=rows).to_dict()
    chosen = select_all(costs, rows=rows)
    interp = validate_interpolation(costs, rows=rows)
    moe = {"repairs": moe_repairs(costs), "routing": validate_routing(costs),
           "power_law_leave_one_gpu_out": validate_transfer(costs, rows=rows, nested=True,
                                                            tables=("moe_power_law",)).to_dict(),
           "h20": check_unmeasured_moe(costs)}
    per_gpu = {(t, f["holdout"][0]): f["ops"][t]["median_ape"] for f in loo["folds"] for t in PER_GPU
               if t in f["ops"]}
    try:
        block = block_scaled_gemm_check()
    except UserError as e:  # aiconfigurator-core not importable: the check is skipped, and says why
        block = {"skipped": str(e)}
    result = {"leave_one_gpu_out": loo, "leave_one_gpu_out_nvidia": loo_nv,
              "leave_one_gpu_out_shipped_constants": shipped, "chosen_on_all": chosen, "interpolation": interp,
              "moe": moe,
              "targets": {f"{t}_median_le_{v}": loo["ops"][t]["median_ape"] <= v for t, v in TARGETS.items()}
              | {"gemm_p90_le_0.25": loo["ops"]["gemm"]["p90_ape"] <= 0.25,
                 "gemm_p90_le_0.25_nvidia": loo_nv["ops"]["gemm"]["p90_ape"] <= 0.25,
                 "interpolation_median_le_0.03": interp["overall"]["median_ape"] <= 0.03}
              | {f"{t}_median_le_{TARGETS[t]}_{g}": e <= TARGETS[t] for (t, g), e in per_gpu.items()}
              | {"moe_routing_median_le_0.15": moe["routing"]["overall"]["median_ape"] <= TARGETS["moe"],
                 "moe_h20_vs_siblings_median_le_0.15":
                     moe["h20"]["vs_sibling_efficiency"]["median_ape"] <= TARGETS["moe"]},
              "fp8_block_gemm": block, "rows_per_table": rows, "wall_s": round(time.time() - t0, 1),
              "loadavg": os.getloadavg()}
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
    lines = ["# Measured-table cost accuracy (AIConfigurator database, vLLM, bf16 and fp8)", "",
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
    lines += ["", "Chosen leave-one-GPU-out over every GPU with the table (the shipped defaults): " + "; ".join(
        f"{t} scale {c['scale']} ridge {c['ridge']}" + (f" L2 {c['resident_fraction']} / {c['l2_bytes_per_fp32_flop']}"
                                                         if t.startswith("gemm") else "")
        for t, c in r["chosen_on_all"].items())]
    lines += [""] + _table("## Interpolation inside a GPU's own tables (every other token-axis value held out)",
                           it["ops"], it["overall"])
    lines += _moe_markdown(r["moe"])
    lines += _block_markdown(r["fp8_block_gemm"])
    lines += ["Targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in r["targets"].items()) + ".",
              "", f"Wall {r['wall_s']} s, load average {tuple(round(x, 2) for x in r['loadavg'])}."]
    return "\n".join(lines) + "\n"


def _moe_markdown(m: dict) -> list[str]:
    rt, pl, h = m["routing"], m["power_law_leave_one_gpu_out"], m["h20"]
    balanced = [x for x in m["repairs"] if x["table"] in BALANCED]
    big = [x for x in balanced if x["repaired_ms"] < 0.95 * x["measured_ms"]]
    per = ", ".join(f"{t} {sum(1 for x in balanced if x['table'] == t)}" for t in BALANCED)
    lines = ["## MoE", "",
             f"Monotone repair (running minimum from above along tokens): {len(m['repairs'])} grid "
             f"points lowered ({len(balanced)} in the balanced tables: {per}; the rest in the power-law rows); "
             f"{len(big)} balanced points by 5 % or more:", "",
             "| GPU | table | tokens, hidden, inter, topk, experts | measured ms | repaired ms |",
             "| --- | --- | --- | ---: | ---: |"]
    lines += [f"| {x['gpu']} | {x['table']} | {', '.join(map(str, x['shape']))} | {x['measured_ms']:.4g} | "
              f"{x['repaired_ms']:.4g} |" for x in big]
    lines += ["", "Routing rule (balanced = own power-law rows x the other GPUs' mean balanced / power-law "
              "ratio), each GPU with both left out in turn (median / p90 APE against its measured balanced "
              "rows):", "",
              "| GPU | derived | power-law rows as they are |", "| --- | ---: | ---: |"]
    for g, e in rt["gpus"].items():
        lines.append(f"| {g} | {e['derived']['median_ape']:.1%} / {e['derived']['p90_ape']:.0%} | "
                     f"{e['power_law_as_is']['median_ape']:.1%} / {e['power_law_as_is']['p90_ape']:.0%} |")
    lines.append(f"| **all** | {rt['overall']['median_ape']:.1%} / {rt['overall']['p90_ape']:.0%} | "
                 f"{rt['power_law_as_is']['median_ape']:.1%} / {rt['power_law_as_is']['p90_ape']:.0%} |")
    lines += ["", "Transfer left out GPU by GPU on the power-law rows (measured on all ten GPUs; nested), "
              "median / p90 APE:", "", "| GPU | moe_power_law |", "| --- | ---: |"]
    for f in pl["folds"]:
        o = f["ops"].get("moe_power_law")
        if o:
            lines.append(f"| {f['holdout'][0]} | {o['median_ape']:.1%} / {o['p90_ape']:.0%} |")
    v, frac = h["vs_sibling_efficiency"], h["median_roofline_fraction"]
    dom = next(k for k in h if k.startswith("no_faster_than_"))
    beat = ", ".join(f"{x:.0%}" for x in h["siblings_beat_their_roofline"].values())
    sibs, by = " and ".join(h["siblings"]), dom.rsplit("_", 1)[1]
    lines += ["", f"{h['target']} (no measured MoE table anywhere), at the {h['shapes']} shapes its "
              f"siblings {sibs} share: no faster than {by} at {h[dom]:.0%} of them; faster than its own "
              f"datasheet roofline at {h['beats_own_roofline']:.0%} (the siblings beat theirs at {beat}); "
              "against the time at which it reaches the siblings' fraction of its roofline: "
              f"{v['median_ape']:.1%} median, {v['p90_ape']:.0%} p90. Median fraction of the roofline "
              "reached: " + ", ".join(f"{g} {x:.2f}" for g, x in frac.items()) + ".", ""]
    return lines


def _block_markdown(b: dict) -> list[str]:
    lines = ["## fp8 GEMMs: block-scaled against per-tensor rows", ""]
    if "skipped" in b:
        return [*lines, f"Not run: {b['skipped']}", ""]
    lines += ["From aiconfigurator-core's vLLM GEMM tables: each block-scaled (fp8_block) kernel's floor (5th "
              "percentile of its times), the share of fp8_block rows under twice it, and fp8_block / fp8 "
              "(per-tensor) at the shapes whose block-scaled time clears it:", "",
              "| system | kernel floors ms | rows under 2 floors | fp8_block / fp8 where clear: median, p10, p90 "
              "(points) |", "| --- | --- | ---: | --- |"]
    for system, x in b.items():
        q = x["ratio_where_clear"]
        floors = ", ".join(f"{k.removesuffix('Fp8BlockScaledMMKernel')} {v:.3g}" for k, v in x["floor_ms"].items())
        lines.append(f"| {system} | {floors} | {x['under_floor_share']:.0%} | {q['median']:.2f}, {q['p10']:.2f}, "
                     f"{q['p90']:.2f} ({q['points']}) |")
    return [*lines, ""]


if __name__ == "__main__":
    main()
