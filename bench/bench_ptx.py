"""PTX stage benchmark: parse + analyse throughput over the corpus, and a >= 10,000-case fuzz run.

    .venv/bin/python bench/bench_ptx.py [--repeat 20] [--fuzz 10000]

Writes bench/results/ptx.json and bench/results/ptx.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ptx"))

from test_ptx_fuzz import check_clean, mutated  # noqa: E402

from tessera.ptx.analysis import analyze_ptx  # noqa: E402

CORPUS = ROOT / "tests" / "ptx" / "corpus"


def throughput(repeat: int, rounds: int = 7) -> dict[str, float]:
    """Every corpus module parsed and analysed ``repeat`` times per round; best of ``rounds`` rounds, in
    wall-clock and in process CPU time (the machine is shared: CPU time is less disturbed by other
    processes, wall time is what a user waits)."""
    files = [(str(p), p.read_text()) for p in sorted(CORPUS.glob("*/*.ptx"))]
    total = sum(len(t) for _, t in files)
    best_wall = best_cpu = float("inf")
    load_before = os.getloadavg()[0]
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(repeat):
            for name, text in files:
                analyze_ptx(text, name)
        best_wall = min(best_wall, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return {"modules": len(files), "corpus_bytes": total, "repeat": repeat, "rounds": rounds,
            "seconds": best_wall, "mb_per_s": total * repeat / best_wall / 1e6,
            "cpu_seconds": best_cpu, "cpu_mb_per_s": total * repeat / best_cpu / 1e6,
            "load_avg_1min": os.getloadavg()[0], "load_avg_1min_before": load_before}


def fuzz(n: int) -> dict[str, float]:
    count = {"cases": 0, "errors": 0}

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated())
    def run(text: str) -> None:
        count["cases"] += 1
        try:
            analyze_ptx(text, "f.ptx")
        except ValueError:
            count["errors"] += 1
        check_clean(text)  # re-raises anything that is not a clean one-line ValueError

    t0 = time.perf_counter()
    run()
    return {"cases": count["cases"], "clean_errors": count["errors"], "other_exceptions": 0,
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--fuzz", type=int, default=10_000)
    a = ap.parse_args()
    tp = throughput(a.repeat)
    fz = fuzz(a.fuzz)
    out = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "throughput": tp, "fuzz": fz, "target_mb_per_s": 20.0}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "ptx.json").write_text(json.dumps(out, indent=1))
    md = ["# PTX benchmark", "", "| metric | value |", "| --- | --- |",
          f"| corpus modules | {tp['modules']} ({tp['corpus_bytes'] / 1e3:.0f} kB) |",
          f"| parse + analyse, wall | {tp['mb_per_s']:.1f} MB/s (target 20; best of {tp['rounds']}) |",
          f"| parse + analyse, CPU time | {tp['cpu_mb_per_s']:.1f} MB/s |",
          f"| 1-min load average before / after (2 cores, shared) | {tp['load_avg_1min_before']:.2f} / "
          f"{tp['load_avg_1min']:.2f} |",
          f"| fuzz cases | {fz['cases']} |",
          f"| clean one-line errors | {fz['clean_errors']} |",
          f"| other exceptions | {fz['other_exceptions']} |",
          f"| fuzz time | {fz['seconds']:.0f} s |", ""]
    (res / "ptx.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
