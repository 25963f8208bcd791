"""Whole-step check against a peer: Tessera's predicted step time beside NVIDIA AIConfigurator's estimate.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cost_peer.py [--aic-cli PATH]
Writes bench/results/cost_peer.json and cost_peer.md.

Peer: `aiconfigurator cli estimate --backend vllm` (bf16, TP1) with --estimate-mode static_gen (decode: the
TPOT of one step at batch B, ISL 1024) and static_ctx (prefill: the TTFT of B prompts of 1024 tokens). The
aiconfigurator package is not a Tessera dependency: install it in a throw-away venv
(python -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator) and pass its CLI with --aic-cli
(or AIC_CLI). Qwen2.5-7B's config is not bundled with aiconfigurator: it is given the zoo's config as a
local model directory.

Tessera side: the model captured in the production-fused view (capture's default: each chain of
elementwise, norm and copy operators between two anchor kernels is one kernel, one launch plus its external
bytes), each kernel priced by tessera.cost.default_cost_model() and summed (serial execution, no overlap). A
second column sums only the anchor kernels (GEMM, attention, embedding), the kernels the
measured tables price.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tessera.capture import capture_model
from tessera.capture.zoo import resolve
from tessera.cost import default_cost_model
from tessera.graph import KernelKind
from tessera.hardware import gpu

OUT = Path(__file__).parent / "results"
MODELS = {"llama-3-8b": "meta-llama/Meta-Llama-3.1-8B", "qwen2.5-7b": None,  # None: the zoo config, local
          "mixtral-8x7b": None}
GPUS = {"H100-SXM": "h100_sxm", "H200": "h200_sxm", "A100-80GB-SXM": "a100_sxm", "L40S": "l40s"}
BATCHES = (1, 16, 64)
SEQ = 1024  # prompt length (prefill) and context (decode)
ANCHORS = {KernelKind.GEMM, KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE, KernelKind.EMBEDDING}
HF_ARCH = {"qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM"}


def local_model_dir(zoo: str, root: Path) -> str:
    cfg = dict(resolve(zoo).config)
    cfg.setdefault("architectures", [HF_ARCH[cfg["model_type"]]])
    cfg.setdefault("torch_dtype", "bfloat16")
    d = root / zoo
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def peer_step_s(cli: str, model_path: str, system: str, phase: str, batch: int) -> float | None:
    """Decode: TPOT of static_gen; prefill: TTFT of static_ctx (seconds), or None where the CLI failed."""
    mode = "static_gen" if phase == "decode" else "static_ctx"
    cmd = [cli, "cli", "estimate", "--model-path", model_path, "--system", system, "--backend", "vllm",
           "--estimate-mode", mode, "--batch-size", str(batch), "--isl", str(SEQ), "--osl", "2",
           "--tp-size", "1", *(["--moe-tp-size", "1", "--moe-ep-size", "1"] if "mixtral" in model_path else [])]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    key = "TPOT" if phase == "decode" else "TTFT"
    m = re.search(rf"^\s*{key}:\s*([0-9.,]+) ms", run.stdout, re.M)
    return float(m.group(1).replace(",", "")) * 1e-3 if m else None


def tessera_step_s(zoo: str, phase: str, batch: int) -> dict[str, dict[str, float]]:
    kw = {"context": SEQ} if phase == "decode" else {"seq": SEQ}
    graph = capture_model(zoo, phase, batch=batch, **kw)
    cm = default_cost_model()
    out = {}
    for name in GPUS:
        times = [(k.kind, cm.kernel_time_s(k, gpu(name))) for k in graph.kernels]
        out[name] = {"step_s": sum(t for _, t in times), "anchors_s": sum(t for k, t in times if k in ANCHORS),
                     "kernels": len(times)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aic-cli", default=os.environ.get("AIC_CLI") or shutil.which("aiconfigurator"))
    ap.add_argument("--md-only", action="store_true", help="rewrite cost_peer.md from cost_peer.json")
    args = ap.parse_args()
    if args.md_only:
        write_md(json.loads((OUT / "cost_peer.json").read_text()))
        return
    cli = args.aic_cli
    rows = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for zoo, path in MODELS.items():
            model_path = path or local_model_dir(zoo, Path(tmp))
            for phase in ("decode", "prefill"):
                for b in BATCHES:
                    ours = tessera_step_s(zoo, phase, b)
                    for name, system in GPUS.items():
                        peer = peer_step_s(cli, model_path, system, phase, b) if cli else None
                        r = {"model": zoo, "phase": phase, "batch": b, "seq": SEQ, "gpu": name, **ours[name],
                             "peer_s": peer, "diff": None if peer is None else ours[name]["step_s"] / peer - 1,
                             "anchors_diff": None if peer is None else ours[name]["anchors_s"] / peer - 1}
                        rows.append(r)
                        print(json.dumps(r), flush=True)
    diffs = [abs(r["diff"]) for r in rows if r["diff"] is not None]
    adiffs = [abs(r["anchors_diff"]) for r in rows if r["anchors_diff"] is not None]
    result = {"peer": f"aiconfigurator cli estimate ({cli})" if cli else "unavailable: no aiconfigurator CLI",
              "view": "production-fused capture (capture's default)", "rows": rows,
              "median_abs_diff": statistics.median(diffs) if diffs else None,
              "median_abs_diff_anchors": statistics.median(adiffs) if adiffs else None,
              "wall_s": round(time.time() - t0, 1), "loadavg": os.getloadavg()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cost_peer.json").write_text(json.dumps(result, indent=1) + "\n")
    write_md(result)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.0%}"


def write_md(result: dict) -> None:
    lines = ["# Whole-step time: Tessera vs AIConfigurator", "",
             f"Peer: {result['peer']}, backend vLLM, bf16, TP1, ISL/context {SEQ}. Tessera: {result['view']}, "
             "default cost model, kernels summed. `anchors` = GEMM + attention + embedding kernels only.", "",
             "| model | phase | batch | GPU | kernels | Tessera ms | anchors ms | peer ms | diff | anchors diff |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['phase']} | {r['batch']} | {r['gpu']} | {r['kernels']} | "
                     f"{_ms(r['step_s'])} | {_ms(r['anchors_s'])} | {_ms(r['peer_s'])} | {_pct(r['diff'])} | "
                     f"{_pct(r['anchors_diff'])} |")
    med, amed = result["median_abs_diff"], result["median_abs_diff_anchors"]
    lines += ["", f"Median |difference|: {_pct(med).lstrip('+')} (whole fused step), "
              f"{_pct(amed).lstrip('+')} (anchors only); the eager view (every ATen operator a kernel) was 35 % "
              f"before the fused view became the default. Load average {result['loadavg']}, "
              f"wall {result['wall_s']} s.", "", *EXPLAINED]
    (OUT / "cost_peer.md").write_text("\n".join(lines) + "\n")


EXPLAINED = [
    "## Why they differ (every row over 10 %)", "",
    "Dense models: 8 of 48 rows over 10 % (median 5.5 %, decode 5.0 %, worst +17 %). Mixtral: 17 of 24.", "",
    "- **Dense prefill on L40S (+10 to +17 %; llama b64, qwen b1/16/64) and on A100 at batch 1 (+11 %)**: the "
    "anchors (GEMM, attention, embedding) are within -10 to +1 % of the peer; the rest is the fused norm / "
    "rotary / SiLU-mul kernels, priced as one launch plus their external bytes at the memory-bound efficiency "
    "(10-15 % of a Tessera prefill step, 15 % on L40S whose GDDR6 is the slowest memory here). The peer leaves "
    "0-5 % of its step for them, so it prices those kernels at 3x less or folds them into its GEMM/attention "
    "entries. Where the GPU is fast on memory (H100, H200) the two sides agree within 10 %.",
    "- **Qwen2.5-7B decode on A100 at batch 16 / 64 (+13 / +11 %; anchors +10 / +6 %)**: the A100 tables "
    "come from vLLM 0.14 on a sparser grid (9,240 GEMM rows against 35,742 on the others) and Qwen's shapes "
    "(hidden 3584, FFN 18944) fall between grid values, so both sides interpolate, differently; the fused "
    "elementwise kernels add 4 %.",
    "- **Mixtral-8x7B (median 16 %, -63 to +26 %)**: not the same computation. The capture runs Hugging "
    "Face's MoE block (a router GEMM, then per expert a gather, the expert's GEMMs over its tokens, a weighted "
    "scatter; fake tensors route evenly), priced with the GEMM tables and the fused routing kernels; the peer "
    "prices one fused MoE kernel from its MoE table. Decode on H100 / H200 / L40S comes out +2 to +26 % "
    "(per-expert GEMMs and routing kernels against one fused kernel). Prefill on A100 is -39 to -63 % because "
    "the database has no balanced-routing bf16 MoE rows for A100 (only power-law routing, which is slower), "
    "and decode there at batch 16 / 64 -15 / -18 % for the same reason (at batch 1 +12 %, anchors +6 %: the "
    "A100 GEMM grid, as for Qwen). Prefill on H100 is -17 to -33 % while it matches H200 "
    "within +2 to -7 %: the peer's H100 MoE entries are 1.3-1.6x its H200 ones on the same compute, which "
    "bandwidth (+43 % on H200) does not explain for compute-bound prefill. L40S prefill at batch 1 (-37 %) is "
    "the peer's small-token MoE entry on that GPU; at batch 16 / 64 the gap is the fused elementwise kernels "
    "as for the dense models (anchors -4 / +4 %). Mixtral's 93 GB of bf16 weights do not fit one A100, H100 "
    "or L40S at TP1; the peer estimates anyway, and so does this table.",
]


if __name__ == "__main__":
    main()
