"""Runtime benchmark: pipelining speed-up (m micro-batches vs 1) and measured vs predicted step time.

Two CPU workers, one thread each, a balanced layer split of a 4-layer tiny Llama (prefill-heavy so
compute dominates). Writes bench/results/runtime.json and runtime.md. Run when the machine is quiet:
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_runtime.py
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tessera.capture.zoo import SPECS
from tessera.runtime.api import RunSpec, run
from tessera.runtime.placements import layer_split
from tessera.runtime.steps import Job, capture_steps

OUT = Path(__file__).parent / "results"


def main() -> None:
    tmp = Path(tempfile.mkdtemp()) / "llama4"
    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps(dict(SPECS["llama-tiny"].config, num_hidden_layers=4,
                                                     hidden_size=256, intermediate_size=1024)))
    job = Job(model=str(tmp / "config.json"), batch=2, seq=128, new_tokens=2)
    programs = capture_steps(job)
    plan = {ph: layer_split(programs[key].graph, 2) for ph, key in (("prefill", "prefill"),
                                                                   ("decode", f"decode@{job.seq}"))}
    load = os.getloadavg()
    rows = []
    for m in (1, 2, 4):
        out = run(RunSpec(job=job, devices=("cpu", "cpu"), plans={"latency": plan, "throughput": plan},
                          microbatches=m, requests=4 * m), programs)
        rows.append({k: out[k] for k in ("microbatches", "verified", "measured_step_s", "predicted_step_s",
                                         "throughput_tokens_per_s", "link_bytes", "overlap")})
    base = rows[0]["throughput_tokens_per_s"]
    for r in rows:
        r["speedup_vs_m1"] = r["throughput_tokens_per_s"] / base
        r["predicted_error"] = r["measured_step_s"] / r["predicted_step_s"] - 1
    OUT.mkdir(exist_ok=True)
    res = {"model": "llama 4 layers, hidden 256", "batch_per_microbatch": job.batch, "seq": job.seq,
           "placement": "layer_split", "loadavg_before": load, "loadavg_after": os.getloadavg(), "rows": rows}
    (OUT / "runtime.json").write_text(json.dumps(res, indent=1))
    lines = ["| m | verified | step ms (measured) | step ms (predicted) | error | tokens/s | speed-up vs m=1 | overlap |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['microbatches']} | {r['verified']} | {r['measured_step_s'] * 1e3:.2f} | "
                     f"{r['predicted_step_s'] * 1e3:.2f} | {r['predicted_error']:+.0%} | "
                     f"{r['throughput_tokens_per_s']:.0f} | {r['speedup_vs_m1']:.2f}x | {r['overlap']:.0%} |")
    lines.append(f"\nload average before/after: {load[0]:.2f} / {os.getloadavg()[0]:.2f} (2 cores)")
    (OUT / "runtime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
