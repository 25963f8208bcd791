"""The evaluation study (issue: five GPU types, four families, real traffic shapes, up to 16 GPUs).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_eval.py [--quick] [--fresh] 2> bench/results/eval.log

Resumes from bench/results/eval[.quick].cells.jsonl (one line per finished cell), then writes
eval[.quick].json / .md and the placement maps of the best and worst cells. Same as `tessera evaluate`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tessera.study.evaluate import placement_maps, run_evaluate

OUT = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    data = run_evaluate(out_dir=OUT, quick=a.quick, fresh=a.fresh, limit=a.limit)
    placement_maps(data, OUT, "eval.quick" if a.quick else "eval")
    g = data["summary"]["gains"]
    print(f"{len(data['cells'])} cells; goodput gain {g['goodput']}; per $ gain {g['per_usd']}")


if __name__ == "__main__":
    main()
