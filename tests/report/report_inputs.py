"""Hand-made inputs in the contracts of plan (Plan file, `plan --json`) and sim (`simulate --json`)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from tessera.contracts.plan import Device, PhasePlan, Plan, PoolPlan, StepPoint
from tessera.contracts.provenance import Provenance, fingerprint
from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph

G, A, N, E = KernelKind.GEMM, KernelKind.ATTENTION_DECODE, KernelKind.NORM, KernelKind.EMBEDDING
# (kind, layer) in program order: prologue embedding, two layers of 6 kernels, epilogue norm + lm head
TOY_KERNELS = [(E, None), *[(k, layer) for layer in (0, 1) for k in (N, G, A, G, N, G)], (N, None), (G, None)]
# Kernel id -> device. Layer 0: norms and q-proj on d0, attention/o-proj/ffn on d1. Layer 1: only q-proj on d0.
TOY_ASSIGNMENT = (0, 0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0)


def toy_graph() -> KernelGraph:
    bufs = [Buffer(id=0, name="x", bytes=64, role=Role.INPUT), Buffer(id=1, name="w", bytes=1024, role=Role.WEIGHT)]
    ks = [Kernel(id=i, name=f"k{i}", kind=kind, flops=100, bytes_read=64, bytes_written=64, reads=(0, 1),
                 writes=(0,), layer=layer) for i, (kind, layer) in enumerate(TOY_KERNELS)]
    return build_graph(model="toy<2L>", phase="decode", shape={"batch": 8}, kernels=ks, buffers=bufs)


def toy_plan() -> Plan:
    point = StepPoint(batch=8, tokens=8, context=512, microbatches=2, device_busy_s=(1e-3, 2e-3),
                      link_busy_s=((0, 1, 1e-4),), latency_s=3.2e-3, step_s=5.2e-3)
    return Plan(model="toy<2L>", strategy="tessera", mode="throughput",
                devices=(Device(index=0, gpu="H100-SXM", mem_bytes=80_000_000_000),
                         Device(index=1, gpu="L40S", mem_bytes=48_000_000_000)),
                link="pcie5", phases={"decode": PhasePlan(phase="decode", assignment=TOY_ASSIGNMENT,
                                                          microbatches=2, points=(point,))},
                memory_bytes=({"weight": 30_000_000_000, "kv": 20_000_000_000, "activation": 1_000_000_000},
                              {"weight": 12_000_000_000, "kv": 30_000_000_000, "activation": 500_000_000}),
                throughput_tokens_per_s=1538.0, usd_per_hour=4.09, bound_ratio=0.98, solve_s=0.4)


def _s(tp: float | None, usd: float, *, applicable: bool = True, reason: str | None = None,
       feasible: bool = True, key: str = "throughput_tokens_per_s") -> dict[str, Any]:
    return {"applicable": applicable, "reason": reason, "feasible": feasible, key: tp, "usd_per_hour": usd,
            "usd_per_million_tokens": None if tp is None else usd / (tp * 3600) * 1e6, "latency_s": 0.05,
            "memory_bytes": {"0": 10**9, "1": 2 * 10**9}}


def compare_cells() -> list[dict[str, Any]]:
    """Two LLM cells, an SSM cell where attention/FFN does not apply, a diffusion cell (images/s)."""
    return [
        {"model": "llama-3-70b", "gpus": ["H100-SXM", "L40S"], "mode": "throughput", "solve_s": 1.2,
         "bound_ratio": 0.98, "strategies": {
             "tessera": _s(3000.0, 4.09), "homogeneous": _s(2000.0, 4.09), "prefill_decode": _s(2400.0, 4.09),
             "attention_ffn": _s(2500.0, 4.09), "layer_pipeline": _s(1500.0, 4.09)}},
        {"model": "llama-3-70b", "gpus": ["H100-SXM", "A100-80GB-SXM"], "mode": "throughput", "solve_s": 0.9,
         "bound_ratio": 0.99, "strategies": {
             "tessera": _s(3600.0, 4.78), "homogeneous": _s(3000.0, 4.78),
             "prefill_decode": _s(None, 4.78, feasible=False, reason="decode side needs 12.3 GB more"),
             "attention_ffn": _s(3300.0, 4.78), "layer_pipeline": _s(2900.0, 4.78)}},
        {"model": "mamba-2<x>", "gpus": ["H100-SXM", "L40S"], "mode": "throughput", "solve_s": 0.3,
         "bound_ratio": 1.0, "strategies": {
             "tessera": _s(9000.0, 4.09), "homogeneous": _s(8000.0, 4.09), "prefill_decode": _s(8500.0, 4.09),
             "attention_ffn": _s(None, 4.09, applicable=False, reason="SSM has no attention block"),
             "layer_pipeline": _s(7000.0, 4.09)}},
        {"model": "flux", "gpus": ["H100-SXM", "L40S"], "mode": "throughput", "solve_s": 0.2,
         "bound_ratio": 0.99, "strategies": {
             n: (_s(tp, 4.09, key="throughput_images_per_s") if tp else
                 _s(None, 4.09, applicable=False, reason="diffusion has no decode phase"))
             for n, tp in (("tessera", 1.5), ("homogeneous", 1.2), ("prefill_decode", None),
                           ("attention_ffn", 1.3), ("layer_pipeline", 1.1))}},
    ]


def sim_result(scale: float) -> dict[str, Any]:
    pct = {"p50": 1.0 * scale, "p90": 2.0 * scale, "p99": 4.0 * scale}
    return {"requests": 1000, "completed": 1000, "lost": 0, "sim_wall_s": 1.5, "throughput_tokens_per_s": 2500.0,
            "ttft_s": {k: v * 0.1 for k, v in pct.items()}, "tpot_s": {k: v * 0.01 for k, v in pct.items()},
            "e2e_s": pct, "slo_attainment": 0.9, "usd_per_million_tokens": 0.45}


def of_plan(sim: dict[str, Any], plan: Plan | PoolPlan, **kw: Any) -> dict[str, Any]:
    """``sim`` as `tessera simulate PLAN --json` writes it for ``plan``: with its provenance."""
    prov = Provenance(model=plan.model, plan=fingerprint(plan), prompt="1024", output="256",
                      output_per_request=256.0, workload="poisson", **kw)
    return {**sim, "provenance": prov.to_dict()}


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG header."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])
