"""Host time per iteration of the engine's traced program, one thread: Qwen2.5-0.5B's published config with
dummy weights, a decode batch of 32 sequences at context 512.

Per dtype it times (median of repeats, after warm-up):
  - the iteration at decode batch 32 through the program's generated code (the unsplit executor);
  - a skeleton of the same iteration: the same config with every width shrunk (hidden 112 = 14 heads of
    8, 2 KV heads, MLP 128, vocab 256) and every context 1 token, so the same 364 nodes and operators run
    on tiny tensors for the same 32 sequences: its time is the host cost of the nodes whatever the model's
    size and the contexts (module calls, argument handling, operator dispatch, the custom ops'
    per-sequence bookkeeping), and over the node count the cost of one node; the rest of the full
    iteration is the kernels' own work;
  - both through the split executor too, every node on device 0 (value stores, node-by-node dispatch,
    no transfers);
  - the engine's own host work around an iteration at batch 32: laying out the inputs, greedy sampling.
It counts the operators dispatched per iteration (a custom op once: what a GPU backend would launch).
Writes bench/results/engine.json and engine.md. Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tessera.engine.arch import arch_of
from tessera.engine.config import SamplingParams
from tessera.engine.inputs import IterationShape, build_inputs, shape_pieces
from tessera.engine.loader import dummy_weights
from tessera.engine.models import allocate_caches, build_model
from tessera.engine.program import Program
from tessera.engine.sampling import sample
from tessera.hardware import gpu

# Qwen/Qwen2.5-0.5B, config.json
QWEN25_05B = dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                  sliding_window=32768, max_window_layers=24, bos_token_id=151643, eos_token_id=151643)
SKELETON = dict(QWEN25_05B, hidden_size=112, intermediate_size=128, vocab_size=256, bos_token_id=1,
                eos_token_id=2)
BATCH, CONTEXT, PAGE = 32, 512, 16
OUT = Path(__file__).parent / "results"


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def timed(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def program_for(config: dict[str, object], dtype: torch.dtype, pieces) -> Program:
    arch = arch_of(config, "Qwen2.5-0.5B")
    model = build_model(arch, dtype, "cpu")
    dummy_weights(model, seed=0)
    allocate_caches(model, pages=sum(len(p.pages) for p in pieces), page_size=PAGE, slots=BATCH, dtype=dtype,
                    device="cpu")
    return Program(model)


def measure(dtype: torch.dtype, repeats: int) -> dict[str, object]:
    pieces = shape_pieces(IterationShape(decode=BATCH, context=CONTEXT), PAGE)
    inputs = build_inputs(pieces, PAGE)
    short = shape_pieces(IterationShape(decode=BATCH, context=1), PAGE)
    bones = build_inputs(short, PAGE)
    full, skeleton = program_for(QWEN25_05B, dtype, pieces), program_for(SKELETON, dtype, short)
    nodes = len(full.kernels)
    assert len(skeleton.kernels) == nodes
    everywhere = (0,) * nodes
    with torch.no_grad():
        whole_s = timed(lambda: full(inputs), repeats)
        split_s = timed(lambda: full.run_split(inputs, everywhere, 1), repeats)
        bones_s = timed(lambda: skeleton(bones), 10 * repeats)
        bones_split_s = timed(lambda: skeleton.run_split(bones, everywhere, 1), 10 * repeats)
        counter = OpCount()
        with counter:
            logits = full(inputs)
    layout_s = timed(lambda: build_inputs(pieces, PAGE), 20)
    greedy = SamplingParams()
    sample_s = timed(lambda: [sample(row, greedy, None) for row in logits.float()], 20)
    return {"dtype": str(dtype).removeprefix("torch."), "nodes": nodes, "ops_per_iteration": counter.ops,
            "iteration_ms": round(whole_s * 1e3, 1), "skeleton_ms": round(bones_s * 1e3, 2),
            "host_us_per_node": round(bones_s / nodes * 1e6, 1),
            "kernels_ms": round((whole_s - bones_s) * 1e3, 1), "host_share": round(bones_s / whole_s, 4),
            "split_executor_ms": round(split_s * 1e3, 1), "split_skeleton_ms": round(bones_split_s * 1e3, 2),
            "split_us_per_node": round(bones_split_s / nodes * 1e6, 1),
            "layout_ms": round(layout_s * 1e3, 3), "sampling_ms": round(sample_s * 1e3, 3),
            "weight_bytes": sum(p.numel() * p.element_size() for p in full.model.parameters())}


HEADER = ("dtype", "nodes", "ops / iteration", "iteration ms", "skeleton ms", "host µs / node", "kernels ms",
          "host share", "split executor ms", "split skeleton ms", "split µs / node", "inputs layout ms",
          "greedy sampling ms")
COLUMNS = ("dtype", "nodes", "ops_per_iteration", "iteration_ms", "skeleton_ms", "host_us_per_node",
           "kernels_ms", "host_share", "split_executor_ms", "split_skeleton_ms", "split_us_per_node",
           "layout_ms", "sampling_ms")
NOTE = ("`nodes`: the program's kernel nodes; `ops / iteration`: operators dispatched (a custom op once); "
        "`skeleton`: the same program and batch with every width shrunk (hidden 112, MLP 128, vocab 256) and "
        "contexts of 1 token, whose time is the nodes' host cost; `host µs / node` = skeleton / nodes; "
        "`kernels` = iteration − skeleton; `split`: the split executor, every node on one device. "
        "Measured by `OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine.py`.")


def on_gpu(row: dict[str, object], name: str = "H100-SXM") -> str:
    """What the bf16 iteration's memory traffic takes on a GPU at its catalog bandwidth (a decode iteration is
    memory-bound: weights once, plus every sequence's K/V), beside the nodes' host cost measured here."""
    arch = arch_of(QWEN25_05B, "Qwen2.5-0.5B")
    card = gpu(name)
    weights = int(row["weight_bytes"])
    kv = BATCH * (CONTEXT + 1) * arch.kv_elements_per_token * 2
    device_ms = (weights + kv) / card.mem_bw_bytes_per_s * 1e3
    return (f"Reading: on an {card.name} ({card.mem_bw_bytes_per_s / 1e12:.2f} TB/s) this iteration's "
            f"bf16 weights ({weights / 1e9:.2f} GB) and K/V ({kv / 1e9:.2f} GB) take about "
            f"{device_ms:.2f} ms; the nodes' host cost measured here is {row['skeleton_ms']} ms "
            f"({row['host_us_per_node']} µs a node), {float(row['skeleton_ms']) / device_ms:.0f}x the "
            f"device's time: run node by node from Python, a GPU would wait on the host, so a GPU executor "
            f"needs each device's share captured as a CUDA graph (or compiled), which the custom ops allow "
            f"only once their sequence metadata is prepared on the host before the iteration instead of "
            f"read with .tolist() inside.")


def markdown(rows: list[dict[str, object]], meta: dict[str, object]) -> str:
    lines = [f"# Engine host time per iteration ({meta['model']}, decode batch {BATCH} at context "
             f"{CONTEXT})", "",
             f"One thread (OMP_NUM_THREADS={meta['threads']}), load average {meta['loadavg_1m']} at the "
             f"start and {meta['loadavg_1m_end']} at the end, {meta['cpu']}; dummy weights; medians after 2 "
             f"warm-ups.",
             "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = [f"{r[c]:.1%}" if c == "host_share" else str(r[c]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    bf16 = next((r for r in rows if r["dtype"] == "bfloat16"), None)
    reading = ["", on_gpu(bf16)] if bf16 else []
    return "\n".join([*lines, "", NOTE, *reading]) + "\n"


def main() -> None:
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    torch.set_num_threads(max(1, threads or 1))
    meta = {"model": "Qwen2.5-0.5B (published config)", "threads": torch.get_num_threads(),
            "loadavg_1m": round(os.getloadavg()[0], 2), "repeats": 5,
            "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), "?")}
    rows = [measure(dtype, meta["repeats"]) for dtype in (torch.float32, torch.bfloat16)]
    meta["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    OUT.mkdir(exist_ok=True)
    (OUT / "engine.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (OUT / "engine.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
