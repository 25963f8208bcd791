"""A re-run of the study (all or some of its cells) against the committed one: which figures moved.

The study takes over an hour on two cores; a change meant to leave answers alone (a faster planner) is
checked by re-running cells and comparing every figure of each, not by trusting it. Timings and loads are
left out; floats compare to 1e-6 relative.

    tessera evaluate --fresh --limit 0 --out-dir DIR; tessera evaluate --out-dir DIR --shard K/N ...
    .venv/bin/python bench/bench_eval_rerun.py DIR/eval.cells.jsonl --code COMMIT
writes bench/results/eval_rerun.json and eval_rerun.md (the re-run's cells kept in eval_rerun.cells.jsonl).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results"
NOT_FIGURES = {"wall_s", "cpu_s", "solve_s", "load_1min", "provenance", "sim_wall_s"}


def key(cell: dict) -> str:
    return f"{cell['model']} | {cell['shape']} | {cell['pool']} | {cell['link']}"


def moved(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every figure that differs between two cells (timings and loads left out)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) if k not in NOT_FIGURES
                for d in moved(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in moved(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-6 * max(1.0, abs(a)):
        return []
    return [] if a == b else [(path, a, b)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cells", type=Path, help="the re-run's eval.cells.jsonl")
    ap.add_argument("--code", required=True, help="the commit the re-run ran")
    args = ap.parse_args()
    base = {key(c): c for c in map(json.loads, (OUT / "eval.cells.jsonl").read_text().splitlines())}
    rerun = [json.loads(line) for line in args.cells.read_text().splitlines()]
    rows = []
    for c in rerun:
        old = base[key(c)]
        diffs = moved(old, c)
        rows.append({"cell": key(c), "n_gpus": c["n_gpus"], "moved": len(diffs),
                     "tessera_before": old["tessera"]["goodput_per_s"], "tessera_after": c["tessera"]["goodput_per_s"],
                     "load_before": old["load_1min"], "load_after": c["load_1min"],
                     "figures": [{"path": p, "before": x, "after": y} for p, x, y in diffs]})
    if args.cells.resolve() != (OUT / "eval_rerun.cells.jsonl").resolve():
        shutil.copyfile(args.cells, OUT / "eval_rerun.cells.jsonl")
    (OUT / "eval_rerun.json").write_text(json.dumps({"code": args.code, "cells": rows}, indent=1))
    (OUT / "eval_rerun.md").write_text(markdown(rows, args.code, len(base)))


def markdown(rows: list[dict], code: str, total: int) -> str:
    pairs = [r for r in rows if r["n_gpus"] == 2]
    pools = [r for r in rows if r["n_gpus"] > 2]
    same = sum(1 for r in pairs if not r["moved"]), sum(1 for r in pools if not r["moved"])
    lines = ["# The study re-run in part: which figures moved", "",
             f"{len(rows)} of the study's {total} cells re-run at code {code} and compared figure by figure with "
             "`eval.cells.jsonl` (timings and loads left out; floats to 1e-6). Command: "
             "`.venv/bin/python bench/bench_eval_rerun.py CELLS --code COMMIT`.", "",
             f"- Two-GPU cells: {same[0]} of {len(pairs)} identical.",
             f"- Pools of 4–16 GPUs: {same[1]} of {len(pools)} identical. A many-GPU pool's fleet is planned "
             "within a wall-time budget (`budget_s`, docs/fleet.md): on a busier machine it may plan fewer "
             "candidates, and `/fleet/gap` (its distance from its own upper bound) says how far that left it.", "",
             "| cell | GPUs | figures moved | Tessera before → after | load before → after | what moved (first 4) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["moved"]:
            what = "; ".join(f"{f['path']}: {short(f['before'])} → {short(f['after'])}" for f in r["figures"][:4])
            lines.append(f"| {r['cell']} | {r['n_gpus']} | {r['moved']} | {r['tessera_before']:,.1f} → "
                         f"{r['tessera_after']:,.1f} | {r['load_before']:.1f} → {r['load_after']:.1f} | {what} |")
    return "\n".join(lines) + "\n"


def short(x: Any) -> str:
    return f"{x:,.4g}" if isinstance(x, float) else str(x)[:60]


if __name__ == "__main__":
    main()
