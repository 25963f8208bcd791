"""Capture time and peak memory of every zoo model and phase (target: <= 60 s, < 4 GB each).

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
from tessera.capture import capture_model, summarize
name, phase, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = summarize(capture_model(name, phase, **kw))
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
    row.update({k: s[k] for k in ("kernels", "layers", "flops", "weight_bytes", "kv_bytes", "capture_s")})
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
    lines = ["| model | phase | kernels | layers | TFLOP | weights GB | capture s | wall s | peak RSS GB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['phase']} | error: {r['error']} | | | | | {r['wall_s']} | |")
            continue
        lines.append(f"| {r['model']} | {r['phase']} | {r['kernels']} | {r['layers']} | {r['flops'] / 1e12:.3f} | "
                     f"{r['weight_bytes'] / 1e9:.2f} | {r['capture_s']:.2f} | {r['wall_s']} | {r['peak_rss_gb']} |")
    (out / "capture.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
