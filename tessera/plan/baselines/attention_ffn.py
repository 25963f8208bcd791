"""Attention/FFN disaggregation (MegaScale-Infer): attention and its KV on one device, everything else on
the other, m ≥ 2 micro-batches ping-ponging between them; the chunk's attention rides with decode
attention. Both orientations are tried and the better one kept.

``is_attention_kernel`` is the attention-side predicate this baseline shares with the runtime's
``attention_gemm`` test placement (tessera.runtime.placements).
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.contracts.cost import KernelCosts
from tessera.graph import KernelGraph, KernelKind, Role
from tessera.hardware import GpuSpec, LinkSpec
from tessera.plan.baselines.common import best_fitting

ATTN_KINDS = (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE)
# attention-type work: attention itself and the recurrent mixers that take its place in state-space layers
ATTENTION_TYPE_KINDS = frozenset({*ATTN_KINDS, KernelKind.SCAN, KernelKind.CONV})


def has_attention(g: KernelGraph) -> bool:
    return any(k.kind in ATTN_KINDS for k in g.kernels)


def is_attention_kernel(g: KernelGraph, k_id: int) -> bool:
    """Attention-type work: an attention (or scan / conv mixer) kernel, or any kernel touching a KV or
    recurrent-state buffer (a cache write must run where its cache lives)."""
    k = g.kernels[k_id]
    if k.kind in ATTENTION_TYPE_KINDS:
        return True
    return any(g.buffers[b].role in (Role.KV, Role.STATE) for b in (*k.reads, *k.writes))


def is_attention_side(g: KernelGraph, k_id: int) -> bool:
    """Attention block of a layer: attention-type kernels (is_attention_kernel) plus the rest of the
    attention module (q/k/v/o projections, rope) and the pre-attention norm."""
    k = g.kernels[k_id]
    if k.layer is None:
        return False
    mod = k.module.lower()
    if "attn" in mod or "attention" in mod.split(".")[-1] or "input_layernorm" in mod:
        return True
    return is_attention_kernel(g, k_id)


def attention_sides(g: KernelGraph) -> list[bool]:
    """Per kernel: on the attention side. Kernels sharing a kv/state buffer must stay together, so a whole
    group is pulled to the attention side when any of its kernels is there (one pass over the kernels)."""
    side = [is_attention_side(g, k.id) for k in g.kernels]
    touching: dict[int, list[int]] = {}
    for k in g.kernels:
        for b in dict.fromkeys((*k.reads, *k.writes)):
            if g.buffers[b].role in (Role.KV, Role.STATE):
                touching.setdefault(b, []).append(k.id)
    for _, ks in sorted(touching.items()):  # buffer order
        if any(side[k] for k in ks):
            for k in ks:
                side[k] = True
    return side


def attention_ffn(g: KernelGraph, attn_dev: int, ffn_dev: int) -> tuple[int, ...]:
    """Attention + KV on ``attn_dev``, every other kernel (FFN / experts, embeddings, head) on ``ffn_dev``."""
    return tuple(attn_dev if s else ffn_dev for s in attention_sides(g))


def rule(units: tuple[GpuSpec, ...], link: LinkSpec, cost: KernelCosts) -> Callable:
    """The placement rule (graph, batch, m) -> assignment: both orientations, the better one that fits."""
    def place(g: KernelGraph, b: int, m: int) -> tuple[int, ...] | None:
        if m < 2:
            return None  # ping-pong needs two micro-batches in flight
        side = attention_sides(g)
        cands = [tuple(a if s else f for s in side) for a, f in ((0, 1), (1, 0))]
        return best_fitting(g, cands, m, units, link, cost)
    return place
