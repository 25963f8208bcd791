"""The four baselines as fixed kernel placements (docs/plan.md "Strategies").

Each returns per-phase assignments (kernel -> device) for one orientation; the planner scores every
orientation with score.score and keeps the best, or reports not-applicable with the reason.
"""

from __future__ import annotations

from tessera.graph import KernelGraph, KernelKind, Role

ATTN_KINDS = (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE)


def has_attention(g: KernelGraph) -> bool:
    return any(k.kind in ATTN_KINDS for k in g.kernels)


def is_attention_side(g: KernelGraph, k_id: int) -> bool:
    """Attention block of a layer: the attention module's kernels (q/k/v/o projections, rope, cache
    writes, attention), anything touching KV, and the pre-attention norm."""
    k = g.kernels[k_id]
    if k.layer is None:
        return False
    mod = k.module.lower()
    if k.kind in ATTN_KINDS or "attn" in mod or "attention" in mod.split(".")[-1] or "input_layernorm" in mod:
        return True
    return any(g.buffers[b].role == Role.KV for b in (*k.reads, *k.writes))


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


def layer_ranges(n_layers: int, speeds: list[float]) -> list[int]:
    """Layer counts per stage in proportion to speed (largest remainder), every stage at least one layer
    when there are enough layers."""
    tot = sum(speeds)
    raw = [n_layers * s / tot for s in speeds]
    cnt = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - cnt[i], reverse=True)[: n_layers - sum(cnt)]:
        cnt[i] += 1
    if n_layers >= len(speeds):
        for i in range(len(cnt)):
            if cnt[i] == 0:
                j = max(range(len(cnt)), key=lambda j: cnt[j])
                cnt[j] -= 1
                cnt[i] += 1
    return cnt


def layer_pipeline(g: KernelGraph, order: list[int], counts: list[int]) -> tuple[int, ...]:
    """Contiguous layer ranges: stage i (device order[i]) runs the next counts[i] layers; the prologue
    runs on the first stage, the epilogue on the last."""
    layers = sorted({k.layer for k in g.kernels if k.layer is not None})
    stage_of: dict[int, int] = {}
    i = 0
    for st, c in enumerate(counts):
        for lay in layers[i:i + c]:
            stage_of[lay] = order[st]
        i += c
    first_layer_kernel = min((k.id for k in g.kernels if k.layer is not None), default=0)
    out = []
    for k in g.kernels:
        if k.layer is not None:
            out.append(stage_of[k.layer])
        else:
            out.append(order[0] if k.id < first_layer_kernel else order[-1])
    return tuple(out)


def layer_seconds(g: KernelGraph, times: list[list[float]]) -> list[float]:
    """Per-device seconds of all layers' kernels (times[k][d]); speed of a stage is 1 / this."""
    n_dev = len(times[0]) if times else 0
    return [sum(times[k.id][d] for k in g.kernels if k.layer is not None) for d in range(n_dev)]
