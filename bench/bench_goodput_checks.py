"""Issue #31's single-plan checks: Tessera's plan against the simulator's SLO knee of that very plan.

- llama-3-70b on H100 + A100 at 1024/256: the planner's goodput within 10% of the knee;
- mixtral-8x7b on H100 + L40S at a 6,144-token prompt: feasible (or refused naming a binding constraint),
  with the prompt's prefill FLOPs beside it as a roofline (one prompt's prefill on the H100 at its peak).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_goodput_checks.py
writes bench/results/goodput_checks.json and goodput_checks.md (load average recorded per row).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tessera.errors import UserError
from tessera.hardware import catalog
from tessera.plan import PlannerConfig, plan_serving
from tessera.plan.model.serving import Traffic
from tessera.study.agreement import knee_check

OUT = Path(__file__).resolve().parent / "results"
CHECKS = (("llama-3-70b", "H100,A100", 1024, 256), ("mixtral-8x7b", "H100,L40S", 6144, 256))
MIXTRAL_ACTIVE_PARAMS = 12.9e9  # 2 of 8 experts per token plus attention and embeddings (Mixtral's paper)


def check(model: str, pool: str, prompt: int, output: int) -> dict:
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    cfg = PlannerConfig(traffic=Traffic(prompt=prompt, output=output))
    try:
        r = plan_serving(model, pool, cfg)
    except UserError as e:
        return {"model": model, "pool": pool, "prompt": prompt, "output": output, "refused": str(e)}
    t = r.tessera
    k = knee_check(t.deployment, t.goodput) if t.feasible else None
    return {"model": model, "pool": pool, "prompt": prompt, "output": output, "chosen": t.chosen,
            "feasible": t.feasible, "reason": t.reason, "goodput_tok_s": t.goodput,
            "batch": t.point.batch if t.point else None, "microbatches": t.point.microbatches if t.point else None,
            "budget": t.point.budget if t.point else None, "ttft_s": t.point.ttft_s if t.point else None,
            "knee_tok_s": k.knee_per_s if k else None, "ratio": k.ratio if k else None,
            "wall_s": time.perf_counter() - t0, "load_before": load0, "load_after": os.getloadavg()[0]}


def main() -> None:
    rows = [check(*c) for c in CHECKS]
    h100 = catalog.gpu("H100-SXM")
    flop = 2 * MIXTRAL_ACTIVE_PARAMS * 6144
    roof = {"prefill_tflop": flop / 1e12, "h100_peak_tflops": h100.peak_flops_per_s["bf16"] / 1e12,
            "prefill_s_at_peak": flop / h100.peak_flops_per_s["bf16"]}
    OUT.mkdir(exist_ok=True)
    (OUT / "goodput_checks.json").write_text(json.dumps({"checks": rows, "mixtral_6144_roofline": roof}, indent=1))
    lines = ["# Tessera's plan against the simulator's knee of that plan", "",
             "Command: `OMP_NUM_THREADS=1 .venv/bin/python bench/bench_goodput_checks.py`. SLO TTFT ≤ 2 s, "
             "TPOT ≤ 100 ms, 90% of requests; the knee by bisection over simulated Poisson runs.", "",
             "| model | pool | prompt / output | Tessera | batch × m, tokens/iter | planner tok/s | "
             "simulator knee tok/s | knee / planner | load |", "|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        if "refused" in x:
            lines.append(f"| {x['model']} | {x['pool']} | {x['prompt']} / {x['output']} | refused: {x['refused']} "
                         "| | | | | |")
            continue
        lines.append(f"| {x['model']} | {x['pool']} | {x['prompt']} / {x['output']} | {x['chosen']} | "
                     f"{x['batch']} × {x['microbatches']}, {x['budget']} | {x['goodput_tok_s']:,.1f} | "
                     f"{x['knee_tok_s'] or 0:,.1f} | {x['ratio'] or 0:.2f} | "
                     f"{x['load_before']:.1f} → {x['load_after']:.1f} |")
    lines += ["", f"Roofline for the 6,144-token Mixtral prompt: 2 × {MIXTRAL_ACTIVE_PARAMS / 1e9:.1f} B active "
              f"parameters × 6,144 tokens = {roof['prefill_tflop']:.0f} TFLOP, {roof['prefill_s_at_peak']:.2f} s "
              f"on one H100 at its {roof['h100_peak_tflops']:.0f} TFLOP/s peak: a TTFT of 2 s is within reach, "
              "so the plan should be feasible, as it is."]
    (OUT / "goodput_checks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
