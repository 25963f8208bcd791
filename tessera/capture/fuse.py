"""The production-fused kernel view: elementwise / norm / copy chains between anchor kernels as one kernel.

Serving engines do not launch a step's ATen operators one by one: Inductor and vLLM's custom kernels fuse
the residual add into the RMSNorm, SiLU into the gate·up product, rotary into the cache write. This view
groups each maximal chain of elementwise, norm and copy kernels between two *anchors* (every other kind:
GEMM, attention, scan, embedding / MoE gather-scatter, conv, other) into one kernel that reads and writes
only what the chain exchanges with the rest of the step: a buffer made and consumed inside the chain
disappears. Its cost is then one launch plus its external bytes.

Grouping is exact about order. A chain is first a run of consecutive fusible kernels in program order;
contracting a contiguous run never creates a cycle. Then a group may move *later* to join a group that
reads what it writes (SiLU waiting for the up projection to join the multiply) only if it commutes with
every kernel it moves past: no buffer written by one is touched by the other. So the fused program order
is a valid order of the eager kernels, and every dependency between groups is still an edge.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tessera.capture.recorder import BufferAccess
from tessera.graph import Kernel, KernelGraph, KernelKind, Role, build_graph

FUSIBLE = frozenset({KernelKind.ELEMENTWISE, KernelKind.NORM, KernelKind.COPY})
# How many groups back a group looks for a producer to pull forward (the SiLU-before-up case is 2).
LOOKBACK = 4


@dataclass
class _Node:
    members: list[int]  # eager kernel ids, program order
    fusible: bool
    reads: set[int]
    writes: set[int]

    def commutes(self, other: _Node) -> bool:
        """No RAW, WAR or WAW conflict: the two may run in either order."""
        return not (self.writes & (other.reads | other.writes) or self.reads & other.writes)


def groups_of(graph: KernelGraph) -> list[list[int]]:
    """Eager kernel ids of each fused kernel, in fused program order."""
    block_of = {i: path for path, ids in moe_blocks(graph).items() for i in ids}
    nodes: list[_Node] = []
    last_block = None
    for k in graph.kernels:
        block = block_of.get(k.id)
        f = block is None and k.kind in FUSIBLE and k.deps_from != "ptx"  # a Triton kernel is already fused
        if (f and nodes and nodes[-1].fusible) or (block is not None and block == last_block):
            last = nodes[-1]
            last.members.append(k.id)
            last.reads |= set(k.reads)
            last.writes |= set(k.writes)
        else:
            nodes.append(_Node(members=[k.id], fusible=f, reads=set(k.reads), writes=set(k.writes)))
        last_block = block
    _pull_forward(nodes)
    return [n.members for n in nodes]


def moe_blocks(graph: KernelGraph) -> dict[str, list[int]]:
    """Module path of each experts module -> its call's eager kernel ids (routing, expert GEMMs, their
    activations, the output's zero fill), where they are one consecutive run of the program."""
    paths = {k.module for k in graph.kernels if k.kind is KernelKind.MOE_ROUTING}
    blocks: dict[str, list[int]] = {}
    for k in graph.kernels:
        m = k.module
        while m and m not in paths:
            m = m.rpartition(".")[0]
        if m:
            blocks.setdefault(m, []).append(k.id)
    return {p: ids for p, ids in blocks.items() if ids[-1] - ids[0] + 1 == len(ids)}


def _pull_forward(nodes: list[_Node]) -> None:
    """Merge a fusible group into a later fusible group that reads its output, when it commutes with every
    group in between (it then simply runs later); repeated until nothing moves."""
    j = 0
    while j < len(nodes):
        node = nodes[j]
        merged = False
        if node.fusible:
            for i in range(j - 1, max(-1, j - 1 - LOOKBACK), -1):
                src = nodes[i]
                if src.fusible and src.writes & node.reads and all(src.commutes(nodes[x]) for x in range(i + 1, j)):
                    node.members = sorted(src.members + node.members)
                    node.reads |= src.reads
                    node.writes |= src.writes
                    del nodes[i]
                    merged = True
                    break
        j = j - 1 if merged else j + 1


def fuse(graph: KernelGraph, access: Sequence[BufferAccess]) -> KernelGraph:
    """The fused view of an eager capture; ``access[i]`` is kernel i's bytes per buffer.

    ``meta["fused_from"][j]`` lists the eager kernel ids of fused kernel j (see ``unfuse``)."""
    if len(access) != len(graph.kernels):
        raise ValueError(f"{len(access)} access records for {len(graph.kernels)} kernels")
    groups = groups_of(graph)
    touching = Counter(b for k in graph.kernels for b in {*k.reads, *k.writes})
    block_at = {ids[0]: path for path, ids in moe_blocks(graph).items()}
    weights = _weights_under(graph, set(block_at.values()))
    kernels = [_fused_moe_kernel(graph, access, g, j, touching, block_at[g[0]], weights[block_at[g[0]]])
               if g[0] in block_at else _fused_kernel(graph, access, g, j, touching) for j, g in enumerate(groups)]
    meta = {**graph.meta, "view": "fused", "eager_kernels": len(graph.kernels), "fused_from": groups}
    return build_graph(model=graph.model, phase=graph.phase, shape=graph.shape, kernels=kernels,
                       buffers=graph.buffers, meta=meta)


def _external(graph: KernelGraph, access: Sequence[BufferAccess], ks: list[Kernel],
              touching: Counter[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes per buffer a group of kernels reads from / writes to the rest of the step (one pass over the
    members: an MoE block has thousands)."""
    inside: Counter[int] = Counter()
    first_is_read: dict[int, bool] = {}
    read_sum: Counter[int] = Counter()
    write_sum: Counter[int] = Counter()
    written: set[int] = set()
    for k in ks:
        inside.update({*k.reads, *k.writes})
        for b in (*k.reads, *k.writes):
            first_is_read.setdefault(b, b in k.reads)
        read_sum.update(access[k.id].reads)
        write_sum.update(access[k.id].writes)
        written.update(k.writes)
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    for b, read_first in first_is_read.items():
        buf = graph.buffers[b]
        # live outside the chain: resident, handed in or out, or touched by a kernel outside it
        live = buf.role is not Role.ACTIVATION or touching[b] > inside[b]
        # one pass over a buffer reads it once: several members reading the same tensor cost it once
        if read_first:
            reads[b] = min(buf.bytes, read_sum[b])
        if live and b in written:
            writes[b] = min(buf.bytes, write_sum[b])
    return reads, writes


def _fused_kernel(graph: KernelGraph, access: Sequence[BufferAccess], members: list[int], new_id: int,
                  touching: Counter[int]) -> Kernel:
    ks = [graph.kernels[i] for i in members]
    if len(ks) == 1:
        return replace(ks[0], id=new_id)
    reads, writes = _external(graph, access, ks, touching)
    main = max(ks, key=lambda k: k.bytes_read + k.bytes_written)  # dominant member: kind and dtype
    last = ks[-1]  # where the fused kernel sits: a residual add joins the next layer's norm
    return Kernel(
        id=new_id, name="fused[" + ",".join(_short(k.name) for k in ks) + "]", kind=main.kind,
        flops=sum(k.flops for k in ks), bytes_read=sum(reads.values()), bytes_written=sum(writes.values()),
        reads=tuple(reads), writes=tuple(writes), layer=last.layer, module=last.module, phase=last.phase,
        dtype=main.dtype, dims={"numel": max(k.dims.get("numel", 0) for k in ks), "fused": len(ks)},
        indirect=any(k.indirect for k in ks),
    )


def distinct_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts ``tokens`` tokens touch when each picks ``top_k`` of ``experts``
    uniformly at random: an expert is missed by one token with probability 1 − k/E (k distinct picks),
    by all T independently with (1 − k/E)^T, so E·(1 − (1 − k/E)^T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def _weights_under(graph: KernelGraph, paths: set[str]) -> dict[str, list[int]]:
    """Weight buffer ids named under each module path (``<path>.up_list.3.weight``)."""
    out: dict[str, list[int]] = {p: [] for p in paths}
    for b in graph.buffers:
        if b.role is Role.WEIGHT and paths:
            m = b.name.rpartition(".")[0]
            while m and m not in out:
                m = m.rpartition(".")[0]
            if m:
                out[m].append(b.id)
    return out


def _expert_index(name: str, path: str) -> str:
    """``<path>.down_list.7.weight`` -> ``7``."""
    return name[len(path) + 1:].split(".")[1]


def _fused_moe_kernel(graph: KernelGraph, access: Sequence[BufferAccess], members: list[int], new_id: int,
                      touching: Counter[int], path: str, weights: list[int]) -> Kernel:
    """One experts module's call as the fused MoE kernel serving engines launch (vLLM's fused_moe):
    FLOPs those of the active experts (the routed tokens' GEMMs), reads every expert's weights (placement
    keeps them all on its device), bytes read: the weights of the experts ``tokens`` top-k choices touch
    in expectation under uniform routing (``distinct_experts``) plus its activations, indices and router
    weights. dims are those of a measured MoE table: tokens, hidden, inter, topk, experts, and
    expert_bytes (one expert's weight bytes) for rescaling to other token counts."""
    ks = [graph.kernels[i] for i in members]
    reads, writes = _external(graph, access, ks, touching)
    experts = len({_expert_index(graph.buffers[b].name, path) for b in weights})
    expert_bytes = sum(graph.buffers[b].bytes for b in weights) // max(1, experts)
    ups = [k for k in ks if k.kind is KernelKind.GEMM and ".up_list." in k.module]
    downs = [k for k in ks if k.kind is KernelKind.GEMM and ".down_list." in k.module]
    combine = next(k for k in ks if k.kind is KernelKind.MOE_ROUTING and "combine" in k.name)
    tokens = graph.buffers[combine.writes[0]].shape[0]  # out [tokens, hidden], the experts' sum
    top_k = round(sum(k.dims["m"] for k in ups) / tokens)
    activations = sum(n for b, n in reads.items() if graph.buffers[b].role is not Role.WEIGHT)
    touched = distinct_experts(experts, top_k, tokens) * expert_bytes
    return Kernel(
        id=new_id, name=f"fused_moe[{experts} experts, top-{top_k}]", kind=KernelKind.GEMM,
        flops=sum(k.flops for k in ks), bytes_read=int(touched) + activations,
        bytes_written=sum(writes.values()), reads=tuple(dict.fromkeys([*reads, *weights])),
        writes=tuple(writes), layer=ks[-1].layer, module=path, phase=ks[-1].phase, dtype=ups[0].dtype,
        dims={"tokens": tokens, "hidden": ups[0].dims["k"], "inter": downs[0].dims["k"], "topk": top_k,
              "experts": experts, "expert_bytes": expert_bytes, "fused": len(ks)},
        indirect=True,
    )


def _short(name: str) -> str:
    """``aten.add.Tensor`` -> ``add``; other names as they are."""
    parts = name.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "aten" else name


def fused_from(graph: KernelGraph) -> list[list[int]] | None:
    """The eager kernel ids of each kernel of a fused view; None for an eager graph."""
    got = graph.meta.get("fused_from")
    return None if got is None else [list(g) for g in got]


def unfuse(graph: KernelGraph, assignment: Sequence[int]) -> tuple[int, ...]:
    """A placement of ``graph``'s kernels as a placement of the eager kernels it was fused from: each
    eager kernel runs where its fused kernel runs. An eager graph's placement is returned unchanged."""
    if len(assignment) != len(graph.kernels):
        raise ValueError(f"assignment has {len(assignment)} entries for {len(graph.kernels)} kernels")
    gs = fused_from(graph)
    if gs is None:
        return tuple(assignment)
    out = [-1] * sum(len(g) for g in gs)
    for d, g in zip(assignment, gs, strict=True):
        for i in g:
            out[i] = d
    assert -1 not in out, "fused groups do not cover every eager kernel"
    return tuple(out)
