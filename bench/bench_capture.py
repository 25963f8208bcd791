"""Capture time and peak memory of every zoo model and phase (target: <= 60 s, < 4 GB each), and kernel
counts of the eager (one per ATen operator) and the production-fused view (the default capture).

Each capture runs in a fresh process so its peak RSS is its own. Writes bench/results/capture.json and
capture.md. Run: .venv/bin/python bench/bench_capture.py [MODEL ...]  (named models only: their rows are
re-measured, the other rows of capture.json are kept)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Serving-like shapes: prefill 8×512, decode 32 sequences at 2048 context, Flux 1024² image (4096 tokens),
# vision encode of 8 images of 448² (1024 patches each); a VL prefill prompt holds one such image.
SHAPES = {"prefill": {"batch": 8, "seq": 512}, "decode": {"batch": 32, "context": 2048},
          "denoise": {"batch": 1, "seq": 4096, "context": 512}, "encode": {"batch": 8, "seq": 1024}}
CHILD = """
import json, resource, sys
from tessera.capture import summarize
from tessera.capture.core import fused_view, record
name, phase, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
eager, rec, _ = record(name, phase, real=False, **{"seq": None, "context": None, **kw})
fused = fused_view(eager, rec)
s = summarize(fused)
s["eager_bytes"] = eager.bytes_read + eager.bytes_written
s["eager_flops"], s["eager_weight_bytes"] = eager.flops, summarize(eager)["weight_bytes"]
s["fuse_s"] = fused.meta["capture_s"] - eager.meta["capture_s"]
s["max_kernels_per_layer"] = max((len(ks) for lay, ks in fused.by_layer().items() if lay is not None), default=0)
s["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
print(json.dumps(s))
"""


def run_one(name: str, phase: str) -> dict[str, object]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, name, phase, json.dumps(SHAPES[phase])],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall_s = time.perf_counter() - t0
    row: dict[str, object] = {"model": name, "phase": phase, **SHAPES[phase], "wall_s": round(wall_s, 2)}
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update({k: s[k] for k in ("kernels", "eager_kernels", "max_kernels_per_layer", "layers", "flops",
                                  "weight_bytes", "kv_bytes", "capture_s", "fuse_s")})
    row["bytes_fused_over_eager"] = round((s["bytes_read"] + s["bytes_written"]) / s["eager_bytes"], 4)
    # the fused view must not change what a step computes or which weights it reads
    row["same_flops_and_weights"] = s["flops"] == s["eager_flops"] and s["weight_bytes"] == s["eager_weight_bytes"]
    row["loadavg_1m"] = round(os.getloadavg()[0], 2)
    row["peak_rss_gb"] = round(s["peak_rss_kb"] * 1024 / 1e9, 3)
    return row


def main() -> None:
    from tessera.capture import SPECS, model_phases

    only = sys.argv[1:]
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    kept = {(r["model"], r["phase"]): r for r in json.loads((out / "capture.json").read_text())} if only else {}
    rows = [run_one(n, p) if not only or n in only else kept[(n, p)]
            for n in SPECS for p in model_phases(n) if not only or n in only or (n, p) in kept]
    (out / "capture.json").write_text(json.dumps(rows, indent=1))
    lines = ["Kernels: the fused view (default); eager: one per ATen operator; per layer: the fused view's most in "
             "one layer; bytes: fused/eager bytes moved; load: 1-minute load average at the row.", "",
             "| model | phase | kernels | eager | per layer | bytes f/e | layers | TFLOP | weights GB | capture s "
             "| fuse s | wall s | peak RSS GB | load |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['phase']} | error: {r['error']} | | | | | | | | | {r['wall_s']} | | |")
            continue
        lines.append(f"| {r['model']} | {r['phase']} | {r['kernels']} | {r['eager_kernels']} | "
                     f"{r['max_kernels_per_layer']} | {r['bytes_fused_over_eager']:.3f} | {r['layers']} | "
                     f"{r['flops'] / 1e12:.3f} | {r['weight_bytes'] / 1e9:.2f} | {r['capture_s']:.2f} | "
                     f"{r['fuse_s']:.3f} | {r['wall_s']} | {r['peak_rss_gb']} | {r['loadavg_1m']} |")
    (out / "capture.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
