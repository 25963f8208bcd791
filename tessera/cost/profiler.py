"""Measure captured kernels on the local CPU, so that the CPU becomes one more calibrated device type.

``profile_model`` captures a tiny model for real (``tessera.capture`` real mode: fp32 tensors, one
operator call per kernel), replays it op by op with one thread, and times each op with perf_counter
(median over ``repeats`` whole replays, so every op runs at its point in the step on real values). It writes, under ``out/cpu/<model>/``:

* ``kernels.csv``: one row per captured kernel and token count (kind, dims, FLOPs, bytes, seconds):
  what ``calibrate.fit_kernels`` fits the CPU's per-kind efficiencies on;
* ``mlp.csv``: the same times summed into Vidur's operators (q/k/v -> attn_pre_proj, gate+up ->
  mlp_up_proj, ...), in Vidur's columns and units (ms), so ``tessera cost validate`` reads it too.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tessera.capture.zoo import resolve
from tessera.contracts.enums import Phase
from tessera.cost.profiles import KERNEL_COLUMNS, OPS, SHAPE_COLUMNS, KernelTiming
from tessera.graph import Kernel, KernelKind


def measure_cpu(repeats: int = 10) -> tuple[float, float]:
    """(fp32 GEMM FLOP/s of a 1024^3 torch.mm, copy bandwidth in B/s counting read + write), 1 thread."""
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    gemm_s = _median_s(lambda: torch.mm(a, b), repeats)
    x = torch.empty(64 * 2**20, dtype=torch.uint8)
    y = torch.empty_like(x)
    copy_s = _median_s(lambda: y.copy_(x), repeats)
    return 2 * 1024**3 / gemm_s, 2 * x.numel() / copy_s


def _median_s(fn: Any, repeats: int) -> float:
    fn()  # warm-up: allocation, first-touch
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _capture(model: str, phase: str, batch: int, seq: int | None, context: int | None) -> Any:
    from tessera.capture.core import capture_program  # the capture stage; imported lazily (heavy)

    return capture_program(model, phase, batch=batch, seq=seq, context=context)


def time_kernels(capture: Any, repeats: int = 20) -> list[float]:
    """Median seconds of each op of a real capture over ``repeats`` whole replays (after one warm-up).

    Each op is timed where it runs in the step, from a fresh initial state every replay, so the cost
    of allocating its outputs and of cold inputs is counted as it is in a real step.
    """
    from tessera.capture.program import initial_storages, resolve, run_op

    funcs = [resolve(op.func) for op in capture.program]
    per_op: list[list[float]] = [[] for _ in funcs]
    for r in range(repeats + 1):
        storages = initial_storages(capture)
        for i, (op, func) in enumerate(zip(capture.program, funcs, strict=True)):
            t0 = time.perf_counter()
            run_op(storages, op, func)
            if r:
                per_op[i].append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in per_op]


def time_step(capture: Any, repeats: int = 20) -> float:
    """Median seconds of a whole replay of the program (fresh initial state each time, not timed)."""
    from tessera.capture.program import initial_storages, resolve, run_op

    funcs = [resolve(op.func) for op in capture.program]
    ts = []
    for _ in range(repeats + 1):
        storages = initial_storages(capture)
        t0 = time.perf_counter()
        for op, func in zip(capture.program, funcs, strict=True):
            run_op(storages, op, func)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:])


def vidur_op(k: Kernel) -> str | None:
    """Vidur operator a captured kernel belongs to, from its module path (Llama-family names)."""
    m = k.module
    if m.endswith("embed_tokens"):
        return "emb"
    for part, op in (("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "post_attention_layernorm"),
                     ("q_proj", "attn_pre_proj"), ("k_proj", "attn_pre_proj"), ("v_proj", "attn_pre_proj"),
                     ("o_proj", "attn_post_proj"), ("gate_proj", "mlp_up_proj"), ("up_proj", "mlp_up_proj"),
                     ("down_proj", "mlp_down_proj")):
        if m.endswith(part):
            return op
    if m.endswith(".mlp") or m.endswith("act_fn"):
        return "mlp_act"
    if m.endswith("self_attn") and k.kind is KernelKind.ELEMENTWISE:
        return "attn_rope"
    if k.layer is not None and m.count(".") == 2 and k.name.startswith("aten.add"):  # model.layers.N
        return "add"
    return None


def profile_model(model: str, *, phase: str = "decode", batches: tuple[int, ...] = (1, 2, 4, 8),
                  context: int = 32, repeats: int = 20) -> list[KernelTiming]:
    """Time every kernel of ``model``'s step at each batch size (tokens = batch for decode)."""
    torch.set_num_threads(1)
    out = []
    for b in batches:
        cap = _capture(model, phase, b, None if phase == Phase.DECODE else context, context if phase == Phase.DECODE else None)
        tokens = b if phase == Phase.DECODE else b * context
        for k, t in zip(cap.graph.kernels, time_kernels(cap, repeats), strict=True):
            out.append(KernelTiming(model=model, phase=phase, tokens=tokens, kernel=k, time_s=t))
    return out


def write_profile(timings: list[KernelTiming], out: Path, *, config: dict[str, Any]) -> Path:
    """Write kernels.csv and a Vidur-format mlp.csv under ``out/cpu/<model>/``; returns that folder."""
    model = timings[0].model
    folder = out / "cpu" / model
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "kernels.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(KERNEL_COLUMNS)
        for t in timings:
            k = t.kernel
            w.writerow([t.model, t.phase, t.tokens, k.id, k.name, k.kind.value, k.module, json.dumps(k.dims),
                        k.flops, k.bytes_read, k.bytes_written, k.dtype, f"{t.time_s:.9g}"])
    per_op: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    layers = max(1, len({t.kernel.layer for t in timings if t.kernel.layer is not None}))
    for t in timings:
        op = vidur_op(t.kernel)
        if op is not None:  # Vidur times one layer: average over layers (emb is outside layers)
            per_op[t.tokens][op] += t.time_s / (1 if op == "emb" else layers)
    shape = {"n_head": config["num_attention_heads"], "n_kv_head": config.get("num_key_value_heads",
             config["num_attention_heads"]), "n_embd": config["hidden_size"],
             "n_expanded_embd": config["intermediate_size"], "vocab_size": config["vocab_size"],
             "use_gated_mlp": True, "num_tensor_parallel_workers": 1}
    with (folder / "mlp.csv").open("w", newline="") as f:
        cols = [f"time_stats.{op}.median" for op in OPS] + list(SHAPE_COLUMNS) + ["use_gated_mlp"]
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for tokens, ops in sorted(per_op.items()):
            w.writerow({**{f"time_stats.{op}.median": f"{ops[op] * 1e3:.6g}" for op in OPS if op in ops},
                        **shape, "num_tokens": tokens})
    return folder


@dataclass(frozen=True, kw_only=True)
class ProfileRun:
    """What `tessera profile` did: the model timed at each batch size, the kernel timings taken and the
    folder written with its files."""

    model: str
    device: str
    batches: tuple[int, ...]
    context: int
    repeats: int
    kernel_timings: int
    folder: Path
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "batches": list(self.batches),
                "context": self.context, "repeats": self.repeats, "kernel_timings": self.kernel_timings,
                "folder": str(self.folder), "files": list(self.files)}


def profile_to(model: str, out: Path, *, batches: tuple[int, ...], context: int, repeats: int) -> ProfileRun:
    """``profile_model`` on the CPU, written by ``write_profile`` under ``out/cpu/<model>/``."""
    spec = resolve(model)  # an unknown model: one line before any timing
    timings = profile_model(model, batches=batches, context=context, repeats=repeats)
    folder = write_profile(timings, out, config=spec.config.get("text_config", spec.config))
    return ProfileRun(model=model, device="cpu", batches=batches, context=context, repeats=repeats,
                      kernel_timings=len(timings), folder=folder,
                      files=tuple(sorted(p.name for p in Path(folder).iterdir())))
