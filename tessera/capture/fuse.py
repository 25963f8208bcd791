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

from tessera.capture.recorder import Access
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
    nodes: list[_Node] = []
    for k in graph.kernels:
        f = k.kind in FUSIBLE and k.deps_from != "ptx"  # a custom (Triton) kernel is already production-fused
        if f and nodes and nodes[-1].fusible:
            last = nodes[-1]
            last.members.append(k.id)
            last.reads |= set(k.reads)
            last.writes |= set(k.writes)
        else:
            nodes.append(_Node(members=[k.id], fusible=f, reads=set(k.reads), writes=set(k.writes)))
    _pull_forward(nodes)
    return [n.members for n in nodes]


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


def fuse(graph: KernelGraph, access: Sequence[Access]) -> KernelGraph:
    """The fused view of an eager capture; ``access[i]`` is kernel i's bytes per buffer.

    ``meta["fused_from"][j]`` lists the eager kernel ids of fused kernel j (see ``unfuse``)."""
    if len(access) != len(graph.kernels):
        raise ValueError(f"{len(access)} access records for {len(graph.kernels)} kernels")
    groups = groups_of(graph)
    touching = Counter(b for k in graph.kernels for b in {*k.reads, *k.writes})
    kernels = [_fused_kernel(graph, access, g, j, touching) for j, g in enumerate(groups)]
    meta = {**graph.meta, "view": "fused", "eager_kernels": len(graph.kernels), "fused_from": groups}
    return build_graph(model=graph.model, phase=graph.phase, shape=graph.shape, kernels=kernels,
                       buffers=graph.buffers, meta=meta)


def _fused_kernel(graph: KernelGraph, access: Sequence[Access], members: list[int], new_id: int,
                  touching: Counter[int]) -> Kernel:
    ks = [graph.kernels[i] for i in members]
    if len(ks) == 1:
        return replace(ks[0], id=new_id)
    inside = Counter(b for k in ks for b in {*k.reads, *k.writes})
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    first_is_read: dict[int, bool] = {}
    for k in ks:
        for b in (*k.reads, *k.writes):
            first_is_read.setdefault(b, b in k.reads)
    for b, read_first in first_is_read.items():
        buf = graph.buffers[b]
        # live outside the chain: resident, handed in or out, or touched by a kernel outside it
        live = buf.role is not Role.ACTIVATION or touching[b] > inside[b]
        # one pass over a buffer reads it once: several members reading the same tensor cost it once
        if read_first:
            reads[b] = min(buf.bytes, sum(access[k.id].reads.get(b, 0) for k in ks))
        if live and any(b in k.writes for k in ks):
            writes[b] = min(buf.bytes, sum(access[k.id].writes.get(b, 0) for k in ks))
    main = max(ks, key=lambda k: k.bytes_read + k.bytes_written)  # dominant member: kind and dtype
    last = ks[-1]  # where the fused kernel sits: a residual add joins the next layer's norm
    return Kernel(
        id=new_id, name="fused[" + ",".join(_short(k.name) for k in ks) + "]", kind=main.kind,
        flops=sum(k.flops for k in ks), bytes_read=sum(reads.values()), bytes_written=sum(writes.values()),
        reads=tuple(reads), writes=tuple(writes), layer=last.layer, module=last.module, phase=last.phase,
        dtype=main.dtype, dims={"numel": max(k.dims.get("numel", 0) for k in ks), "fused": len(ks)},
        indirect=any(k.indirect for k in ks),
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
