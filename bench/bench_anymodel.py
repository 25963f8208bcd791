"""Real published configs (tests/capture/configs): capture time, peak memory and weight bytes against an
independent parameter count (target: every config <= 60 s, < 4 GB; weights within 1%).

Each capture runs in a fresh process so its peak RSS is its own; the same process then builds the model
on the meta device with plain transformers and counts its parameters × the bytes the checkpoint stores
them in (bf16 2; fp8 1 + an fp32 scale per 128×128 block for matrices and expert stacks but embeddings,
norms, MoE routers and lm_head, plus a bf16 copy of an fp8 MLA kv_b_proj, the absorbed W_UK / W_UV; mxfp4
0.5 + 1/32 for expert weights). A text-only step of a vision-language model touches the
language model and lm_head, so only those are counted. Shape: decode, 32 sequences at 2048 context
(32·top-k token-slots reach every expert of every MoE config here).
Writes bench/results/anymodel.json and anymodel.md. Run: .venv/bin/python bench/bench_anymodel.py [NAME ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parent.parent / "tests" / "capture" / "configs"
SHAPE = {"batch": 32, "context": 2048}
CHILD = """
import json, resource, sys, torch
from tessera.capture import capture_model, summarize
path, kw = sys.argv[1], json.loads(sys.argv[2])
g = capture_model(path, "decode", **kw)
s = summarize(g)
s["eager_kernels"] = g.meta["eager_kernels"]
s["fused_moe"] = sum(k.name.startswith("fused_moe[") for k in g.kernels)
s["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
_ru = resource.getrusage(resource.RUSAGE_SELF)
s["cpu_s"] = _ru.ru_utime + _ru.ru_stime  # the process's CPU time so far: imports + capture
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
cfg = json.load(open(path))
conf = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                  if k not in ("model_type", "quantization_config")})
auto = AutoModelForImageTextToText if "vision_config" in cfg else AutoModelForCausalLM
with torch.device("meta"):
    model = auto.from_config(conf)
if "vision_config" in cfg:
    model = torch.nn.ModuleDict({"lm": model.model.language_model, "head": model.lm_head})
qm = (cfg.get("quantization_config") or {}).get("quant_method")
expected = 0.0
for name, p in model.named_parameters():
    if qm == "fp8" and p.dim() > 1 and not any(x in name for x in ("lm_head", "embed", "norm", "mlp.gate.")):
        expected += p.numel() * (1 + 4 / (128 * 128))
        if "kv_b_proj" in name:  # MLA: the bf16 W_UK / W_UV an engine derives from it for absorbed decode
            expected += p.numel() * 2
    elif qm == "mxfp4" and ".experts." in name and p.dim() == 3:
        expected += p.numel() * (0.5 + 1 / 32)
    else:
        expected += p.numel() * 2
s["params"] = sum(p.numel() for p in model.parameters())
s["expected_weight_bytes"] = int(expected)
print(json.dumps(s))
"""


def run_one(path: Path) -> dict[str, object]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(SHAPE)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall_s = time.perf_counter() - t0
    row: dict[str, object] = {"config": path.stem, **SHAPE, "wall_s": round(wall_s, 2)}
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return row
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    row.update({k: s[k] for k in ("kernels", "eager_kernels", "fused_moe", "layers", "flops", "weight_bytes", "expected_weight_bytes", "kv_bytes",
                                  "state_bytes", "capture_s", "cpu_s", "params")})
    row["kinds"] = {k: v["kernels"] for k, v in s["by_kind"].items()}
    row["weight_error"] = round(s["weight_bytes"] / s["expected_weight_bytes"] - 1, 5)
    row["peak_rss_gb"] = round(s["peak_rss_kb"] * 1024 / 1e9, 3)
    return row


# `tessera plan` end to end on the two big MoE/MLA models, each on a pool that holds it
PLANS = (("Qwen--Qwen3-30B-A3B", "H100,L40S"), ("deepseek-ai--DeepSeek-V3", ",".join(["H200"] * 8)))


def run_plan(config: str, gpus: str) -> dict[str, object]:
    """Wall time and peak RSS of ``tessera plan CONFIG --gpus GPUS --json`` (capture included), the load
    average around it, and each strategy's goodput."""
    exe = Path(sys.executable).parent / "tessera"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", str(exe), "plan", str(CONFIGS / f"{config}.json"),
                           "--gpus", gpus, "--json"], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TESSERA_PROGRESS": "lines"})
    row: dict[str, object] = {"config": config, "gpus": gpus, "wall_s": round(time.perf_counter() - t0, 1),
                              "loadavg_before": round(load, 2), "loadavg_after": round(os.getloadavg()[0], 2),
                              "rc": proc.returncode,
                              "peak_rss_gb": round(int(proc.stderr.strip().splitlines()[-1]) * 1024 / 1e9, 3)}
    row["progress"] = [ln for ln in proc.stderr.splitlines() if ln.startswith("plan ")]
    if proc.returncode == 0:
        got = json.loads(proc.stdout)
        row["chosen"], row["solve_s"] = got["chosen"], got["solve_s"]
        row["strategies"] = {n: {"goodput_tokens_per_s": v["goodput_tokens_per_s"], "batch": v["batch"],
                                 "microbatches": v["microbatches"], "tp": v["tp"], "reason": v["reason"]}
                             for n, v in got["strategies"].items()}
    else:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-2:][0][:200]
    return row


def main() -> None:
    only = sys.argv[1:]
    if only == ["--plans"]:
        plans(Path(__file__).parent / "results")
        return
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    # named configs: their rows are re-measured, the other rows of anymodel.json are kept
    kept = {r["config"]: r for r in json.loads((out / "anymodel.json").read_text())["rows"]} if only else {}
    rows = []
    for p in sorted(CONFIGS.glob("*.json")):
        if only and p.stem not in only:
            if p.stem in kept:
                rows.append(kept[p.stem])
            continue
        rows.append({**run_one(p), "loadavg": os.getloadavg()[0]})
        print(json.dumps(rows[-1]), flush=True)
    write(out, rows, load_before)


def plans(out: Path) -> None:
    """Re-measure the plan rows; the trace rows of anymodel.json are kept."""
    data = json.loads((out / "anymodel.json").read_text())
    data["plans"] = []
    for config, gpus in PLANS:
        data["plans"].append(run_plan(config, gpus))
        print(json.dumps(data["plans"][-1]), flush=True)
    (out / "anymodel.json").write_text(json.dumps(data, indent=1))
    write(out, data["rows"], tuple(data["loadavg_before"]), data["plans"])


def write(out: Path, rows: list[dict[str, Any]], load_before: tuple[float, ...],
          plan_rows: list[dict[str, Any]] | None = None) -> None:
    """anymodel.json and anymodel.md from the rows (also used to merge rows of an interrupted run)."""
    if plan_rows is None and (out / "anymodel.json").exists():
        plan_rows = json.loads((out / "anymodel.json").read_text()).get("plans")
    result = {"shape": SHAPE, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "rows": rows,
              "plans": plan_rows or []}
    (out / "anymodel.json").write_text(json.dumps(result, indent=1))
    lines = [f"decode {SHAPE['batch']}×{SHAPE['context']}; 1-min load average before {load_before[0]:.1f}, after "
             f"{os.getloadavg()[0]:.1f}; per row in anymodel.json (2 cores, shared with other work). kernels: the "
             "fused view (one fused MoE kernel per MoE layer); eager: one per ATen operator (`--eager`)", "",
             "capture s: wall time of the capture call; CPU s: the child's CPU time through the capture, imports "
             "included (on a loaded machine wall time is mostly waiting for a core)", "",
             "| config | kernels | eager | fused MoE | weights GB | expected GB | error | capture s | CPU s | wall s "
             "| peak RSS GB | load |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error']} | | | | | | | | {r['wall_s']} | | |")
            continue
        lines.append(f"| {r['config']} | {r['kernels']} | {r.get('eager_kernels', '')} | {r.get('fused_moe', '')} | "
                     f"{r['weight_bytes'] / 1e9:.2f} | {r['expected_weight_bytes'] / 1e9:.2f} | "
                     f"{100 * r['weight_error']:+.2f}% | {r['capture_s']:.1f} | {r.get('cpu_s', 0):.1f} | {r['wall_s']} | {r['peak_rss_gb']} | "
                     f"{r.get('loadavg', 0):.1f} |")
    lines += plan_table(plan_rows or [])
    (out / "anymodel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plan_table(plan_rows: list[dict[str, Any]]) -> list[str]:
    if not plan_rows:
        return []
    lines = ["", "`tessera plan CONFIG --gpus GPUS` end to end (capture included; `bench_anymodel.py --plans`)", "",
             "| config | GPUs | wall s | peak RSS GB | load before / after | chosen | goodput tok/s by strategy |",
             "| --- | --- | ---: | ---: | --- | --- | --- |"]
    for r in plan_rows:
        good = ", ".join(f"{n} {v['goodput_tokens_per_s']:,.0f}" for n, v in r.get("strategies", {}).items())
        lines.append(f"| {r['config']} | {r['gpus']} | {r['wall_s']} | {r['peak_rss_gb']} | "
                     f"{r['loadavg_before']} / {r['loadavg_after']} | {r.get('chosen', r.get('error', ''))} | {good} |")
    return lines


if __name__ == "__main__":
    main()
