"""Cost-model accuracy: leave-one-GPU-out on the shipped Vidur profiles, and a CPU decode step.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cost.py
Writes bench/results/cost_accuracy.json and cost_accuracy.md.
GPU targets (issue 3): median APE <= 12 % on each GEMM operator, <= 25 % overall (tp = 1).
CPU target: a tiny-Llama decode step predicted from CPU kernel profiles within 15 % of its measured time
(the profile is taken at batch sizes 1, 2, 4, 8; the steps checked are batch 3 and 6, not profiled).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from tessera.capture import capture_program
from tessera.cost import CostModel
from tessera.cost.calibrate import fit_kernels, validate
from tessera.cost.profiler import profile_model, time_step
from tessera.cost.profiles import GEMM_OPS, load_profiles
from tessera.hardware import gpu

OUT = Path(__file__).parent / "results"


def cpu_decode(model: str = "llama-tiny", profile_batches: tuple[int, ...] = (1, 2, 4, 8),
               check_batches: tuple[int, ...] = (3, 6), context: int = 32) -> dict:
    torch.set_num_threads(1)
    timings = profile_model(model, batches=profile_batches, context=context, repeats=30)
    cm = CostModel(per_gpu={"cpu": fit_kernels(timings)})
    rows = []
    for b in check_batches:
        cap = capture_program(model, "decode", batch=b, context=context)
        measured_s = time_step(cap, repeats=50)
        predicted_s = sum(cm.kernel_time_s(k, gpu("cpu")) for k in cap.graph.kernels)
        rows.append({"batch": b, "context": context, "kernels": len(cap.graph.kernels), "measured_s": measured_s,
                     "predicted_s": predicted_s, "rel_error": predicted_s / measured_s - 1})
    return {"model": model, "profiled_batches": list(profile_batches), "threads": 1, "steps": rows}


def main() -> None:
    loo = validate(load_profiles()).to_dict()
    gemm_ok = all(loo["ops"][op]["median_ape"] <= 0.12 for op in GEMM_OPS)
    cpu = cpu_decode()
    result = {"leave_one_gpu_out": loo, "targets": {"gemm_median_ape_le_0.12": gemm_ok,
              "overall_median_ape_le_0.25": loo["overall"]["median_ape"] <= 0.25,
              "cpu_step_within_0.15": all(abs(r["rel_error"]) <= 0.15 for r in cpu["steps"])},
              "cpu_decode": cpu, "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cost_accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Cost model accuracy", "", "Leave-one-GPU-out on the shipped Vidur profiles (A100-80GB-SXM, H100-SXM; "
             "tp=1, all token counts): fit on one GPU, predict the other from its datasheet.", "",
             "| operator | median APE | p90 APE | points |", "| --- | ---: | ---: | ---: |"]
    for op, s in [*loo["ops"].items(), ("**overall**", loo["overall"])]:
        lines.append(f"| {op} | {s['median_ape']:.1%} | {s['p90_ape']:.1%} | {s['points']} |")
    lines += ["", f"CPU decode step ({cpu['model']}, 1 thread, profiled at batch {cpu['profiled_batches']}):", "",
              "| batch | kernels | measured ms | predicted ms | error |", "| ---: | ---: | ---: | ---: | ---: |"]
    for r in cpu["steps"]:
        lines.append(f"| {r['batch']} | {r['kernels']} | {r['measured_s'] * 1e3:.3f} | {r['predicted_s'] * 1e3:.3f} "
                     f"| {r['rel_error']:+.1%} |")
    lines += ["", f"Targets: {result['targets']}", "", "Command: `OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cost.py`"]
    (OUT / "cost_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
