"""PTX stage benchmark: parse + analyse throughput over the corpus, and a >= 10,000-case fuzz run.

    .venv/bin/python bench/bench_ptx.py [--repeat 20] [--fuzz 10000] [--rounds 7]

Both paths are timed in one run: the default, accelerated path (tessera/ptx/fast.py over the C module
_fastscan.c, built by `make install`) and the pure-Python reference path, which give the same results
(tests/ptx/test_ptx_differential.py). Throughput is reported in wall time and in process CPU time; on this
shared machine CPU time is the fair figure, so both are recorded with the load average.

Writes bench/results/ptx.json and bench/results/ptx.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ptx"))

from test_ptx_fuzz import check_clean, mutated  # noqa: E402

from tessera.ptx.analysis import Access, accelerated, analyze_ptx, reference_path  # noqa: E402

CORPUS = ROOT / "tests" / "ptx" / "corpus"


def _path(native: bool) -> AbstractContextManager[None]:
    """The accelerated path (fast.py and the C module) on, or the pure-Python reference path."""
    return nullcontext() if native else reference_path()


def throughput(repeat: int, rounds: int = 7) -> dict[str, object]:
    """Every corpus module parsed and analysed ``repeat`` times per round, both paths in alternate rounds
    (so a slow spell of this shared machine hits both); best of ``rounds`` rounds each, in wall-clock and
    in process CPU time (CPU time is less disturbed by other processes, wall time is what a user waits)."""
    files = [(str(p), p.read_text()) for p in sorted(CORPUS.glob("*/*.ptx"))]
    total = sum(len(t) for _, t in files)
    paths = ["native", "python"] if accelerated() else ["python"]
    best = {m: [float("inf"), float("inf")] for m in paths}
    load_before = os.getloadavg()[0]
    for _ in range(rounds):
        for mode in paths:
            with _path(mode == "native"):
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(repeat):
                    for name, text in files:
                        analyze_ptx(text, name)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            best[mode] = [min(best[mode][0], wall), min(best[mode][1], cpu)]
    per = {m: {"seconds": w, "mb_per_s": total * repeat / w / 1e6, "cpu_seconds": c,
               "cpu_mb_per_s": total * repeat / c / 1e6} for m, (w, c) in best.items()}
    return {"modules": len(files), "corpus_bytes": total, "repeat": repeat, "rounds": rounds,
            "default_path": paths[0], "paths": per, "mb_per_s": per[paths[0]]["mb_per_s"],
            "native_over_python": (per["python"]["seconds"] / per["native"]["seconds"]) if "native" in per else None,
            "load_avg_1min": os.getloadavg()[0], "load_avg_1min_before": load_before}


def corpus_accuracy(native: bool) -> dict[str, int]:
    """Parameters classified exactly as labelled by hand (tests/ptx/corpus/labels.json), and accesses
    missed (a true read or write the report lacks), over every entry of every corpus module."""
    labels = json.loads((CORPUS / "labels.json").read_text())
    exact = total = missed = 0
    with _path(native):
        for f in sorted(CORPUS.glob("*/*.ptx")):
            target = f.parent.name
            for name, e in analyze_ptx(f.read_text(), str(f)).items():
                want = labels[name].get(target, labels[name]["params"])
                truth = labels[name].get("truth", want)
                for p, w, t in zip(e.params, want, truth, strict=True):
                    total += 1
                    exact += str(p.access) == w
                    missed += (Access(t).writes and not p.access.writes) or (Access(t).reads and not p.access.reads)
    return {"params": total, "exact": exact, "missed": missed}


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
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per path; the best one counts")
    a = ap.parse_args()
    tp = throughput(a.repeat, a.rounds)
    acc = {mode: corpus_accuracy(mode == "native") for mode in tp["paths"]}  # type: ignore[union-attr]
    fz = fuzz(a.fuzz)
    out = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "throughput": tp, "corpus": acc, "fuzz": fz, "target_mb_per_s": 20.0}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "ptx.json").write_text(json.dumps(out, indent=1))
    paths = tp["paths"]
    md = ["# PTX benchmark", "", "| metric | value |", "| --- | --- |",
          f"| corpus modules | {tp['modules']} ({tp['corpus_bytes'] / 1e3:.0f} kB) |"]
    for mode, r in paths.items():
        what = "accelerated path, C module (default)" if mode == "native" else "reference path, pure Python" + (
            "" if "native" in paths else " (C module not built)")
        md.append(f"| parse + analyse, {what} | {r['mb_per_s']:.1f} MB/s wall, {r['cpu_mb_per_s']:.1f} MB/s CPU "
                  f"(target 20; best of {tp['rounds']}) |")
    for mode, r in acc.items():
        md.append(f"| corpus parameters exact, {'accelerated' if mode == 'native' else 'reference'} path | {r['exact']} / {r['params']} "
                  f"({100 * r['exact'] / r['params']:.0f}%), missed accesses {r['missed']} |")
    if tp["native_over_python"] is not None:
        md.append(f"| native / pure Python, same run | {tp['native_over_python']:.2f}x |")
    md += [f"| 1-min load average before / after (2 cores, shared) | {tp['load_avg_1min_before']:.2f} / "
           f"{tp['load_avg_1min']:.2f} |",
           f"| fuzz cases (default path) | {fz['cases']} |",
           f"| clean one-line errors | {fz['clean_errors']} |",
           f"| other exceptions | {fz['other_exceptions']} |",
           f"| fuzz time | {fz['seconds']:.0f} s |", ""]
    (res / "ptx.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
