"""``kernel_graph``: a model program as a ``tessera.graph.KernelGraph``, one kernel per call node, at an
iteration shape, made under fake tensors (no memory for weights or caches; any model size).

The program is built and traced exactly as the engine builds it, so kernel i is node i of the engine's
program (``meta["nodes"]`` lists the node names) and a placement of this graph is an assignment of the
program's nodes. Each node runs once under capture's ``Recorder``, which sees its ATen operators (a custom
op is one operator): buffers by storage, reads and writes from operator schemas, GEMM FLOPs from torch's
counter, kinds from capture's classification. A node's kernel reads the buffers its operators read that
existed before it (weights, KV pages, states, inputs, other nodes' values) and writes its own value plus
any pre-existing buffer it writes (KV pages, states); temporaries inside the node are not counted, as
for a fused kernel. Bytes per buffer are the operators' bytes, capped at the buffer's size.

Custom ops are priced from the iteration shape, which fake tensors cannot see:
- paged attention: FLOPs 4·heads·head_dim per (query, key) pair (causal, windowed); bytes the queries,
  the new K/V written, the cached K/V each sequence reads, the output;
- fused MoE: FLOPs of the routed tokens' expert GEMMs, 2·3·hidden·inter per token and chosen expert (the
  router's GEMM is a node of its own); bytes the weights of the experts ``tokens`` top-k choices touch in
  expectation under uniform routing (capture's ``distinct_experts``) plus activations, with the dims of a
  measured MoE table (tokens, hidden, inter, topk, experts, expert_bytes);
- Mamba-2 scan: FLOPs 6·heads·head_dim·state per token (the recurrence: decay, input, readout);
  conv: 2·channels·kernel per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
import torch.fx as fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from tessera.capture.fuse import distinct_experts
from tessera.capture.recorder import BufferAccess, Recorder
from tessera.engine.arch import ModelArch
from tessera.engine.inputs import IterationShape, SeqPiece, build_inputs, shape_pieces
from tessera.engine.layers import (
    Experts,
    GatedRMSNorm,
    MambaConv,
    PagedAttention,
    Residual,
    RMSNorm,
    Rotary,
    SiluAndMul,
)
from tessera.engine.models import allocate_caches, construct
from tessera.engine.program import Program
from tessera.graph import Kernel, KernelGraph, KernelKind, Role, build_graph

STATE_BUFFERS = ("conv_state", "ssm_state")
KV_BUFFERS = ("k_cache", "v_cache")
# Kernel modules whose kind is what they are, whatever ATen operators they are made of.
MODULE_KINDS: tuple[tuple[type[nn.Module], KernelKind], ...] = (
    (nn.Linear, KernelKind.GEMM), (nn.Embedding, KernelKind.EMBEDDING), (RMSNorm, KernelKind.NORM),
    (GatedRMSNorm, KernelKind.NORM), (Rotary, KernelKind.ELEMENTWISE), (SiluAndMul, KernelKind.ELEMENTWISE),
    (Residual, KernelKind.ELEMENTWISE))


def kernel_graph(arch: ModelArch, shape: IterationShape, *, model: str = "model",
                 dtype: torch.dtype = torch.bfloat16, page_size: int = 16) -> KernelGraph:
    """The program's kernels at ``shape`` (decodes first, then prompt pieces, as ``shape_pieces`` lays
    them out), in ``dtype``; KV buffers hold the shape's sequences' pages, state buffers one slot each."""
    with fake_iteration(arch, shape, dtype, page_size) as (program, inputs, pieces):
        rec = Recorder(phase=shape.phase, module_info={})
        _register(rec, program, inputs)
        kernels = _record(rec, program, inputs, arch, pieces, shape.phase)
    meta = {"source": "tessera.engine", "family": arch.family, "view": "engine", "mode": "fake",
            "nodes": list(program.node_names), "page_size": page_size}
    return build_graph(model=model, phase=shape.phase, shape=shape.as_dict(), kernels=kernels,
                       buffers=rec.graph_buffers(), meta=meta)


@contextmanager
def fake_iteration(arch: ModelArch, shape: IterationShape, dtype: torch.dtype, page_size: int
                   ) -> Iterator[tuple[Program, dict[str, torch.Tensor], list[SeqPiece]]]:
    """The program and an iteration's inputs at ``shape`` under fake tensors (nothing allocated; any model
    size), with caches for the shape's pages and sequences: run it inside the ``with``."""
    pieces = shape_pieces(shape, page_size)
    real = build_inputs(pieces, page_size).as_dict()
    with FakeTensorMode() as mode, torch.no_grad():
        inputs = {k: mode.from_tensor(t) for k, t in real.items()}
        net = construct(arch, dtype)
        allocate_caches(net, pages=sum(len(p.pages) for p in pieces), page_size=page_size,
                        slots=shape.sequences, dtype=dtype, device="cpu")
        yield Program(net), inputs, pieces


def _register(rec: Recorder, program: Program, inputs: dict[str, torch.Tensor]) -> None:
    for name, p in program.model.named_parameters():
        rec.register(p, Role.WEIGHT, name)
    for name, b in program.model.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        role = Role.KV if leaf in KV_BUFFERS else Role.STATE if leaf in STATE_BUFFERS else Role.WEIGHT
        rec.register(b, role, name)
    for name, t in inputs.items():
        rec.register(t, Role.INPUT, name)


def _record(rec: Recorder, program: Program, inputs: dict[str, torch.Tensor], arch: ModelArch,
            pieces: list[SeqPiece], phase: str) -> list[Kernel]:
    env: dict[fx.Node, torch.Tensor] = {}

    def fetch(a: fx.Node) -> torch.Tensor:
        if a.op == "placeholder":
            return inputs[str(a.target)]
        return program.attr(a) if a.op == "get_attr" else env[a]

    out_node = next(n for n in program.gm.graph.nodes if n.op == "output")
    kernels: list[Kernel] = []
    for i, node in enumerate(program.kernels):
        first_kernel, first_buffer = len(rec.kernels), len(rec.buffers)
        with rec:
            value = program.call(node, fx.node.map_arg(node.args, fetch), fx.node.map_arg(node.kwargs, fetch))
        env[node] = value
        out = rec.buffer_of(value)
        if node in out_node.all_input_nodes:
            rec.set_role(value, Role.OUTPUT)
        members = list(range(first_kernel, len(rec.kernels)))
        reads, writes = _external(rec, members, set(range(first_buffer, len(rec.buffers))), out)
        ks = [rec.kernels[m] for m in members]
        k = Kernel(id=i, name=node.name, kind=KernelKind.OTHER, flops=sum(x.flops for x in ks),
                   bytes_read=sum(reads.values()), bytes_written=sum(writes.values()), reads=tuple(reads),
                   writes=tuple(writes), layer=program.layer_of(node), module=program.module_path(node),
                   phase=phase, dtype=str(value.dtype).removeprefix("torch."), dims=_merged_dims(ks),
                   indirect=any(x.indirect for x in ks))
        kernels.append(_priced(k, program.callee(node), ks, arch, pieces, value))
    return kernels


def _external(rec: Recorder, members: list[int], created: set[int],
              out: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes per buffer the node reads from before it, and writes to its value or pre-existing buffers."""
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    for m in members:
        acc: BufferAccess = rec.access[m]
        for b, n in acc.reads.items():
            if b not in created:
                reads[b] = reads.get(b, 0) + n
        for b, n in acc.writes.items():
            if b not in created or b == out:
                writes[b] = writes.get(b, 0) + n
    if out not in writes:  # a value no operator wrote as a fresh buffer (never for a kernel node)
        writes[out] = 0
    size = {b: rec.buffers[b].nbytes for b in (*reads, *writes)}
    return {b: min(n, size[b]) for b, n in reads.items()}, {b: min(n, size[b]) for b, n in writes.items()}


def _merged_dims(members: list[Kernel]) -> dict[str, int]:
    """A one-operator node keeps its operator's dims; several: the largest numel and how many."""
    if len(members) == 1:
        return dict(members[0].dims)
    gemms = [k for k in members if k.kind is KernelKind.GEMM]
    if len(gemms) == 1:  # a linear with its bias add, or a GEMM with a cast
        return dict(gemms[0].dims)
    return {"numel": max((k.dims.get("numel", 0) for k in members), default=0), "fused": len(members)}


def _dominant_kind(members: list[Kernel]) -> KernelKind:
    if not members:
        return KernelKind.OTHER
    if any(k.kind is KernelKind.GEMM for k in members):
        return KernelKind.GEMM
    return max(members, key=lambda k: k.bytes_read + k.bytes_written).kind


def _priced(k: Kernel, callee: object, members: list[Kernel], arch: ModelArch, pieces: list[SeqPiece],
            value: torch.Tensor) -> Kernel:
    """Kind, FLOPs, bytes and dims of a node: custom ops from the shape, the rest from their operators."""
    elem = value.element_size()
    tokens = sum(len(p.tokens) for p in pieces)
    if isinstance(callee, PagedAttention):
        return _attention(k, callee, arch, pieces, elem)
    if isinstance(callee, Experts):
        return _moe(k, callee, tokens, elem)
    if isinstance(callee, MambaConv):
        channels, width = callee.weight.shape[0], callee.weight.shape[2]
        return _with(k, kind=KernelKind.CONV, flops=2 * tokens * channels * width,
                     dims={"numel": tokens * channels})
    if callee is torch.ops.tessera_engine.mamba_scan.default:
        m = arch.mamba
        assert m is not None
        return _with(k, kind=KernelKind.SCAN, flops=6 * tokens * m.heads * m.head_dim * m.state_size,
                     dims={"numel": tokens * m.heads * m.head_dim,
                           "state": m.heads * m.head_dim * m.state_size})
    kind = next((kd for cls, kd in MODULE_KINDS if isinstance(callee, cls)), None)
    return _with(k, kind=kind or _dominant_kind(members))


def _with(k: Kernel, **changes: object) -> Kernel:
    return replace(k, **changes)


def pairs(prefix: int, n: int, window: int) -> int:
    """(query, key) pairs of n queries after ``prefix`` cached tokens, causal, each query seeing at most
    ``window`` keys (0: no window): Σ_{i<n} min(prefix + i + 1, window)."""
    full = n * prefix + n * (n + 1) // 2
    if not window or prefix + n <= window:
        return full
    # queries at positions >= window - 1 see exactly `window` keys; the others see position + 1
    below = max(0, min(n, window - 1 - prefix))  # queries still under the window
    return below * prefix + below * (below + 1) // 2 + (n - below) * window


def _attention(k: Kernel, attn: PagedAttention, arch: ModelArch, pieces: list[SeqPiece], elem: int) -> Kernel:
    heads, kvh, hd = arch.num_heads, attn.kv_heads, attn.head_dim
    n_pairs = sum(pairs(p.start, len(p.tokens), attn.window) for p in pieces)
    tokens = sum(len(p.tokens) for p in pieces)
    cached = sum(min(p.start, attn.window or p.start) for p in pieces)  # earlier keys each sequence reads
    seqs = len(pieces)
    decode = all(len(p.tokens) == 1 for p in pieces)
    dims = {"batch": seqs, "heads": heads, "kv_heads": kvh, "q_len": math.ceil(tokens / seqs),
            "kv_len": math.ceil(sum(p.start + len(p.tokens) for p in pieces) / seqs), "head_dim": hd}
    return _with(k, kind=KernelKind.ATTENTION_DECODE if decode else KernelKind.ATTENTION,
                 flops=4 * heads * hd * n_pairs, indirect=True, dims=dims,
                 bytes_read=(tokens * heads * hd + 2 * tokens * kvh * hd + 2 * cached * kvh * hd) * elem,
                 bytes_written=(tokens * heads * hd + 2 * tokens * kvh * hd) * elem)


def _moe(k: Kernel, experts: Experts, tokens: int, elem: int) -> Kernel:
    gate = experts[0].weights()[0]
    inter, hidden = gate.shape
    count = len(experts)
    expert_bytes = 3 * inter * hidden * elem
    touched = distinct_experts(count, experts.top_k, tokens) * expert_bytes
    return _with(k, kind=KernelKind.GEMM, flops=2 * 3 * tokens * experts.top_k * hidden * inter,
                 indirect=True,
                 bytes_read=int(touched) + tokens * (hidden + count) * elem,  # + hidden states, router logits
                 bytes_written=tokens * hidden * elem,
                 dims={"tokens": tokens, "hidden": hidden, "inter": inter, "topk": experts.top_k,
                       "experts": count, "expert_bytes": expert_bytes})


def graph_nodes(graph: KernelGraph) -> list[str]:
    """The program node each kernel of an engine kernel graph is."""
    return list(graph.meta["nodes"])


def assignment_by_node(graph: KernelGraph, assignment: Iterable[int]) -> dict[str, int]:
    """A placement of the graph's kernels as node name -> device."""
    return dict(zip(graph_nodes(graph), assignment, strict=True))

