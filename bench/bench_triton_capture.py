"""Triton capture benchmark: `tessera trace <model>-liger` with a cold and a warm PTX cache.

    .venv/bin/python bench/bench_triton_capture.py [--model llama-3-8b-liger] [--phase decode]

Each run is a fresh `tessera trace ... --json` process (imports, model build, capture, PTX compile or cache
look-up, analysis, fusion). Cold: empty tessera and Triton caches (every specialisation compiled); warm:
the same caches again (nothing compiled). Writes bench/results/triton_capture.json and .md (another
model: triton_capture_<model>.json and .md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def trace_once(model: str, phase: str, env: dict[str, str]) -> dict[str, object]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tessera", "trace", model, "--phase", phase, "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    wall_s = time.perf_counter() - t0
    s = json.loads(out.strip().splitlines()[-1])
    return {"wall_s": round(wall_s, 2), "capture_s": s["capture_s"], "kernels": s["kernels"],
            "deps_from": s["deps_from"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-8b-liger")
    ap.add_argument("--phase", default="decode")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TESSERA_PTX_CACHE": f"{tmp}/ptx", "TRITON_CACHE_DIR": f"{tmp}/triton",
               "OMP_NUM_THREADS": "1"}
        load = os.getloadavg()
        cold = trace_once(a.model, a.phase, env)
        specialisations = len(list(Path(f"{tmp}/ptx").glob("*.ptx")))
        warm = trace_once(a.model, a.phase, env)
    result = {"model": a.model, "phase": a.phase, "cold": cold, "warm": warm,
              "specialisations_compiled": specialisations, "loadavg": load, "machine": platform.machine(),
              "cpus": os.cpu_count()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "triton_capture" if a.model == "llama-3-8b-liger" else f"triton_capture_{a.model}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [f"# `tessera trace {a.model} --phase {a.phase}`: Triton launches with PTX dependencies", "",
          "| cache | wall s (process) | capture s | kernels | deps from PTX / schema |", "|---|---|---|---|---|"]
    for name, r in (("cold", cold), ("warm", warm)):
        d = r["deps_from"]
        md.append(f"| {name} | {r['wall_s']} | {r['capture_s']} | {r['kernels']} | {d['ptx']} / {d['schema']} |")
    md += ["", f"{specialisations} PTX specialisations compiled on the cold run (one per distinct kernel "
           f"launch signature; every layer reuses them). Load average before: {load[0]:.2f} "
           f"({os.cpu_count()} CPUs)."]
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
