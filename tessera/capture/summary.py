"""The numbers `tessera trace --json` prints (and `make demo` reuses)."""

from __future__ import annotations

from typing import Any

from tessera.graph import KernelGraph, Role
from tessera.graph.ir import DEPS_FROM


def summarize(graph: KernelGraph, *, top: int = 5) -> dict[str, Any]:
    """One JSON-able object: totals, bytes by resident role, kernels by kind, the heaviest kernels."""
    roles = graph.bytes_by_role()
    kinds: dict[str, dict[str, int]] = {}
    for k in graph.kernels:
        row = kinds.setdefault(k.kind.value, {"kernels": 0, "flops": 0, "bytes": 0})
        row["kernels"] += 1
        row["flops"] += k.flops
        row["bytes"] += k.bytes_read + k.bytes_written
    heaviest = sorted(graph.kernels, key=lambda k: (k.flops, k.bytes_read + k.bytes_written), reverse=True)[:top]
    return {
        "model": graph.model,
        "phase": graph.phase,
        "shape": dict(graph.shape),
        "kernels": len(graph.kernels),
        "view": graph.meta.get("view", "eager"),  # fused (the default capture) or eager
        "eager_kernels": graph.meta.get("eager_kernels", len(graph.kernels)),
        "flops": graph.flops,
        "bytes_read": graph.bytes_read,
        "bytes_written": graph.bytes_written,
        "weight_bytes": roles[Role.WEIGHT],
        "kv_bytes": roles[Role.KV],
        "state_bytes": roles[Role.STATE],
        "layers": graph.layers,
        # where kernels' reads/writes come from: declared operator schemas or their compiled PTX
        "deps_from": {src: sum(k.deps_from == src for k in graph.kernels) for src in DEPS_FROM},
        "findings": list(graph.meta.get("findings", [])),  # e.g. a schema that omits a write its PTX does
        "capture_s": round(float(graph.meta.get("capture_s", 0.0)), 3),
        "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["flops"])),
        "heaviest": [{"id": k.id, "name": k.name, "kind": k.kind.value, "module": k.module, "flops": k.flops,
                      "bytes": k.bytes_read + k.bytes_written} for k in heaviest],
    }
