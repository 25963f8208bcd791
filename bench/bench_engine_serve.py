"""Qwen2.5-0.5B (its published config, dummy bf16 weights) serving the 64-request workload
bench/workloads/qwen05_64.json through `tessera serve-run`'s function on this machine.

Configurations: one worker of one thread (the peers' thread count), and two workers of one thread each
under the layer split with two groups in flight (both cores). Engine settings as the peer bench sets vLLM:
at most 32 requests at once, 512 tokens per iteration, model length 2048, pages of 16. Arrivals on the
clock as the file gives them (Poisson, 1/s), greedy, EOS ignored, each request its file output length.

Figures per configuration: output tokens/s (first arrival to last token), TTFT and TPOT p50/p99, the
driver's host time per iteration (scheduling and laying out inputs, sending them; taking the logits,
sampling, stop checks) p50/p99, the iterations' wall time, the workers' busy shares, the load average.
The peers' rows (transformers' batched generate, vLLM's CPU build; bench/bench_peers.py, another
engineer's bench, measured at another moment) are shown beside them from bench/results/peers.json when
it is there. Tokens are not verified here (the tests hold the split to the single-process engine).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine_serve.py [--only one|two]
Writes bench/results/engine_serve.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.serve_run import ServeRunSpec, serve_run

ROOT = Path(__file__).parent
OUT = ROOT / "results"
MODEL = ROOT / "workloads" / "qwen2.5-0.5b"
WORKLOAD = ROOT / "workloads" / "qwen05_64.json"
CONFIGS = {
    "one": ((WorkerKind(device="cpu"),), "layer_split", 1),
    "two": ((WorkerKind(device="cpu"), WorkerKind(device="cpu")), "layer_split", 2),
}


def run(name: str) -> dict[str, object]:
    kinds, placement, m = CONFIGS[name]
    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=512, page_size=16, max_model_len=2048,
                          microbatches=m)
    spec = ServeRunSpec(model=str(MODEL), kinds=kinds, placement=placement, workload_file=str(WORKLOAD),
                        config=config, dtype="bf16", load_format="dummy", seed=0)
    t0 = time.monotonic()
    r = serve_run(spec)
    e = r.extra
    return {"config": name, "devices": list(r.devices), "placement": r.placement, "microbatches": m,
            "completed": r.completed, "lost": r.lost, "throughput_tokens_per_s": r.throughput_tokens_per_s,
            "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "host_ms_per_iteration": r.host_ms_per_iteration,
            "iteration_wall_ms": e["iteration_wall_ms"], "iterations": e["iterations"],
            "busy_share": e["worker_busy_share"], "start_s": e["start_s"], "wall_s": time.monotonic() - t0,
            "load_avg": [e["load_avg_before"][0], e["load_avg_after"][0]], "preemptions": e["preemptions"]}


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def tessera_row(r: dict[str, object]) -> str:
    h, w = r["host_ms_per_iteration"], r["iteration_wall_ms"]
    return (f"| tessera ({r['placement']}, {r['microbatches']} group(s)) | {len(r['devices'])} x 1 | "
            f"{r['throughput_tokens_per_s']:.1f} | {ms(r['ttft_s']['p50'])} / {ms(r['ttft_s']['p99'])} | "
            f"{ms(r['tpot_s']['p50'])} / {ms(r['tpot_s']['p99'])} | {h['p50']:.2f} / {h['p99']:.2f} | "
            f"{w['p50']:.0f} / {w['p99']:.0f} | {[round(x, 2) for x in r['busy_share']]} | "
            f"{r['load_avg'][0]:.2f}, {r['load_avg'][1]:.2f} |")


def peer_row(p: dict[str, object]) -> str:
    return (f"| {p['system']} (bench_peers.py) | 1 x {p['threads']} | {p['output_tokens_per_s']:.1f} | "
            f"{p['ttft_ms']['p50']:.0f} / {p['ttft_ms']['p99']:.0f} | {p['tpot_ms']['p50']:.0f} / "
            f"{p['tpot_ms']['p99']:.0f} | - | - | - | {p['load']} |")


def markdown(rows: list[dict[str, object]], peers: list[dict[str, object]], meta: dict[str, object]) -> str:
    head = [
        "# Qwen2.5-0.5B serving 64 requests on this machine (tessera serve-run, the engine on workers)", "",
        f"Published config, dummy bf16 weights; bench/workloads/qwen05_64.json (Poisson 1/s, prompts 16-256, "
        f"outputs 16-128, {meta['prompt_tokens']} prompt and {meta['output_tokens']} output tokens); at most "
        f"32 requests at once, 512 tokens per iteration; {meta['cpu']}, 2 cores shared with other engineers' "
        f"jobs (load average per run below). Measured by `OMP_NUM_THREADS=1 .venv/bin/python "
        f"bench/bench_engine_serve.py`.", "",
        "| system | workers x threads | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | host ms / "
        "iteration p50 / p99 | iteration wall ms p50 / p99 | busy share | load avg (start, end) |",
        "|---|---|---|---|---|---|---|---|---|"]
    tail = ["", "Host ms / iteration: the driver's own work per iteration (the workers compute meanwhile "
            "when groups are in flight). Iteration wall: submit to logits back. Busy share: each worker's seconds "
            "in its nodes over the stream's span. The peers' rows: bench/results/peers.json, measured at "
            "another moment."]
    return "\n".join([*head, *map(tessera_row, rows), *map(peer_row, peers), *tail]) + "\n"


def peer_rows() -> list[dict[str, object]]:
    """The peer bench's rows, in this table's units, where bench/results/peers.json exists."""
    path = OUT / "peers.json"
    if not path.is_file():
        return []
    out = []
    for r in json.loads(path.read_text()).get("results", []):
        try:
            w = r["window"]
            out.append({"system": r["system"], "threads": r["threads"],
                        "output_tokens_per_s": r["output_tokens_per_s"],
                        "ttft_ms": {"p50": r["ttft_p50_ms"], "p99": r["ttft_p99_ms"]},
                        "tpot_ms": {"p50": r["tpot_p50_ms"], "p99": r["tpot_p99_ms"]},
                        "load": f"{w['loadavg_1m_start']:.2f}, {w['loadavg_1m_end']:.2f}"})
        except (KeyError, TypeError):
            continue  # a row in another layout: left out rather than misread
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(CONFIGS), action="append")
    args = ap.parse_args()
    totals = json.loads(WORKLOAD.read_text())["totals"]
    meta = {"cpu": "AMD EPYC, 2 vCPU", "omp": os.environ.get("OMP_NUM_THREADS"),
            "threads": torch.get_num_threads(), "prompt_tokens": totals["prompt_tokens"],
            "output_tokens": totals["output_tokens"]}
    rows = []
    for name in args.only or list(CONFIGS):
        rows.append(run(name))
        print(json.dumps(rows[-1]), flush=True)
    peers = peer_rows()
    text = markdown(rows, peers, meta)
    print(text)
    OUT.mkdir(exist_ok=True)
    doc = {"meta": meta, "rows": rows, "peers": peers}
    (OUT / "engine_serve.json").write_text(json.dumps(doc, indent=1) + "\n")
    (OUT / "engine_serve.md").write_text(text)


if __name__ == "__main__":
    main()
