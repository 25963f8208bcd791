"""Real published configs (tests/capture/configs): capture time, peak memory and weight bytes against an
independent parameter count (target: every config <= 60 s, < 4 GB; weights within 1%).

Each capture runs in a fresh process so its peak RSS is its own; the same process then builds the model
on the meta device with plain transformers and counts its parameters × the bytes the checkpoint stores
them in (bf16 2; fp8 1 + an fp32 scale per 128×128 block for matrices and expert stacks but embeddings,
norms, MoE routers and lm_head; mxfp4 0.5 + 1/32 for expert weights). A text-only step of a vision-language model touches the
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

CONFIGS = Path(__file__).parent.parent / "tests" / "capture" / "configs"
SHAPE = {"batch": 32, "context": 2048}
CHILD = """
import json, resource, sys, torch
from tessera.capture import capture_model, summarize
path, kw = sys.argv[1], json.loads(sys.argv[2])
s = summarize(capture_model(path, "decode", **kw))
s["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
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
    row.update({k: s[k] for k in ("kernels", "layers", "flops", "weight_bytes", "expected_weight_bytes", "kv_bytes",
                                  "state_bytes", "capture_s", "params")})
    row["kinds"] = {k: v["kernels"] for k, v in s["by_kind"].items()}
    row["weight_error"] = round(s["weight_bytes"] / s["expected_weight_bytes"] - 1, 5)
    row["peak_rss_gb"] = round(s["peak_rss_kb"] * 1024 / 1e9, 3)
    return row


def main() -> None:
    only = sys.argv[1:]
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


def write(out: Path, rows: list[dict[str, object]], load_before: tuple[float, float, float]) -> None:
    """anymodel.json and anymodel.md from the rows (also used to merge rows of an interrupted run)."""
    result = {"shape": SHAPE, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "rows": rows}
    (out / "anymodel.json").write_text(json.dumps(result, indent=1))
    lines = [f"decode {SHAPE['batch']}×{SHAPE['context']}; 1-min load average before {load_before[0]:.1f}, after "
             f"{os.getloadavg()[0]:.1f}; per row in anymodel.json (2 cores, shared with other work)", "",
             "| config | kernels | moe_routing | weights GB | expected GB | error | capture s | wall s | peak RSS GB | load |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error']} | | | | | | {r['wall_s']} | |")
            continue
        lines.append(f"| {r['config']} | {r['kernels']} | {r['kinds'].get('moe_routing', 0)} | "
                     f"{r['weight_bytes'] / 1e9:.2f} | {r['expected_weight_bytes'] / 1e9:.2f} | "
                     f"{100 * r['weight_error']:+.2f}% | {r['capture_s']:.1f} | {r['wall_s']} | {r['peak_rss_gb']} | "
                     f"{r.get('loadavg', '')} |")
    (out / "anymodel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
