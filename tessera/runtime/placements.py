"""Simple placements over two or more devices, for tests, benchmarks and `tessera run MODEL`.

The MILP's placements come from tessera.plan; these are the hand-made splits the issue compares:
attention-type kernels on one device and GEMMs on the other, and a contiguous layer split.
"""

from __future__ import annotations

from tessera.errors import choices_error
from tessera.graph import KernelGraph, KernelKind, Role

ATTENTION_KINDS = frozenset({KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE, KernelKind.SCAN, KernelKind.CONV})


def attention_gemm(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Attention-type kernels (and the ones touching KV/state) on device 0, GEMMs on device 1; any
    other kernel follows the kernel before it, so elementwise chains stay with their producer."""
    assert devices >= 2, "attention/GEMM split needs two devices"
    state = {b.id for b in graph.buffers if b.role in (Role.KV, Role.STATE)}
    out: list[int] = []
    for k in graph.kernels:
        if k.kind in ATTENTION_KINDS or state & {*k.reads, *k.writes}:
            out.append(0)
        elif k.kind is KernelKind.GEMM:
            out.append(1)
        else:
            out.append(out[-1] if out else 0)
    return tuple(out)


def layer_split(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Contiguous layer ranges of (near) equal kernel counts; prologue with the first, epilogue the last."""
    per_layer = graph.by_layer()
    layers = sorted(x for x in per_layer if x is not None)
    total = sum(len(per_layer[x]) for x in layers) or 1
    owner: dict[int, int] = {}
    seen = 0
    for x in layers:
        owner[x] = min(devices - 1, (seen + len(per_layer[x]) // 2) * devices // total)
        seen += len(per_layer[x])
    out: list[int] = []
    for k in graph.kernels:
        if k.layer is not None:
            out.append(owner[k.layer])
        else:
            out.append(out[-1] if out else 0)  # prologue -> first owner (0); epilogue follows the last layer
    return tuple(out)


def interleave(graph: KernelGraph, devices: int = 2) -> tuple[int, ...]:
    """Layer l on device l mod D (prologue on 0, epilogue with the last layer): a transfer per layer."""
    out: list[int] = []
    for k in graph.kernels:
        out.append(k.layer % devices if k.layer is not None else (out[-1] if out else 0))
    return tuple(out)


def all_on(graph: KernelGraph, device: int = 0) -> tuple[int, ...]:
    return tuple(device for _ in graph.kernels)


PLACEMENTS = {"attention_gemm": attention_gemm, "layer_split": layer_split, "interleave": interleave}


def placement(name: str, graph: KernelGraph, devices: int) -> tuple[int, ...]:
    if name not in PLACEMENTS:
        raise choices_error("placement", name, list(PLACEMENTS))
    return PLACEMENTS[name](graph, devices)
